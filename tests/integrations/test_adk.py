"""AgentStateSessionService beyond the shared contract: processes, the event loop,
cancellation, all-or-nothing appends, flat cost, and how ids are kept."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import threading

import pytest
from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types

import agentstate
from agentstate.integrations.adk import AgentStateSessionService

APP, USER = "shop", "ada"


def event(delta=None, **fields):
    fields.setdefault("author", "user")
    fields.setdefault("invocation_id", "inv")
    return Event(actions=EventActions(state_delta=delta or {}), **fields)


async def reload(service, session, **config):
    return await service.get_session(app_name=session.app_name, user_id=session.user_id,
                                     session_id=session.id,
                                     config=GetSessionConfig(**config) if config else None)


@pytest.fixture
def service(db):
    return AgentStateSessionService(db)


# -- processes -------------------------------------------------------------------------

def _appender(path: str, who: int, n: int, start, results) -> None:
    """Append n events to the shared session (reloading when refused as stale) and n to
    a session of its own, each with session, user: and app: deltas."""

    async def work() -> int:
        service = AgentStateSessionService(path)
        ids = dict(app_name=APP, user_id=USER)
        shared = await service.get_session(**ids, session_id="shared")
        mine = await service.create_session(**ids, session_id=f"own-{who}")
        refused = 0
        for i in range(n):
            while True:
                try:
                    await service.append_event(shared, event(
                        {f"w{who}.{i}": i, f"user:s.w{who}.{i}": i, f"app:s.w{who}.{i}": i,
                         "last": who}, invocation_id=f"w{who}.{i}"))
                    break
                except StaleSessionError:
                    refused += 1
                    shared = await service.get_session(**ids, session_id="shared")
            await service.append_event(mine, event(
                {f"user:o.w{who}.{i}": i, f"app:o.w{who}.{i}": i}))
        await service.close()
        return refused

    start.wait()
    try:
        results.put(asyncio.run(work()))
    except BaseException as e:  # the parent fails at once, not at its timeout
        results.put(repr(e))
        raise


def test_processes_appending_lose_no_event_and_no_delta(db_path):
    """Two processes append to one session (and each to its own, with user: and app:
    deltas) at once: every event is stored once, in each writer's order, and every
    delta of every scope is kept; a writer with an outdated session is refused and
    reloads, never overwrites."""
    n = 40
    with agentstate.open(db_path) as db:
        asyncio.run(AgentStateSessionService(db).create_session(
            app_name=APP, user_id=USER, session_id="shared"))
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_appender, args=(db_path, w, n, start, results)) for w in (0, 1)]
    for p in procs:
        p.start()
    start.set()
    refused = [results.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(60)
    assert [type(r) for r in refused] == [int, int], refused  # how many reloads: no matter
    assert [p.exitcode for p in procs] == [0, 0]

    async def check():
        with agentstate.open(db_path) as db:
            service = AgentStateSessionService(db)
            shared = await service.get_session(app_name=APP, user_id=USER, session_id="shared")
            user = await service.get_user_state(app_name=APP, user_id=USER)
            return shared, user

    shared, user = asyncio.run(check())
    assert len(shared.events) == 2 * n
    for w in (0, 1):
        assert [e.invocation_id for e in shared.events if e.author == "user"
                and e.invocation_id.startswith(f"w{w}.")] == [f"w{w}.{i}" for i in range(n)]
    want = {f"{where}.w{w}.{i}": i for where in ("s", "o") for w in (0, 1) for i in range(n)}
    assert user == want
    app_state = {k[4:]: v for k, v in shared.state.items() if k.startswith("app:")}
    assert app_state == want
    own = {k: v for k, v in shared.state.items() if ":" not in k and k != "last"}
    assert own == {f"w{w}.{i}": i for w in (0, 1) for i in range(n)}


# -- the event loop ----------------------------------------------------------------------

class _WriteLockHeld:
    """Another thread holds the file's write lock until release()."""

    def __init__(self, db: agentstate.Database) -> None:
        self._taken, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(db,))
        self._thread.start()
        assert self._taken.wait(10)

    def _hold(self, db: agentstate.Database) -> None:
        with db.transaction():
            db.scope("app", "lock-holder").put("k", 1)
            self._taken.set()
            self._release.wait(30)

    def release(self) -> None:
        self._release.set()
        self._thread.join(30)


@pytest.mark.asyncio
async def test_waiting_for_the_write_lock_does_not_block_the_loop(db_path):
    """While append_event waits for a write lock another writer holds, the event loop
    keeps running other tasks."""
    db = agentstate.open(db_path, busy_timeout=30)
    service = AgentStateSessionService(db)
    s = await service.create_session(app_name=APP, user_id=USER)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    held = _WriteLockHeld(db)
    beat = asyncio.create_task(ticker())
    append = asyncio.create_task(service.append_event(s, event({"k": 1})))
    await asyncio.sleep(0.5)
    try:
        assert not append.done()
        assert ticks >= 3  # a blocked loop would not have ticked at all
    finally:
        held.release()
    await append
    beat.cancel()
    assert (await reload(service, s)).state == {"k": 1}
    db.close()


def test_one_service_serves_several_event_loops(db_path):
    """The service holds nothing bound to an event loop: one instance works from
    successive asyncio.run() calls and from threads with loops of their own."""
    with agentstate.open(db_path) as db:
        service = AgentStateSessionService(db)
        s = asyncio.run(service.create_session(app_name=APP, user_id=USER, session_id="s"))
        asyncio.run(service.append_event(s, event({"n": 0})))

        def in_thread(i: int) -> None:
            async def go():
                own = await service.create_session(app_name=APP, user_id=f"t{i}")
                await service.append_event(own, event({"user:i": i}))
            asyncio.run(go())

        threads = [threading.Thread(target=in_thread, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        got = asyncio.run(service.get_session(app_name=APP, user_id=USER, session_id="s"))
        assert got.state == {"n": 0} and len(got.events) == 1
        for i in range(4):
            assert asyncio.run(service.get_user_state(app_name=APP, user_id=f"t{i}")) == {"i": i}


# -- cancellation and failures ------------------------------------------------------------

@pytest.mark.asyncio
async def test_cancelled_append_is_whole_and_its_retry_is_stored_once(db_path):
    """An append cancelled while it waits for the lock ends up stored whole (event and
    delta together) or not at all; appending the same event again stores it once and
    brings the caller's session up to date."""
    db = agentstate.open(db_path, busy_timeout=30)
    service = AgentStateSessionService(db)
    s = await service.create_session(app_name=APP, user_id=USER)
    e = event({"k": 1, "user:u": 2})
    held = _WriteLockHeld(db)
    append = asyncio.create_task(service.append_event(s, e))
    await asyncio.sleep(0.2)
    append.cancel()
    with pytest.raises(asyncio.CancelledError):
        await append
    held.release()
    for _ in range(500):  # the worker thread finishes its transaction on its own
        stored = await reload(service, s)
        if stored.events:
            break
        await asyncio.sleep(0.01)
    assert [x.id for x in stored.events] == [e.id]
    assert stored.state == {"k": 1, "user:u": 2}
    assert s.events == []  # the cancelled call never got back to the caller
    await service.append_event(s, e)  # the retry
    stored = await reload(service, s)
    assert [x.id for x in stored.events] == [e.id] and stored == s
    await service.append_event(s, event({"k": 3}))  # and the session goes on
    assert len((await reload(service, s)).events) == 2
    db.close()


@pytest.mark.asyncio
async def test_interrupted_append_writes_nothing(service, db, monkeypatch):
    """If anything interrupts an append before it commits (here, the event's write),
    neither the event nor any part of its delta is stored, and the session object
    is left as it was."""
    s = await service.create_session(app_name=APP, user_id=USER, state={"k": 0})

    class Interrupt(BaseException):
        pass

    def boom(*args, **kwargs):
        raise Interrupt

    monkeypatch.setattr(db.runs, "write", boom)
    with pytest.raises(Interrupt):
        await service.append_event(s, event({"k": 1, "user:u": 1, "app:a": 1}))
    monkeypatch.undo()
    assert s.state == {"k": 0} and s.events == []
    stored = await reload(service, s)
    assert stored == s
    await service.append_event(s, event({"k": 2}))
    assert (await reload(service, s)).state == {"k": 2}


@pytest.mark.asyncio
async def test_same_event_twice_is_stored_once(service):
    """The same event appended twice to an up-to-date session is stored once; a
    different event with the same id is stored as well."""
    s = await service.create_session(app_name=APP, user_id=USER)
    e = event({"n": 1})
    await service.append_event(s, e)
    await service.append_event(s, e)
    await service.append_event(s, e.model_copy(deep=True))
    assert len(s.events) == 1 and len((await reload(service, s)).events) == 1
    await service.append_event(s, Event(id=e.id, author="agent", invocation_id="other"))
    assert [x.author for x in (await reload(service, s)).events] == ["user", "agent"]


@pytest.mark.asyncio
async def test_a_refused_value_writes_nothing(service):
    """A delta the store refuses (a string with NUL) raises InvalidValue before
    anything is stored; the session stays usable."""
    s = await service.create_session(app_name=APP, user_id=USER)
    with pytest.raises(agentstate.InvalidValue):
        await service.append_event(s, event({"k": "a\x00b", "user:u": 1}))
    assert (await reload(service, s)).events == []
    assert await service.get_user_state(app_name=APP, user_id=USER) == {}
    await service.append_event(s, event({"k": "fine"}))
    assert (await reload(service, s)).state == {"k": "fine"}


# -- cost does not grow with the history -------------------------------------------------

@pytest.mark.asyncio
async def test_appending_never_reads_the_history(service, db, monkeypatch):
    """append_event reads no stored event (its cost cannot grow with the history), and
    get_session with num_recent_events reads only that many."""
    s = await service.create_session(app_name=APP, user_id=USER)
    for i in range(50):
        await service.append_event(s, event({"i": i}))
    asked = []
    real = db.runs.entries

    def counting(run_id, since=0, limit=None, **kwargs):
        asked.append(limit)
        return real(run_id, since, limit, **kwargs)

    def refuse(*args, **kwargs):
        raise AssertionError("the history was read")

    monkeypatch.setattr(db.runs, "entries", counting)
    for name in ("read", "tail", "load"):
        monkeypatch.setattr(db.runs, name, refuse)
    for i in range(5):
        await service.append_event(s, event({"j": i}))
    assert asked == []
    got = await reload(service, s, num_recent_events=3)
    assert len(got.events) == 3 and asked == [3]
    asked.clear()
    got = await reload(service, s, after_timestamp=got.events[0].timestamp)
    assert len(got.events) == 3 and sum(asked) < 55  # read back from the end only


@pytest.mark.asyncio
async def test_runs_prune_leaves_the_sessions_events(service, db):
    """A session's run is pinned: runs.prune(finished_only=False) removes other runs but
    not its events; a session made before runs were pinned is pinned by its next append."""
    s = await service.create_session(app_name=APP, user_id=USER, session_id="kept")
    await service.append_event(s, event({"a": 1}))
    old = await service.create_session(app_name=APP, user_id=USER, session_id="old")
    head_scope = db.scope("session", f"adk:{APP}:{USER}:old")
    head = head_scope.get("head")
    db.runs.pin(head["run"], False)  # as a session made by an older agentstate
    head_scope.put("head", {k: v for k, v in head.items() if k != "pinned"})
    old = await service.get_session(app_name=APP, user_id=USER, session_id="old")
    await service.append_event(old, event({"b": 2}))
    db.runs.write("other", [{"seq": 0}], {"finished": True}, create=True)
    assert db.runs.prune(older_than=0, finished_only=False) == ["other"]
    for sid, n in (("kept", 1), ("old", 1)):
        got = await service.get_session(app_name=APP, user_id=USER, session_id=sid)
        assert len(got.events) == n


# -- ids and the layout --------------------------------------------------------------------

@pytest.mark.asyncio
async def test_any_ids_are_kept_apart_and_read_back(service):
    """Ids with any characters, and ids too long for a scope id, are kept distinct
    and read back exactly."""
    odd = ["a:b", "a_3ab", "a b", "ü/é", "x" * 300, "x" * 300 + "y", ":", "_", ""]
    for app in ("app", "x" * 250):
        for user in odd:
            s = await service.create_session(app_name=app, user_id=user, session_id="s",
                                             state={"user:who": user, "mine": user})
            await service.append_event(s, event({"n": 1}))
    for app in ("app", "x" * 250):
        listed = (await service.list_sessions(app_name=app)).sessions
        assert sorted(s.user_id for s in listed) == sorted(odd)
        for user in odd:
            got = await service.get_session(app_name=app, user_id=user, session_id="s")
            assert (got.app_name, got.user_id, got.id) == (app, user, "s")
            assert got.state == {"user:who": user, "mine": user, "n": 1}
    sid = "é" * 150
    s = await service.create_session(app_name="app", user_id="u", session_id=sid)
    assert (await service.get_session(app_name="app", user_id="u", session_id=sid)).id == sid


@pytest.mark.asyncio
async def test_layout_is_plain_agentstate(service, db):
    """What the module docstring says: the head in the session scope, events as run
    entries, app and user state under ``state`` in their scopes."""
    s = await service.create_session(app_name="my_app", user_id="u1", session_id="s1",
                                     state={"a": 1, "app:b": 2, "user:c": 3})
    await service.append_event(s, event({"d": 4}))
    head = db.scope("session", "adk:my_5fapp:u1:s1").get("head")
    assert head["state"] == {"a": 1, "d": 4} and head["events"] == 1
    assert db.scope("app", "adk:my_5fapp").get("state") == {"b": 2}
    assert db.scope("user", "adk:my_5fapp:u1").get("state") == {"c": 3}
    (entry,) = db.runs.entries(head["run"])
    assert Event.model_validate_json(entry["event"]) == s.events[0]


# -- a real Runner -------------------------------------------------------------------------

class _Echo(BaseLlm):
    """A model that answers with the last message and how many it was shown."""

    async def generate_content_async(self, llm_request, stream=False):
        said = llm_request.contents[-1].parts[0].text
        yield LlmResponse(content=types.Content(role="model", parts=[
            types.Part(text=f"{said} ({len(llm_request.contents)} messages)")]))


@pytest.mark.asyncio
async def test_a_runner_keeps_its_conversation_here(db_path):
    """The one-line switch: an ADK Runner given this service keeps the conversation and
    the agent's output_key state, and a second service on the same file (another
    process, say) goes on with the same history."""
    agent = LlmAgent(name="bot", model=_Echo(model="echo"), instruction="echo",
                     output_key="answer")
    first = AgentStateSessionService(db_path)
    s = await first.create_session(app_name="app", user_id="u", state={"user:name": "Ada"})

    async def turn(service, text):
        runner = Runner(agent=agent, app_name="app", session_service=service)
        message = types.Content(role="user", parts=[types.Part(text=text)])
        return [e async for e in runner.run_async(user_id="u", session_id=s.id,
                                                  new_message=message)]

    await turn(first, "hi")
    await turn(first, "again")
    second = AgentStateSessionService(db_path)
    (reply,) = await turn(second, "third")
    assert reply.content.parts[0].text == "third (5 messages)"
    got = await first.get_session(app_name="app", user_id="u", session_id=s.id)
    assert [e.author for e in got.events] == ["user", "bot"] * 3
    assert got.state == {"answer": "third (5 messages)", "user:name": "Ada"}
    await first.close()
    await second.close()
