"""What every ADK session service owes its callers, checked on ours and on ADK's own.

Google ADK keeps its session-service contract tests in its git repository
(``tests/unittests/sessions/_conformance.py`` and ``test_session_service.py``),
not in the wheel or the source distribution on PyPI, so they cannot be fetched
by version here. These tests state the same behaviours in our own words, and
run each one against ``AgentStateSessionService`` and, as references, against
ADK 2.13's own ``InMemorySessionService`` and ``SqliteSessionService``
(``DatabaseSessionService`` needs SQLAlchemy, which only ``google-adk[db]``
installs): a test that ADK's services pass and ours
fails is a defect of ours; one that ADK's services fail is a behaviour they
differ on, recorded in ``DIVERGES`` with its reason and run as a strict xfail,
so the record goes stale loudly when ADK changes.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import pytest_asyncio
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

import agentstate
from agentstate.integrations.adk import AgentStateSessionService

APP, USER = "shop", "ada"

# Reference backend -> {test name: why ADK's own service fails it}.
DIVERGES = {
    "memory": {
        "test_stale_copy_is_refused": "InMemorySessionService never refuses a stale session",
        "test_racing_stale_copies_one_wins": "InMemorySessionService never refuses a stale session",
        "test_out_of_order_timestamps_read_back_in_time_order":
            "InMemorySessionService returns events in append order",
        "test_unserializable_state_is_stored_as_text":
            "InMemorySessionService keeps Python objects as they are",
    },
    "sqlite": {
        "test_racing_stale_copies_one_wins":
            "SqliteSessionService reads the stored time and writes without holding a lock "
            "in between, so both racing copies pass the check and are stored",
        "test_markerless_current_session_is_accepted":
            "SqliteSessionService refuses any session whose time is behind storage",
    },
}


@pytest_asyncio.fixture(params=["agentstate", "memory", "sqlite"])
async def service(request, tmp_path):
    kind = request.param
    why = DIVERGES.get(kind, {}).get(request.node.originalname)
    if why:
        request.node.add_marker(pytest.mark.xfail(strict=True, reason=why))
    if kind == "agentstate":
        db = agentstate.open(tmp_path / "agent.db")
        yield AgentStateSessionService(db)
        db.close()
    elif kind == "memory":
        yield InMemorySessionService()
    else:
        yield SqliteSessionService(str(tmp_path / "adk.db"))


def event(delta=None, **fields):
    fields.setdefault("author", "user")
    fields.setdefault("invocation_id", "inv")
    return Event(actions=EventActions(state_delta=delta or {}), **fields)


async def reload(service, session):
    return await service.get_session(app_name=session.app_name, user_id=session.user_id,
                                     session_id=session.id)


# -- create, get, list, delete -------------------------------------------------------

@pytest.mark.asyncio
async def test_absent_session_is_none(service):
    """get_session of an id nobody created answers None."""
    assert await service.get_session(app_name=APP, user_id=USER, session_id="nope") is None


@pytest.mark.asyncio
async def test_created_session_reads_back_equal_and_deletes(service):
    """A new session reads back equal to what create returned; after delete it is gone."""
    before = time.time()
    s = await service.create_session(app_name=APP, user_id=USER, state={"cart": ["book"]})
    assert (s.app_name, s.user_id, s.state, s.events) == (APP, USER, {"cart": ["book"]}, [])
    assert s.id and before - 1 <= s.last_update_time <= time.time()
    assert await reload(service, s) == s
    await service.delete_session(app_name=APP, user_id=USER, session_id=s.id)
    assert await reload(service, s) is None


@pytest.mark.asyncio
async def test_deleting_an_absent_session_does_nothing(service):
    """delete_session of an unknown id, user or app leaves the others alone."""
    s = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
    for app, user, sid in [(APP, USER, "s2"), (APP, "bob", "s1"), ("other", USER, "s1")]:
        await service.delete_session(app_name=app, user_id=user, session_id=sid)
    assert await reload(service, s) is not None


@pytest.mark.asyncio
async def test_sessions_of_two_users_with_one_id_are_two(service):
    """A session id is per user: the same id under another user is another session."""
    mine = await service.create_session(app_name=APP, user_id=USER, session_id="s1")
    await service.append_event(mine, event())
    await service.create_session(app_name=APP, user_id="bob", session_id="s1")
    theirs = await service.get_session(app_name=APP, user_id="bob", session_id="s1")
    assert theirs.user_id == "bob" and theirs.events == []
    await service.delete_session(app_name=APP, user_id="bob", session_id="s1")
    assert len((await reload(service, mine)).events) == 1


@pytest.mark.asyncio
async def test_taken_id_is_refused(service):
    """Creating a session under an id the user already has raises AlreadyExistsError
    and leaves the first session as it was."""
    await service.create_session(app_name=APP, user_id=USER, session_id="s1", state={"v": 1})
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=APP, user_id=USER, session_id="s1",
                                     state={"v": 2})
    got = await service.get_session(app_name=APP, user_id=USER, session_id="s1")
    assert got.state == {"v": 1}


@pytest.mark.asyncio
async def test_padded_id_is_stripped_everywhere(service):
    """An id with surrounding blanks names the stripped id on create, get and delete."""
    s = await service.create_session(app_name=APP, user_id=USER, session_id=" order-7\n",
                                     state={"n": 1})
    assert s.id == "order-7"
    got = await service.get_session(app_name=APP, user_id=USER, session_id="order-7 ")
    assert got.id == "order-7" and got.state == {"n": 1}
    await service.delete_session(app_name=APP, user_id=USER, session_id="\torder-7")
    assert await service.get_session(app_name=APP, user_id=USER, session_id="order-7") is None


@pytest.mark.asyncio
async def test_blank_id_gets_a_generated_one(service):
    """A blank session id is no id: the service makes one up."""
    s = await service.create_session(app_name=APP, user_id=USER, session_id="   ")
    assert s.id.strip() == s.id and s.id


@pytest.mark.asyncio
async def test_list_gives_each_session_with_its_state_and_no_events(service):
    """list_sessions for a user gives all of the user's sessions, each with its merged
    state and without events."""
    for i in range(4):
        s = await service.create_session(app_name=APP, user_id=USER, session_id=f"s{i}",
                                         state={"i": i, "user:u": "x", "app:a": "y"})
        await service.append_event(s, event())
    await service.create_session(app_name=APP, user_id="bob", session_id="b")
    await service.create_session(app_name="other", user_id=USER, session_id="o")
    listed = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
    assert sorted(s.id for s in listed) == ["s0", "s1", "s2", "s3"]
    for s in listed:
        assert s.events == [] and s.state == {"i": int(s.id[1]), "user:u": "x", "app:a": "y"}


@pytest.mark.asyncio
async def test_list_without_user_spans_users(service):
    """list_sessions without a user gives every user's sessions of the app, each with
    its own user's state."""
    await service.create_session(app_name=APP, user_id="u1", session_id="a", state={"user:k": 1})
    await service.create_session(app_name=APP, user_id="u1", session_id="b")
    await service.create_session(app_name=APP, user_id="u2", session_id="c", state={"user:k": 2})
    await service.create_session(app_name="other", user_id="u3", session_id="d")
    listed = {(s.user_id, s.id): s.state for s in
              (await service.list_sessions(app_name=APP)).sessions}
    assert listed == {("u1", "a"): {"user:k": 1}, ("u1", "b"): {"user:k": 1},
                      ("u2", "c"): {"user:k": 2}}
    assert (await service.list_sessions(app_name=APP, user_id="nobody")).sessions == []
    assert (await service.list_sessions(app_name="nothing")).sessions == []


@pytest.mark.asyncio
async def test_list_puts_the_most_recently_updated_last(service):
    """Sessions are listed least recently updated first: an event moves its session last."""
    for sid in ("a", "b", "c"):
        await service.create_session(app_name=APP, user_id=USER, session_id=sid)
    a = await service.get_session(app_name=APP, user_id=USER, session_id="a")
    await asyncio.sleep(0.02)
    await service.append_event(a, event())
    listed = (await service.list_sessions(app_name=APP, user_id=USER)).sessions
    assert [s.id for s in listed] == ["b", "c", "a"]


# -- state and its scopes ------------------------------------------------------------

@pytest.mark.asyncio
async def test_app_state_reaches_every_user_of_the_app_only(service):
    """app: keys, from create or from an event, are seen by every session of the app,
    and by no session of another app."""
    s = await service.create_session(app_name=APP, user_id="u1", state={"app:a": 1})
    await service.append_event(s, event({"app:b": 2}))
    other_user = await service.create_session(app_name=APP, user_id="u2")
    assert other_user.state == {"app:a": 1, "app:b": 2}
    assert (await reload(service, s)).state == {"app:a": 1, "app:b": 2}
    other_app = await service.create_session(app_name="other", user_id="u1")
    assert other_app.state == {}


@pytest.mark.asyncio
async def test_user_state_reaches_the_users_sessions_only(service):
    """user: keys are seen by every session of that user in that app, no one else's."""
    s = await service.create_session(app_name=APP, user_id="u1", state={"user:a": 1})
    await service.append_event(s, event({"user:b": 2}))
    again = await service.create_session(app_name=APP, user_id="u1")
    assert again.state == {"user:a": 1, "user:b": 2}
    assert (await service.create_session(app_name=APP, user_id="u2")).state == {}
    assert (await service.create_session(app_name="other", user_id="u1")).state == {}


@pytest.mark.asyncio
async def test_session_state_stays_in_its_session(service):
    """Unprefixed keys belong to one session: a sibling session does not see them."""
    s = await service.create_session(app_name=APP, user_id=USER, state={"a": 1})
    await service.append_event(s, event({"b": 2}))
    assert (await reload(service, s)).state == {"a": 1, "b": 2}
    assert (await service.create_session(app_name=APP, user_id=USER)).state == {}


@pytest.mark.asyncio
@pytest.mark.parametrize("key", ["profile", "app:profile", "user:profile"])
async def test_a_dict_in_a_delta_replaces_the_value(service, key):
    """A dict in a delta replaces the stored dict whole; it is not merged into it."""
    s = await service.create_session(app_name=APP, user_id=USER,
                                     state={key: {"name": "ada", "role": "admin"}})
    await service.append_event(s, event({key: {"name": "bob"}}))
    assert s.state[key] == {"name": "bob"}
    assert (await reload(service, s)).state[key] == {"name": "bob"}
    fresh = await service.create_session(app_name=APP, user_id=USER)
    assert fresh.state.get(key) == ({"name": "bob"} if ":" in key else None)


@pytest.mark.asyncio
@pytest.mark.parametrize("key", ["flag", "app:flag", "user:flag"])
async def test_none_in_a_delta_is_stored(service, key):
    """None in a delta is a stored null: the key stays, it is not deleted."""
    s = await service.create_session(app_name=APP, user_id=USER, state={key: True})
    await service.append_event(s, event({key: None}))
    for got in (s, await reload(service, s)):
        assert key in got.state and got.state[key] is None


@pytest.mark.asyncio
async def test_values_keep_their_types(service):
    """Booleans, floats and nested values read back as they were written, whatever
    other keys a later delta touches."""
    values = {"f": False, "t": True, "x": 0.1 + 0.2, "big": 2**53 + 1, "nest": {"l": [1, None]}}
    s = await service.create_session(app_name=APP, user_id=USER, state=values)
    await service.append_event(s, event({"other": 1}))
    got = (await reload(service, s)).state
    assert got == {**values, "other": 1}
    assert got["f"] is False and got["t"] is True and got["x"] == 0.1 + 0.2


@pytest.mark.asyncio
async def test_temp_state_lives_in_memory_only(service):
    """temp: keys reach the caller's session object (for the rest of the invocation),
    are taken out of the event's delta, and are never stored."""
    s = await service.create_session(app_name=APP, user_id=USER, state={"temp:t0": 0})
    assert "temp:t0" not in s.state
    e = event({"temp:t": "scratch", "kept": 1})
    await service.append_event(s, e)
    assert s.state["temp:t"] == "scratch" and s.state["kept"] == 1
    assert e.actions.state_delta == {"kept": 1}
    got = await reload(service, s)
    assert got.state == {"kept": 1}
    assert got.events[0].actions.state_delta == {"kept": 1}


@pytest.mark.asyncio
async def test_unserializable_state_is_stored_as_text(service):
    """A delta value with no JSON form is stored as its text: the event and the
    other keys are kept."""
    s = await service.create_session(app_name=APP, user_id=USER)
    await service.append_event(s, event({"callback": lambda: 1, "ok": 2}))
    got = await reload(service, s)
    assert len(got.events) == 1 and got.state["ok"] == 2
    assert isinstance(got.state["callback"], str)


@pytest.mark.asyncio
async def test_user_state_reads_alone(service):
    """get_user_state gives the user's keys without the prefix, per user and per app;
    {} when there are none."""
    assert await service.get_user_state(app_name=APP, user_id="u1") == {}
    s = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(s, event({"user:profile": {"name": "A"}, "mine": 1}))
    await service.append_event(s, event({"user:n": 1}))
    await service.append_event(s, event({"user:n": 2}))
    assert await service.get_user_state(app_name=APP, user_id="u1") == {
        "profile": {"name": "A"}, "n": 2}
    assert await service.get_user_state(app_name=APP, user_id="u2") == {}
    assert await service.get_user_state(app_name="other", user_id="u1") == {}


# -- events ----------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_a_full_event_reads_back_equal(service):
    """An event with every kind of field reads back equal, and so does its session."""
    s = await service.create_session(app_name=APP, user_id=USER)
    e = Event(
        invocation_id="inv", author="user", turn_complete=True, partial=False,
        content=types.Content(role="user", parts=[
            types.Part(text="look"),
            types.Part.from_bytes(data=b"\x00\xff\x89PNG", mime_type="image/png")]),
        actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="agent",
                             escalate=True, state_delta={"k": "v"}),
        long_running_tool_ids={"tool1"}, error_code="code", error_message="message",
        interrupted=True,
        grounding_metadata=types.GroundingMetadata(
            web_search_queries=["q"],
            search_entry_point=types.SearchEntryPoint(sdk_blob=b"blob")),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1, candidates_token_count=1, total_token_count=2),
        citation_metadata=types.CitationMetadata(), custom_metadata={"c": "v"},
        timestamp=1700000000.123,
        input_transcription=types.Transcription(text="in", finished=True),
        output_transcription=types.Transcription(text="out", finished=True),
    )
    await service.append_event(s, e)
    got = await reload(service, s)
    assert got.events == [e]
    assert got == s


@pytest.mark.asyncio
async def test_tool_confirmations_are_kept(service):
    """A requested tool confirmation survives the round trip."""
    s = await service.create_session(app_name=APP, user_id=USER)
    confirmation = ToolConfirmation(hint="sure?", confirmed=False, payload={"id": "album_1"})
    await service.append_event(s, Event(author="user", invocation_id="i", actions=EventActions(
        requested_tool_confirmations={"call_1": confirmation})))
    got = (await reload(service, s)).events[0].actions.requested_tool_confirmations
    assert got == {"call_1": confirmation}


@pytest.mark.asyncio
async def test_partial_events_are_neither_stored_nor_added(service):
    """A partial (streaming) event is returned as is: not stored, not added to the session."""
    s = await service.create_session(app_name=APP, user_id=USER)
    await service.append_event(s, event({"k": 1}, partial=True))
    assert s.events == [] and (await reload(service, s)).events == []
    assert "k" not in (await reload(service, s)).state


@pytest.mark.asyncio
async def test_update_time_follows_the_event(service):
    """Appending sets the session's last_update_time to the event's timestamp, in
    memory and in storage."""
    s = await service.create_session(app_name=APP, user_id=USER)
    when = s.last_update_time + 10
    await service.append_event(s, event(timestamp=when))
    assert s.last_update_time == pytest.approx(when, abs=1e-6)
    assert (await reload(service, s)).last_update_time == pytest.approx(when, abs=1e-6)


@pytest.mark.asyncio
async def test_timestamps_read_back_exactly(service):
    """Event timestamps come back as the same floats (no rounding, no time zones)."""
    stamps = [1730613600.0, 1730615400.0, 1730615400.123456, 1e9 + 0.1]
    s = await service.create_session(app_name=APP, user_id=USER)
    for t in stamps:
        await service.append_event(s, event(timestamp=t))
    got = await reload(service, s)
    assert sorted(e.timestamp for e in got.events) == sorted(stamps)


@pytest.mark.asyncio
async def test_tied_timestamps_keep_append_order(service):
    """Events with one timestamp come back in the order they were appended."""
    s = await service.create_session(app_name=APP, user_id=USER)
    ids = ["z", "m", "a", "q"]
    for i in ids:
        await service.append_event(s, Event(id=i, author="user", timestamp=100.0))
    assert [e.id for e in (await reload(service, s)).events] == ids


@pytest.mark.asyncio
async def test_out_of_order_timestamps_read_back_in_time_order(service):
    """Events appended with timestamps out of order come back in timestamp order, and
    the recent-event limit takes the latest by time."""
    s = await service.create_session(app_name=APP, user_id=USER)
    for i, t in enumerate([5.0, 3.0, 9.0, 1.0, 7.0]):
        await service.append_event(s, Event(id=f"e{i}", author="user", timestamp=t))
    got = await reload(service, s)
    assert [e.timestamp for e in got.events] == [1.0, 3.0, 5.0, 7.0, 9.0]
    got = await service.get_session(app_name=APP, user_id=USER, session_id=s.id,
                                    config=GetSessionConfig(num_recent_events=2))
    assert [e.timestamp for e in got.events] == [7.0, 9.0]
    got = await service.get_session(app_name=APP, user_id=USER, session_id=s.id,
                                    config=GetSessionConfig(after_timestamp=4.0))
    assert [e.timestamp for e in got.events] == [5.0, 7.0, 9.0]


@pytest.mark.asyncio
async def test_get_session_config_limits_the_events(service):
    """num_recent_events keeps the last N (0: none); after_timestamp keeps those at or
    after it; both together keep what both allow."""
    s = await service.create_session(app_name=APP, user_id=USER)
    base = float(int(time.time()))
    for i in range(1, 8):
        await service.append_event(s, event(timestamp=base + i, invocation_id=f"i{i}"))

    async def times(**config):
        got = await service.get_session(app_name=APP, user_id=USER, session_id=s.id,
                                        config=GetSessionConfig(**config))
        return [int(e.timestamp - base) for e in got.events]

    assert await times() == [1, 2, 3, 4, 5, 6, 7]
    assert await times(num_recent_events=0) == []
    assert await times(num_recent_events=3) == [5, 6, 7]
    assert await times(num_recent_events=30) == [1, 2, 3, 4, 5, 6, 7]
    assert await times(after_timestamp=base + 4) == [4, 5, 6, 7]
    assert await times(after_timestamp=base + 70) == []
    assert await times(after_timestamp=base + 2, num_recent_events=3) == [5, 6, 7]
    assert await times(after_timestamp=base + 6, num_recent_events=3) == [6, 7]
    with pytest.raises(ValueError):
        GetSessionConfig(num_recent_events=-1)


# -- stale sessions ------------------------------------------------------------------

@pytest.mark.asyncio
async def test_append_to_a_deleted_session_is_refused(service):
    """Appending to a session that was deleted raises SessionNotFoundError."""
    s = await service.create_session(app_name=APP, user_id=USER)
    await service.delete_session(app_name=APP, user_id=USER, session_id=s.id)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(s, event())


@pytest.mark.asyncio
async def test_stale_copy_is_refused(service):
    """A session object older than storage (another copy appended since it was read)
    is refused with StaleSessionError, and nothing of its event is stored."""
    s = await service.create_session(app_name=APP, user_id=USER)
    old = s.model_copy(deep=True)
    await service.append_event(s, event({"a": 1}, timestamp=s.last_update_time + 1))
    with pytest.raises(StaleSessionError):
        await service.append_event(old, event({"b": 2}, timestamp=s.last_update_time + 2))
    got = await reload(service, s)
    assert len(got.events) == 1 and got.state == {"a": 1}
    fresh = await reload(service, s)
    await service.append_event(fresh, event({"b": 2}, timestamp=s.last_update_time + 3))
    assert (await reload(service, s)).state == {"a": 1, "b": 2}


@pytest.mark.asyncio
async def test_racing_stale_copies_one_wins(service):
    """Two copies of one session appended at once: one is stored, the other refused,
    round after round."""
    s = await service.create_session(app_name=APP, user_id=USER)
    for i in range(5):
        current = await reload(service, s)
        copies = [current.model_copy(deep=True) for _ in range(2)]
        base = current.last_update_time + 10
        results = await asyncio.gather(
            *(service.append_event(c, event({f"k{i}.{j}": j}, timestamp=base + j))
              for j, c in enumerate(copies)),
            return_exceptions=True)
        assert sorted(type(r).__name__ for r in results) == ["Event", "StaleSessionError"]
    got = await reload(service, s)
    assert len(got.events) == 5 and len(got.state) == 5


@pytest.mark.asyncio
async def test_markerless_current_session_is_accepted(service):
    """A session object that holds the latest stored event is current, even without
    the service's revision marker and with a slightly different time."""
    s = await service.create_session(app_name=APP, user_id=USER)
    await service.append_event(s, event(timestamp=s.last_update_time + 10))
    s._storage_update_marker = None
    s.last_update_time -= 0.0001
    await service.append_event(s, event(timestamp=s.last_update_time + 20))
    assert len((await reload(service, s)).events) == 2
