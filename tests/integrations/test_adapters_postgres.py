"""The adapters on PostgreSQL, with real concurrency (issue 26): two processes that
read state and write from it in one transaction never lose each other's writes.

Each race is made to happen, not hoped for: the first writer is held right before its
COMMIT (a test trigger on ``change_new`` waits for an advisory lock the test holds),
and the test lets it go once the second writer is waiting for a lock too (the one
that would have lost its write, or the fixed one waiting its turn).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time

import psycopg
import pytest

import agentstate

WAIT = 60
PAUSE = 4242  # the advisory lock the trigger waits for

PAUSE_SQL = f"""
CREATE FUNCTION test_pause() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({PAUSE});
    RETURN NEW;
END $$;
CREATE TRIGGER test_pause BEFORE INSERT ON change_new FOR EACH ROW EXECUTE FUNCTION test_pause();
"""


@pytest.fixture
def admin(pg_admin_url):
    with psycopg.connect(pg_admin_url, autocommit=True) as c:
        yield c


class Pause:
    """Holds every transaction of the store at its COMMIT until ``release``."""

    def __init__(self, url: str, admin) -> None:
        self.admin = admin
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(PAUSE_SQL)
        admin.execute("SELECT pg_advisory_lock(%s)", (PAUSE,))

    def wait_for(self, n: int, procs) -> None:
        """Until n backends wait for a lock (or a process ended: it failed)."""
        deadline = time.monotonic() + WAIT
        while self.admin.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0] < n:
            assert all(p.is_alive() for p in procs), "a writer ended before it waited"
            assert time.monotonic() < deadline, "the writers never came to wait"
            time.sleep(0.01)

    def release(self) -> None:
        self.admin.execute("SELECT pg_advisory_unlock(%s)", (PAUSE,))


def race(url: str, admin, target, first_args, second_args, setup=None) -> None:
    """Runs target(url, *first_args) in a process held at its COMMIT, then the second in
    another, and lets the first go once both wait."""
    agentstate.open(url).close()  # the store's tables, for the trigger
    if setup is not None:
        setup()
    pause = Pause(url, admin)
    ctx = mp.get_context("spawn")
    first = ctx.Process(target=target, args=(url, *first_args))
    second = ctx.Process(target=target, args=(url, *second_args))
    try:
        first.start()
        pause.wait_for(1, [first])
        second.start()
        pause.wait_for(2, [first, second])
    finally:
        pause.release()
    for p in (first, second):
        p.join(WAIT * 2)
        assert p.exitcode == 0


# -- ADK: the app: and user: state of sessions created at once (item 3) -----------------------


def _adk_create(url: str, who: str, user: str, prefix: str) -> None:
    from agentstate.integrations.adk import AgentStateSessionService

    with agentstate.open(url, busy_timeout=WAIT) as db:
        asyncio.run(AgentStateSessionService(db).create_session(
            app_name="new-app", user_id=user, session_id=f"s-{who}", state={f"{prefix}:{who}": 1}))


@pytest.mark.parametrize("prefix", ["app", "user"])
def test_adk_sessions_created_at_once_keep_both_states(pg_url, admin, prefix):
    """Two workers creating sessions at once, of a new app (two users) or of one user
    without user state yet: the app (or user) state gets both workers' keys."""
    from agentstate.integrations.adk import AgentStateSessionService

    users = ("ada", "bob") if prefix == "app" else ("ada", "ada")

    def setup():  # the user exists; the app and the user have no state yet
        with agentstate.open(pg_url) as db:
            asyncio.run(AgentStateSessionService(db).create_session(
                app_name="new-app", user_id="ada", session_id="s-0"))

    race(pg_url, admin, _adk_create, ("a", users[0], prefix), ("b", users[1], prefix),
         setup=None if prefix == "app" else setup)
    with agentstate.open(pg_url) as db:
        session = asyncio.run(AgentStateSessionService(db).get_session(
            app_name="new-app", user_id="ada", session_id="s-a"))
    assert {k: v for k, v in session.state.items() if ":" in k} == {f"{prefix}:a": 1, f"{prefix}:b": 1}


# -- openai-agents: the first items of a session, added at once (item 4) ---------------------

BIG = 1_100_000  # characters: an item over 1 MB is stored in parts


def _openai_add(url: str, who: str) -> None:
    from agentstate.integrations.openai_agents import AgentStateSession

    with agentstate.open(url, busy_timeout=WAIT) as db:
        session = AgentStateSession("conv", db)
        asyncio.run(session.add_items([{"role": "user", "content": who * BIG}]))


def test_openai_first_large_items_added_at_once_are_both_kept(pg_url, admin):
    """Two first add_items on one session, each with an item over 1 MB: both items are
    kept, once each."""
    from agentstate.integrations.openai_agents import AgentStateSession

    race(pg_url, admin, _openai_add, ("a",), ("b",))
    with agentstate.open(pg_url) as db:
        items = asyncio.run(AgentStateSession("conv", db).get_items())
    assert sorted(i["content"][0] for i in items) == ["a", "b"]
    assert all(len(i["content"]) == BIG for i in items)


# -- LangGraph store: a put racing the delete of its namespace's last item (item 9) ----------


def _lg_write(url: str, key: str, value) -> None:
    from langgraph.store.base import PutOp

    from agentstate.integrations.langgraph import AgentStateStore

    with agentstate.open(url, busy_timeout=WAIT) as db:
        AgentStateStore(db).batch([PutOp(("docs",), key, value)])


def test_langgraph_a_put_racing_the_delete_of_the_last_item_keeps_the_namespace(pg_url, admin):
    """A put into a namespace while its last item is deleted: the new item is found by
    search() and the namespace by list_namespaces()."""
    from agentstate.integrations.langgraph import AgentStateStore

    def setup():
        with agentstate.open(pg_url) as db:
            AgentStateStore(db).put(("docs",), "old", {"n": 1})

    race(pg_url, admin, _lg_write, ("new", {"n": 2}), ("old", None), setup=setup)
    with agentstate.open(pg_url) as db:
        store = AgentStateStore(db)
        assert [i.key for i in store.search(("docs",))] == ["new"]
        assert store.list_namespaces() == [("docs",)]
