"""AgentStateMemoryService (SPEC §19): ADK's memory beside its sessions. By keywords, the
memories ADK's InMemoryMemoryService finds for the same adds, deletes and query; by
meaning with an index; only the asking user's; a session added twice is added once;
an ADK Runner's load_memory finds what an earlier session said; on a file and on
PostgreSQL."""

from __future__ import annotations

import asyncio
import multiprocessing
import zlib

import pytest
from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.memory import InMemoryMemoryService
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.session import Session
from google.adk.tools import load_memory
from google.genai import types
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate.integrations.adk import AgentStateSessionService
from agentstate.integrations.adk_memory import AgentStateMemoryService

from ..conftest import target


def event(text: str | None, author: str = "user", id: str | None = None, ts: float = 1.0e9) -> Event:
    content = None if text is None else types.Content(role="user", parts=[types.Part(text=text)])
    fields = {"id": id} if id else {}
    return Event(author=author, invocation_id="inv", content=content, timestamp=ts, **fields)


def session(sid: str, events: list[Event], app: str = "app", user: str = "ada") -> Session:
    return Session(id=sid, app_name=app, user_id=user, events=events)


def found(response) -> list[tuple[str, str, str, str]]:
    return [(m.id, m.author, m.timestamp, m.content.parts[0].text) for m in response.memories]


# Words (ASCII, accented, Japanese with a Latin word inside, mixed case) so that queries
# meet each of InMemoryMemoryService's matching rules.
WORDS = ["tea", "Tea", "coffee", "café", "Python", "私はPythonを使う", "猫", "cat", "the", "a"]
TEXT = st.lists(st.sampled_from(WORDS), max_size=4).map(" ".join)
STEPS = st.lists(st.one_of(
    st.tuples(st.just("session"), st.sampled_from(["s1", "s2", "s3"]),
              st.lists(st.tuples(st.sampled_from(["e1", "e2", "e3", "e4", "e5", "e6"]),
                                 st.one_of(st.none(), TEXT)), max_size=4,
                       unique_by=lambda t: t[0])),
    st.tuples(st.just("events"), st.sampled_from([None, "s1", "s4"]),
              st.lists(st.tuples(st.sampled_from(["e1", "e7", "e8"]), TEXT), max_size=3,
                       unique_by=lambda t: t[0])),
    st.tuples(st.just("delete"), st.sampled_from(["e1", "e2", "e7", "nope"]), st.just([])),
), max_size=8)


@settings(max_examples=40, deadline=None)
@given(STEPS, TEXT, st.sampled_from(["ada", "bob"]))
def test_keyword_search_finds_what_in_memory_memory_service_finds(tmp_path_factory, steps, query,
                                                                   user):
    """For any adds (whole sessions, again and changed; loose events), deletes and query,
    the memories found are InMemoryMemoryService's, in its order (the ten that share the
    most words with the query, ties in the order added), for the asking user only."""
    path = tmp_path_factory.mktemp("m") / "m.db"

    async def run():
        theirs = InMemoryMemoryService()
        with agentstate.open(str(path)) as db:
            ours = AgentStateMemoryService(db)
            for who in ("ada", "bob"):
                for kind, what, items in steps:
                    evs = [event(text, author=who, id=f"{who}-{eid}", ts=1.0e9 + int(eid[1:]))
                           for eid, text in items]
                    for service in (ours, theirs):
                        if kind == "session":
                            await service.add_session_to_memory(session(what, evs, user=who))
                        elif kind == "events":
                            await service.add_events_to_memory(app_name="app", user_id=who,
                                                               events=evs, session_id=what)
                        else:
                            await service.delete_memory(app_name="app", user_id=who,
                                                        memory_id=f"{who}-{what}")
            return [found(await s.search_memory(app_name="app", user_id=user, query=query))
                    for s in (ours, theirs)]

    ours, theirs = asyncio.run(run())
    assert ours == theirs
    assert all(m[0].startswith(user + "-") for m in ours)


def test_a_session_added_twice_is_added_once_and_grows(any_db):
    """The same session added again writes nothing; added with more events it adds only
    those (and forgets the events it no longer has)."""
    memory = AgentStateMemoryService(any_db)
    user = any_db.scope("user", "adk:app:ada")
    first = [event("hello tea", id="a"), event("more tea", id="b")]
    asyncio.run(memory.add_session_to_memory(session("s", first)))
    before = {k: v.version for k, v in user.items("mem.")}
    asyncio.run(memory.add_session_to_memory(session("s", first)))
    assert {k: v.version for k, v in user.items("mem.")} == before
    asyncio.run(memory.add_session_to_memory(session("s", first[1:] + [event("tea time", id="c")])))
    got = asyncio.run(memory.search_memory(app_name="app", user_id="ada", query="tea"))
    assert [m.id for m in got.memories] == ["b", "c"]
    assert user.get_versioned("mem.e.s:b").version == before["mem.e.s:b"]  # not rewritten


def test_memories_are_the_asking_user_s_only(any_db):
    """Another user, or the same user id in another app, never finds them."""
    memory = AgentStateMemoryService(any_db)
    asyncio.run(memory.add_session_to_memory(session("s", [event("secret tea", id="x")])))
    for app, user in (("app", "bob"), ("other", "ada")):
        got = asyncio.run(memory.search_memory(app_name=app, user_id=user, query="secret tea"))
        assert got.memories == []
    got = asyncio.run(memory.search_memory(app_name="app", user_id="ada", query="secret"))
    assert [m.id for m in got.memories] == ["x"]


# -- by meaning --------------------------------------------------------------------------

CONCEPTS = {"car": 0, "automobile": 0, "vehicle": 0, "drive": 0, "cat": 1, "kitten": 1,
            "pet": 1, "tea": 2, "drink": 2, "beverage": 2}
DIMS = 8


def meaning(texts: list[str]) -> list[list[float]]:
    """A toy model: each word counts for its concept, any other word for a dimension of
    its own (by its hash), so synonyms land together and nothing else does."""
    out = []
    for text in texts:
        v = [0.0] * DIMS
        for word in text.lower().split():
            word = word.strip("?.!,")
            v[CONCEPTS[word] if word in CONCEPTS else 3 + zlib.crc32(word.encode()) % (DIMS - 3)] += 1
        out.append(v)
    return out


def test_an_index_finds_memories_by_meaning(any_db):
    """With an index, a query finds the memory that means the same thing though it shares
    no word with it, nearest first; memories survive a restart; embeddings are asked only
    for events not embedded yet."""
    asked = []

    async def embed(texts):
        asked.append(list(texts))
        return meaning(texts)

    memory = AgentStateMemoryService(any_db, index={"dims": DIMS, "embed": embed})
    asyncio.run(memory.add_session_to_memory(session("s", [
        event("I drive a car", id="car"), event("my kitten sleeps", id="cat"),
        event(None, id="empty")])))
    asyncio.run(memory.add_session_to_memory(session("s", [
        event("I drive a car", id="car"), event("my kitten sleeps", id="cat"),
        event("green tea please", id="tea")])))
    assert asked == [["I drive a car", "my kitten sleeps"], ["green tea please"]]
    got = asyncio.run(memory.search_memory(app_name="app", user_id="ada", query="automobile?"))
    assert [m.id for m in got.memories][:1] == ["car"]
    words = AgentStateMemoryService(any_db)  # by keywords: no word in common
    assert asyncio.run(words.search_memory(app_name="app", user_id="ada", query="automobile")).memories == []
    where = target(any_db)
    any_db.close()
    with agentstate.open(where) as again:
        memory = AgentStateMemoryService(again, index={"dims": DIMS, "embed": meaning})
        got = asyncio.run(memory.search_memory(app_name="app", user_id="ada", query="beverage"))
        assert [m.id for m in got.memories][:1] == ["tea"]
        assert got.memories[0].content.parts[0].text == "green tea please"


def test_no_embedding_runs_while_the_write_lock_is_held(db_path):
    """The model is called before the write: meanwhile another connection writes at once."""
    def embed(texts):
        with agentstate.open(db_path, busy_timeout=0) as other:
            other.scope("app", "other").put("k", 1)  # Busy if the lock were held
        return meaning(texts)

    with agentstate.open(db_path) as db:
        memory = AgentStateMemoryService(db, index={"dims": DIMS, "embed": embed})
        asyncio.run(memory.add_session_to_memory(session("s", [event("tea", id="t")])))
        got = asyncio.run(memory.search_memory(app_name="app", user_id="ada", query="drink"))
    assert [m.id for m in got.memories] == ["t"]


def test_an_event_that_changed_is_written_and_embedded_again(any_db):
    """A session added again with an event of the same id but another content replaces
    that memory and its vector (as InMemoryMemoryService keeps the session's last copy);
    add_events_to_memory keeps what it has."""
    asked = []

    def embed(texts):
        asked.append(list(texts))
        return meaning(texts)

    memory = AgentStateMemoryService(any_db, index={"dims": DIMS, "embed": embed})
    asyncio.run(memory.add_session_to_memory(session("s", [event("my cat", id="x")])))
    asyncio.run(memory.add_session_to_memory(session("s", [event("green tea", id="x")])))
    asyncio.run(memory.add_events_to_memory(app_name="app", user_id="ada", session_id="s",
                                            events=[event("a car", id="x")]))
    got = asyncio.run(memory.search_memory(app_name="app", user_id="ada", query="drink"))
    assert [(m.id, m.content.parts[0].text) for m in got.memories] == [("x", "green tea")]
    assert asked[:2] == [["my cat"], ["green tea"]]
    asyncio.run(memory.add_session_to_memory(session("s", [event(None, id="y")])))
    assert any_db.scope("user", "adk:app:ada").list("mem.v.") == []


def test_a_deleted_memory_is_not_added_again(any_db):
    memory = AgentStateMemoryService(any_db, index={"dims": DIMS, "embed": meaning})
    s = session("s", [event("cat", id="a"), event("kitten", id="b")])
    asyncio.run(memory.add_session_to_memory(s))
    asyncio.run(memory.delete_memory(app_name="app", user_id="ada", memory_id="a"))
    asyncio.run(memory.add_session_to_memory(s))
    got = asyncio.run(memory.search_memory(app_name="app", user_id="ada", query="pet"))
    assert [m.id for m in got.memories] == ["b"]
    assert any_db.scope("user", "adk:app:ada").list("mem.v.") == ["mem.v.s:b.0"]


def _adder(where: str, who: int, barrier) -> None:
    async def run():
        with agentstate.open(where) as db:
            memory = AgentStateMemoryService(db, index={"dims": DIMS, "embed": meaning})
            barrier.wait()
            for i in range(10):
                shared = [event(f"tea {j}", id=f"shared-{j}") for j in range(i + 1)]
                await memory.add_session_to_memory(session("shared", shared))
                await memory.add_session_to_memory(session(f"own-{who}",
                    [event(f"cat {who} {j}", id=f"own-{who}-{j}") for j in range(i + 1)]))

    asyncio.run(run())


def test_two_processes_adding_at_once_keep_each_memory_once(any_db):
    """Two processes add a shared session (growing) and each its own at once: every
    memory is there once, with its vector."""
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_adder, args=(target(any_db), w, barrier)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    user = any_db.scope("user", "adk:app:ada")
    entries = sorted(k.split(":")[1] for k in user.list("mem.e."))
    assert entries == sorted([f"shared-{j}" for j in range(10)]
                             + [f"own-{w}-{j}" for w in (0, 1) for j in range(10)])
    assert len(user.list("mem.v.")) == len(entries)
    assert user.get("mem.s.shared")["events"] == [f"shared-{j}" for j in range(10)]


# -- an ADK Runner ------------------------------------------------------------------------

class _Recall(BaseLlm):
    """A model that says "noted", or, asked a question, calls load_memory with it and then
    answers with the texts of the memories it got."""

    async def generate_content_async(self, llm_request, stream=False):
        last = llm_request.contents[-1]
        responses = [p.function_response for p in last.parts if p.function_response]
        if responses:
            memories = responses[0].response["result"].memories
            text = "; ".join(m.content.parts[0].text for m in memories)
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(
                text=f"I recall: {text}")]))
        elif last.parts[0].text.endswith("?"):
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(
                function_call=types.FunctionCall(name="load_memory",
                                                 args={"query": last.parts[0].text}))]))
        else:
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text="noted")]))


@pytest.mark.parametrize("indexed", [False, True])
def test_a_runner_s_load_memory_finds_what_an_earlier_session_said(db_path, indexed):
    """ADK's own Runner with the session service and this memory service on one file: a
    second session's load_memory finds what the first one said (by keywords, or by
    meaning with an index), and nothing of another user's."""
    async def run():
        with agentstate.open(db_path) as db:
            sessions = AgentStateSessionService(db)
            memory = AgentStateMemoryService(
                db, index={"dims": DIMS, "embed": meaning} if indexed else None)
            agent = LlmAgent(name="bot", model=_Recall(model="recall"), instruction="remember",
                             tools=[load_memory])
            runner = Runner(agent=agent, app_name="app", session_service=sessions,
                            memory_service=memory)

            async def say(user, sid, text):
                message = types.Content(role="user", parts=[types.Part(text=text)])
                return [e async for e in runner.run_async(user_id=user, session_id=sid,
                                                          new_message=message)]

            for user, said in (("ada", "my kitten is called Tom"), ("bob", "my cat is Rex")):
                first = await sessions.create_session(app_name="app", user_id=user)
                await say(user, first.id, said)
                await memory.add_session_to_memory(await sessions.get_session(
                    app_name="app", user_id=user, session_id=first.id))
            second = await sessions.create_session(app_name="app", user_id="ada")
            question = "what is my pet called?" if indexed else "what is my kitten called?"
            return (await say("ada", second.id, question))[-1].content.parts[0].text

    answer = asyncio.run(run())
    assert answer.startswith("I recall: my kitten is called Tom")
    assert "Rex" not in answer
