"""The behavioural tests of SPEC §2–§5, §9 and §10, run again through ``agentstate.connect()``.

The same test functions, imported from their modules, with one fixture changed:
``db`` is a remote Database talking HTTP to a real server (uvicorn on a
loopback port, started per test over a fresh file at ``db_path``). The server
holds an admin token for "ops", the admin principal of the tests; other
principals are named per call in X-Agentstate-Principal. Tests that reach
into the local file's connection (``db._store``) or open their own database
are left out below, each with its reason.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

import agentstate
from agentstate.server import create_app

from .test_expiry import *  # noqa: F403
from .test_feed import *  # noqa: F403
from .test_pop_async_batch import *  # noqa: F403
from .test_runs import *  # noqa: F403
from .test_scope import *  # noqa: F403
from .test_sessions import *  # noqa: F403

# Left out: what only makes sense in the process that holds the file.
LEFT_OUT = {
    # reach into the local connection (db._store) or the file's SQL directly
    "test_delete_removes_list_items", "test_put_over_list_replaces_items", "test_append_is_o1",
    "test_delete_cascades", "test_read_is_consistent_while_writing", "test_delete_session",
    "test_integrity", "test_check_finds_a_hole_made_by_hand", "test_delete",
    "test_write_entries_and_tail_cost_does_not_grow_with_history", "test_list_does_not_read_histories",
    "test_put_replaces_a_list_and_its_items", "test_append_is_flat_in_storage",
    "test_delete_removes_session_turns_and_state",
    # open databases of their own (hypothesis examples, processes): already run locally
    "test_setting_values", "test_bad_ttls_are_refused_and_change_nothing",
    "test_pop_matches_a_python_list", "test_a_polling_reader_never_sees_a_lower_seq_appear",
    # transaction() cannot span HTTP calls (remote transactions: test_server.py)
    "test_transaction_rows_are_consecutive_and_rollback_leaves_none",
    "test_watch_inside_a_transaction_is_a_usage_error", "test_transaction_groups_writes_across_scopes",
    "test_refused_call_inside_transaction_keeps_earlier_writes", "test_nested_transactions",
    # the local purge and vacuum run where the file is
    "test_expired_rows_are_purged_as_writes_happen", "test_vacuum_purges_everything_expired",
    # the command works on a file or a server URL, not on an HTTP URL
    "test_command_changes_and_follow", "test_command_prune_trim_settings",
    "test_an_expired_key_is_absent_to_every_reader",
    # asyncio timing of the local worker threads (the remote twins are the same code)
    "test_async_twins_never_block_the_event_loop",
    "test_awatch_from_another_process_without_blocking_the_loop",
}
for _name in [n for n in list(globals()) if n in LEFT_OUT or n.startswith("Test")
              or n.endswith("_model") or n.endswith("Model")]:
    del globals()[_name]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def db(db_path):
    local = agentstate.open(db_path)
    token = local.tokens.create("ops", admin=True)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(local), host="127.0.0.1", port=port,
                                           log_level="error", access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    remote = agentstate.connect(f"http://127.0.0.1:{port}", token=token)
    remote.served = local  # what conftest's digest(), target() and RawSQL() look at
    yield remote
    remote.close()
    server.should_exit = True
    thread.join(30)
    local.close()


def test_the_fixture_is_remote(db):
    assert db.path.startswith("http://127.0.0.1:") and db.durability == "server"
    assert db.check() == [] and db.info()["schema_version"] == agentstate._connection.SCHEMA_VERSION  # admins ask the server
    for local_only in (lambda: db.backup("x.db"), db.vacuum, lambda: db.tokens.create("x")):
        with pytest.raises(agentstate.UsageError):
            local_only()


def test_sql_through_the_remote_client_is_a_usage_error(db):
    """db.sql() is for local stores: through connect() it is refused, and nothing is sent."""
    db.scope("app", "a").put("k", 1)
    for query in ("SELECT 1", "DELETE FROM kv"):
        with pytest.raises(agentstate.UsageError, match="local stores"):
            db.sql(query)
    assert db.scope("app", "a").get("k") == 1


def test_open_refuses_an_http_url(tmp_path, monkeypatch):
    """A URL is never taken for a file name: open() of an http URL says to use connect()."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(agentstate.UsageError, match="connect"):
        agentstate.open("http://127.0.0.1:8765")
    assert list(tmp_path.iterdir()) == []


def test_a_client_s_threads_take_turns_updating_one_key(db, monkeypatch):
    """8 threads of one client increment one key: each update's function runs once,
    with no compare-and-set lost to a sibling thread and retried (19 s for 800 before).
    (TURN_WAIT made long: on a loaded machine 7 updates ahead may take over a second.)"""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    s = db.scope("agent", "a")
    assert increment_from_threads(s, 8, 25) == 200  # noqa: F405 (test_scope's helper)
    assert s.get_versioned("n") == (200, 200)


def test_an_unrelated_key_never_waits_for_a_client_s_slow_update(db, monkeypatch):
    """A thread's slow update() (an LLM call in its function) holds its key's turn only:
    another thread's update of another key goes at once. (Striped over 64 locks, a key
    whose hash shared the slow one's stripe waited for it; this test uses such a key.)"""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    s = db.scope("agent", "slow")
    other = next(f"counter{i}" for i in range(100_000)
                 if hash(("agent", "slow", f"counter{i}")) % 64 == hash(("agent", "slow", "summary")) % 64)
    started = threading.Event()

    def summarise(text):
        started.set()
        time.sleep(2)
        return "summary"

    slow = threading.Thread(target=s.update, args=("summary", summarise), kwargs={"default": ""})
    slow.start()
    assert started.wait(10)
    t0 = time.monotonic()
    s.update(other, lambda n: n + 1, default=0)
    took = time.monotonic() - t0
    slow.join(30)
    assert took < 1.5 and s.get(other) == 1 and s.get("summary") == "summary"


def test_updates_nested_across_keys_never_wait_for_each_other(db, monkeypatch):
    """Thread A updates x and, inside, y; thread B updates y and, inside, x. Both hold
    their outer key's turn when they reach the inner update: neither may wait for the
    other's turn, and no increment is lost. (TURN_WAIT made longer than the test's wait:
    the bound on a turn must not be what saves this case.)"""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    s = db.scope("agent", "a")
    both_inside = threading.Barrier(2)
    errors, runs = [], {"x": 0, "y": 0}

    def crossing(outer, inner):
        def fn(n):
            runs[outer] += 1
            if runs[outer] == 1:  # the function runs again if its write lost a race
                both_inside.wait(10)
            s.update(inner, lambda m: m + 1, default=0)
            return n + 1

        def work():
            try:
                s.update(outer, fn, default=0)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)
        return threading.Thread(target=work, daemon=True)

    threads = [crossing("x", "y"), crossing("y", "x")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "two updates waited for each other"
    assert errors == []
    # each key: its outer update once, and the other's inner one once per run of its function
    assert (s.get("x"), s.get("y")) == (1 + runs["y"], 1 + runs["x"])


def test_an_update_whose_function_waits_for_another_thread_s_update_does_not_hang(db):
    """update()'s function hands an update of the same key to another thread and waits
    for it: that thread cannot have the key's turn, so it goes without after a second
    (before, it waited for ever and so did the first). Both increments land."""
    s = db.scope("agent", "a")
    inner: list[str] = []

    def fn(n):
        if not inner:  # the first run only: the function runs again after a lost race
            inner.append("started")
            t = threading.Thread(target=lambda: (s.update("x", lambda m: m + 1, default=0),
                                                 inner.append("done")))
            t.start()
            t.join(10)
        return n + 1

    began = time.monotonic()
    assert s.update("x", fn, default=0) == 2
    assert inner == ["started", "done"] and time.monotonic() - began < 8
