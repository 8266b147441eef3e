"""The change feed (SPEC §9): one row per committed change, in order, waited on across processes."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import select
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate.cli import cli

from .conftest import RawSQL, sigint_as_in_a_terminal, target

ALICE = agentstate.Principal("alice")


@pytest.fixture
def db(any_db):
    """Every test here runs on both backends: an SQLite file and a PostgreSQL schema."""
    return any_db


def rows(db, since=0, **f):
    return [(c.topic, c.op, c.kind, c.scope_id, c.key, c.version, c.start, c.count)
            for c in db.changes(since, **f)]


def test_every_kv_write_leaves_its_change(db):
    kv = db.scope("session", "s-42")
    kv.put("a", {"x": 1})
    kv.put("l", [1, 2, 3])
    kv.append("l", [4])
    kv.pop("l", 2)
    kv.touch("a", 60)
    kv.delete("a")
    kv.put_bytes("b", b"\x00")
    assert kv.delete("never") is False and kv.touch("never") is False  # nothing changed: no row
    kv.pop("l", 0)
    kv.append("l", [])
    assert rows(db) == [
        ("kv", "put", "session", "s-42", "a", 1, None, None),
        ("kv", "put", "session", "s-42", "l", 1, 0, 3),
        ("kv", "append", "session", "s-42", "l", 2, 3, 1),
        ("kv", "pop", "session", "s-42", "l", 3, 2, 2),
        ("kv", "touch", "session", "s-42", "a", 1, None, None),
        ("kv", "delete", "session", "s-42", "a", 1, None, None),
        ("kv", "put", "session", "s-42", "b", 1, None, None),
    ]
    c = db.changes()[0]
    assert c.at.tzinfo is not None and abs(time.time() - c.at.timestamp()) < 60


def test_runs_and_sessions_leave_their_changes(db):
    db.runs.write("r", [{"seq": 0}, {"seq": 1}], {"task": "t"}, create=True)
    db.runs.write("r", [{"seq": 1}, {"seq": 2}], None)  # seq 1 re-sent: one added
    db.runs.fork("r", "r2", upto=1)
    db.runs.trim("r", before=2)
    db.runs.delete("r2")
    s = db.sessions.create(ALICE)
    t = db.sessions.start_turn(s.id, ALICE)
    t.hold({"q": 1})
    db.sessions.decide(t.id, ALICE, "yes")
    db.sessions.resume(t.id, ALICE).finish()
    db.sessions.state(s.id, ALICE).put("k", 1)
    db.sessions.delete(s.id, ALICE)
    assert rows(db) == [
        ("run", "create", None, "r", None, None, 0, 2),
        ("run", "write", None, "r", None, None, 2, 1),
        ("run", "fork", None, "r2", None, None, 0, 2),
        ("run", "trim", None, "r", None, None, 2, 2),
        ("run", "delete", None, "r2", None, None, None, None),
        ("session", "create", None, s.id, None, None, None, None),
        ("session", "running", None, s.id, t.id, None, None, None),
        ("session", "held", None, s.id, t.id, None, None, None),
        ("session", "decided", None, s.id, t.id, None, None, None),
        ("session", "resuming", None, s.id, t.id, None, None, None),
        ("session", "finished", None, s.id, t.id, None, None, None),
        ("kv", "put", "session", s.id, "k", 1, None, None),
        ("kv", "delete", "session", s.id, "k", 1, None, None),
        ("session", "delete", None, s.id, None, None, None, None),
    ]


def test_transaction_rows_are_consecutive_and_rollback_leaves_none(db):
    a, b = db.scope("app", "a"), db.scope("user", "b")
    a.put("x", 0)
    head = db.last_change()
    with pytest.raises(RuntimeError):
        with db.transaction():
            a.put("x", 1)
            raise RuntimeError
    with pytest.raises(agentstate.VersionConflict):
        a.put("x", 5, if_version=9)
    with pytest.raises(agentstate.TooLarge):
        b.append("l", ["x" * (1 << 20)])
    assert db.last_change() == head and db.changes(head) == []
    with db.transaction():
        a.put("x", 2)
        b.append("l", [1])
        a.delete("x")
    assert [c.seq for c in db.changes(head)] == [head + 1, head + 2, head + 3]
    with db.batch() as bt:
        bt.scope("app", "a").put("y", 1)
        bt.scope("app", "a").put("z", 1)
    assert [c.key for c in db.changes(head + 3)] == ["y", "z"]


def test_filters_and_paging(db):
    for i in range(5):
        db.scope("session", f"s{i % 2}").put(f"k{i}", i)
    db.runs.write("r", [], None, create=True)
    assert [c.key for c in db.changes(kind="session", scope_id="s0")] == ["k0", "k2", "k4"]
    assert [c.scope_id for c in db.changes(topic="run")] == ["r"]
    assert [c.key for c in db.changes(key="k3")] == ["k3"]
    assert [c.seq for c in db.changes(2, limit=2)] == [3, 4]
    for bad in ({"topic": "nope"}, {"limit": 0}, {"limit": True}, {"since": -1}):
        with pytest.raises(agentstate.InvalidValue):
            db.changes(**bad)
    with pytest.raises(agentstate.InvalidKey):
        db.changes(kind="nope")


def test_changes_view_in_sql(db):
    """The changes view, as the sqlite3 shell or psql reads it."""
    db.scope("app", "a").put("k", 1)
    with RawSQL(db) as c:
        got = c.execute("SELECT seq, at, topic, op, kind, scope_id, key, version FROM changes "
                        "ORDER BY seq DESC LIMIT 20")
    assert got[0][0] == 1 and got[0][1].endswith("Z") and got[0][2:] == ("kv", "put", "app", "a", "k", 1)


def test_retention_purges_as_writes_happen_and_cursor_expires(db):
    kv = db.scope("app", "a")
    kv.put("k", 0)
    db.set_setting("feed_retention", 1)
    time.sleep(1.2)
    for i in range(64):  # enough write transactions for the bounded purge to reach the old rows
        kv.put("k", i)
    # a cursor whose next change is kept is fine (not `first`: on a loaded machine the 64 puts
    # may take over a second, and the first of them be purged too)
    recent = db.last_change() - 1
    assert db.changes(recent, limit=1)[0].seq == recent + 1
    with pytest.raises(agentstate.CursorExpired) as e:
        db.changes(0)
    assert e.value.code == "cursor_expired" and e.value.status == 410 and isinstance(e.value, LookupError)
    # the feed off: only the head is a valid cursor, and nothing new is recorded
    db.set_setting("feed_retention", 0)
    head = db.last_change()
    kv.put("k", "off")
    assert db.last_change() == head and db.changes(head) == []
    with pytest.raises(agentstate.CursorExpired):
        db.changes(head - 1)
    with pytest.raises(agentstate.CursorExpired):
        db.watch(head - 1, timeout=0)
    db.set_setting("feed_retention", 3600)
    kv.put("k", "on")
    assert [c.seq for c in db.changes(head)] == [head + 1]  # seqs go on, never reused


@settings(max_examples=40)
@given(value=st.one_of(st.integers(), st.floats(), st.text(max_size=5), st.booleans(), st.none(),
                       st.lists(st.integers(), max_size=2)))
def test_setting_values(db, value):
    """A good value is kept as given; a bad one (or an unknown name) changes nothing."""
    db.set_setting("feed_retention", 604800)
    ok = type(value) is int and 0 <= value <= 100 * 365 * 86400
    if ok:
        db.set_setting("feed_retention", value)
        assert db.settings()["feed_retention"] == value
    else:
        with pytest.raises(agentstate.InvalidValue):
            db.set_setting("feed_retention", value)
        assert db.settings() == {"feed_retention": 604800, "history_retention": 86400}
    with pytest.raises(agentstate.InvalidValue):
        db.set_setting("no_such_setting", 1)


def _watch_in_child(path, since, q):
    with agentstate.open(path) as db:
        q.put("ready")
        got = db.watch(since, kind="session", scope_id="s-42", key="history", timeout=30)
        q.put((time.time(), [(c.op, c.key, c.start, c.count) for c in got]))


def test_watch_wakes_on_another_process_append(db):
    """A watcher in one process returns soon after another process appends to the key."""
    head = db.last_change()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_watch_in_child, args=(target(db), head, q))
    p.start()
    assert q.get(timeout=60) == "ready"
    time.sleep(0.3)
    db.scope("session", "s-42").put("other", 1)  # a change the filter does not match
    subprocess.run([sys.executable, "-c", "import agentstate, sys; agentstate.open(sys.argv[1])"
                    ".scope('session', 's-42').append('history', [1, 2])", target(db)], check=True)
    written = time.time()
    woke, got = q.get(timeout=30)
    p.join(30)
    assert got == [("append", "history", 0, 2)]
    assert woke - written < 5  # wide margin; benchmarks/ measure the real latency (p99 <= 50 ms)


def test_watch_times_out_with_nothing(db):
    t0 = time.monotonic()
    assert db.watch(db.last_change(), timeout=0.2) == []
    assert time.monotonic() - t0 >= 0.2


def test_awatch_from_another_process_without_blocking_the_loop(db):
    head = db.last_change()

    async def main():
        ticks = 0
        got = []

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        async def follow():
            async for ch in db.awatch(head, topic="run", scope_id="run-1"):
                got.append((ch.op, ch.start, ch.count))
                if len(got) == 2:
                    return

        t = asyncio.create_task(ticker())
        writer = asyncio.create_task(asyncio.to_thread(subprocess.run, [
            sys.executable, "-c",
            "import agentstate, sys, time; db = agentstate.open(sys.argv[1]); time.sleep(0.5); "
            "db.runs.write('run-1', [{'seq': 0}], None, create=True); time.sleep(0.2); "
            "db.runs.write('run-1', [{'seq': 1}, {'seq': 2}], None)", target(db)], check=True))
        await asyncio.wait_for(follow(), 60)
        await writer
        t.cancel()
        return ticks, got

    ticks, got = asyncio.run(main())
    assert got == [("create", 0, 1), ("write", 1, 2)]
    assert ticks >= 20  # the loop kept running while the watcher waited


def _churn_writer(path, n, seed):
    import random

    rnd = random.Random(seed)
    with agentstate.open(path) as db:
        for _ in range(n):
            db.scope("agent", f"a{rnd.randrange(3)}").update("n", lambda v: v + 1, default=0)


@pytest.mark.slow_on_postgres  # PostgreSQL's case in CI's -m slow (seconds)
def test_a_polling_reader_never_sees_a_lower_seq_appear(db):
    """Many processes commit while a reader polls: the seqs it reads are contiguous and rising,
    and what it saw is exactly what the feed holds afterwards."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_churn_writer, args=(target(db), 150, i)) for i in range(4)]
    for p in procs:
        p.start()
    seen, since = [], 0
    while any(p.is_alive() for p in procs) or db.changes(since):
        got = db.changes(since)
        seen += [c.seq for c in got]
        since = got[-1].seq if got else since
    for p in procs:
        p.join()
    assert seen == list(range(1, 601)) == [c.seq for c in db.changes(0)]
    assert sum(db.scope("agent", f"a{i}").get("n", 0) for i in range(3)) == 600


def test_command_changes_and_follow(db):
    db_path = target(db)
    db.scope("app", "a").put("k", 1)
    r = CliRunner().invoke(cli, ["--db", db_path, "--json", "changes"])
    line = json.loads(r.stdout.splitlines()[0])
    assert r.exit_code == 0 and set(line) == set(agentstate.Change._fields)
    assert line["op"] == "put" and line["at"].endswith("Z")
    # --since the head: a child slower to start than the append below still prints it (with
    # no --since it follows from its own start, and a loaded CI machine once hung here).
    head = db.last_change()
    with sigint_as_in_a_terminal():
        p = subprocess.Popen([sys.executable, "-m", "agentstate", "--db", db_path, "--json",
                              "changes", "--follow", "--since", str(head)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)  # usually started and waiting: the append then wakes its watch
        db.scope("app", "a").append("l", [1])
        ready, _, _ = select.select([p.stdout], [], [], 60)
        assert ready, "the follower printed nothing in 60 s"
        got = json.loads(p.stdout.readline())
        assert got["op"] == "append" and got["key"] == "l"
    finally:
        p.send_signal(signal.SIGINT)
        assert p.wait(30) == 0 and "Traceback" not in p.stderr.read()
    r = CliRunner().invoke(cli, ["--db", db_path, "changes", "--topic", "nope"])
    assert r.exit_code == 2


def test_watch_inside_a_transaction_is_a_usage_error(db):
    with db.transaction():
        with pytest.raises(agentstate.UsageError):
            db.watch(0, timeout=0)


def test_recent_feed_rows_are_never_purged(db):
    """Purge steps run as writes happen, but a row within the retention is kept."""
    kv = db.scope("app", "a")
    for i in range(100):
        kv.put("k", i)
    assert [c.seq for c in db.changes(0)] == list(range(1, 101))  # well within 7 days: all kept
