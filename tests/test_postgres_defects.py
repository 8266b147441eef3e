"""Defects of the PostgreSQL backend found by review (issue 26), each checked where it broke.

Concurrency here is made deterministic, not hoped for: a writer is held inside
its transaction by an Event, and the test waits until the server shows the
other writer waiting for a lock (``pg_locks``) or until it has finished.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import psycopg
import pytest

import agentstate
from agentstate.backends.postgres import schema as pgstore

from . import pgserver
from .conftest import RawSQL

ALICE = agentstate.Principal("alice")
ADMIN = agentstate.Principal("ops", admin=True)
WAIT = 60  # seconds: generous bounds for a loaded machine; a passing run never waits them out


@pytest.fixture
def db(pg_url):
    d = agentstate.open(pg_url, busy_timeout=WAIT)
    yield d
    d.close()


@pytest.fixture
def admin(pg_admin_url):
    with psycopg.connect(pg_admin_url, autocommit=True) as c:
        yield c


class Worker(threading.Thread):
    """A thread whose result or exception is kept for the test."""

    def __init__(self, fn, *args):
        super().__init__(daemon=True)
        self.fn, self.args, self.result, self.error = fn, args, None, None

    def run(self):
        try:
            self.result = self.fn(*self.args)
        except BaseException as e:  # reported by join_ok
            self.error = e

    def join_ok(self):
        self.join(WAIT)
        assert not self.is_alive(), "the worker is still running"
        if self.error is not None:
            raise self.error
        return self.result


def started(fn, *args) -> Worker:
    w = Worker(fn, *args)
    w.start()
    return w


def waiters(admin) -> int:
    return admin.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]


def wait_blocked(admin, n: int, *workers: Worker) -> None:
    """Until n backends wait for a lock, or every one of ``workers`` has finished."""
    deadline = time.monotonic() + WAIT
    while waiters(admin) < n and any(w.is_alive() for w in workers):
        assert time.monotonic() < deadline, "nobody came to wait for the lock"
        time.sleep(0.01)


# -- 1. versions are never reused -------------------------------------------------------


def _recreate(s, op):
    if op == "put":
        return s.put("k", "new")
    if op == "put_if_absent":
        return s.put("k", "new", if_version=0)
    if op == "put_list":
        return s.put("k", ["new"])
    if op == "put_bytes":
        return s.put_bytes("k", b"\"new\"")
    return s.append("k", ["new"]).version


@pytest.mark.parametrize("op", ["put", "put_if_absent", "put_list", "put_bytes", "append"])
def test_a_write_that_waited_for_a_delete_never_reuses_a_version(db, admin, op):
    """Versions are never reused, not even after a delete (§2): a write that waited for a
    concurrent delete of its key re-creates it above the deleted version."""
    s = db.scope("app", "a")
    for i in range(3):
        s.put("k", i)  # version 3
    deleted, release = threading.Event(), threading.Event()

    def delete():
        with db.transaction():
            assert s.delete("k")
            deleted.set()
            assert release.wait(WAIT)

    a = started(delete)
    assert deleted.wait(WAIT)
    b = started(_recreate, s, op)
    wait_blocked(admin, 1, b)
    release.set()
    a.join_ok()
    version = b.join_ok()
    assert version > 3
    assert s.get_versioned("k").version == version
    with pytest.raises(agentstate.VersionConflict):
        s.put("k", "stale", if_version=1)
    assert db.check() == []


# -- 2. a read of an absent key inside transaction() locks it ------------------------------


def _other_writer(db, other):
    s = db.scope("app", "a")
    if other == "block":
        with db.transaction():
            s.put("ctr", s.get("ctr", 0) + 1)
    elif other == "update":
        s.update("ctr", lambda n: n + 1, default=0)
    else:
        s.put("ctr", 100)


@pytest.mark.parametrize("how", ["get", "get_many"])
@pytest.mark.parametrize("other, final", [("block", 2), ("update", 2), ("put", 100)])
def test_a_block_that_read_an_absent_key_loses_no_update(db, admin, other, final, how):
    """Reads inside transaction() lock the keys they read, absent ones included: a block
    that read a key as absent is never overwritten by a writer that came after its read.
    (get_many takes the locks of all its keys, with the read, in one round trip.)"""
    s = db.scope("app", "a")
    read, release = threading.Event(), threading.Event()

    def block():
        with db.transaction():
            n = s.get("ctr", 0) if how == "get" else (s.get_many(["other", "ctr"])["ctr"].value or 0)
            read.set()
            assert release.wait(WAIT)
            s.put("ctr", n + 1)

    first = started(block)
    assert read.wait(WAIT)
    second = started(_other_writer, db, other)
    wait_blocked(admin, 1, second)
    release.set()
    first.join_ok()
    second.join_ok()
    assert s.get("ctr") == final


@pytest.mark.parametrize("how", ["get", "get_many", "check"])
def test_a_block_that_waited_for_a_key_being_created_holds_what_it_read(db, admin, how):
    """A read in a block (or a batch's check) that waited for a writer deleting and
    creating its key again, then reads the created row: that row is locked too, so
    a writer that comes after the read waits for the block. (Found by review for the
    check: only the key lock was taken, and the row could be written over before the
    block, or the batch, ended.)"""
    s = db.scope("app", "a")
    s.put("k", "old")
    created, release, seen, done = (threading.Event() for _ in range(4))

    def creator():  # the read first waits for the old row's delete, then finds no row
        with db.transaction():
            s.delete("k")
            s.put("k", "created")  # version 3: above the deleted one's next
            created.set()
            assert release.wait(WAIT)

    def reader():
        with db.transaction():
            if how == "get":
                got = s.get_versioned("k")
            elif how == "get_many":
                got = s.get_many(["k"])["k"]
            else:
                with db.batch() as b:
                    b.scope("app", "a").check("k", if_version=3)
                got = ("created", b.results[0])
            seen.set()
            assert done.wait(WAIT)
            return got

    c = started(creator)
    assert created.wait(WAIT)
    r = started(reader)
    wait_blocked(admin, 1, r)
    release.set()
    c.join_ok()
    assert seen.wait(WAIT)
    w = started(s.put, "k", "overwritten")
    wait_blocked(admin, 1, w)
    assert w.is_alive(), "a write of the key read went through while the block held it"
    done.set()
    assert r.join_ok() == ("created", 3)
    w.join_ok()
    assert s.get_versioned("k") == ("overwritten", 4)


@pytest.mark.parametrize("other", ["block", "update"])
def test_a_block_past_its_key_locks_still_loses_no_update(db, admin, other):
    """The same for a block that read hundreds of absent keys first (and so holds the
    whole key table instead of a lock per key)."""
    s = db.scope("app", "a")
    read, release = threading.Event(), threading.Event()

    def block():
        with db.transaction():
            for i in range(300):
                s.get(f"absent{i}")
            n = s.get("ctr", 0)
            read.set()
            assert release.wait(WAIT)
            s.put("ctr", n + 1)

    first = started(block)
    assert read.wait(WAIT)
    second = started(_other_writer, db, other)
    wait_blocked(admin, 1, second)
    release.set()
    first.join_ok()
    second.join_ok()
    assert s.get("ctr") == 2


def test_a_fenced_batch_of_checks_only_takes_no_lock(db, admin):
    """A fenced batch that only checks writes nothing: like an unfenced one it locks no
    key (nor, past the key-lock limit, the key table), so a token that may only read,
    with a turn of its own session, cannot hold writers up with it. (Found by review:
    it took the write path's locks and waited here for the block.)"""
    alice = agentstate.Principal("alice")
    turn = db.sessions.start_turn(db.sessions.create(alice).id, alice)
    s = db.scope("app", "a")
    s.put("k", "v")
    held, release = threading.Event(), threading.Event()

    def block():  # holds the key's row until released
        with db.transaction():
            s.put("k", "uncommitted")
            held.set()
            assert release.wait(WAIT)

    def checks():
        with db.batch(fence=turn) as b:
            b.scope("app", "a").check("k", if_version=1)
            for i in range(300):
                b.scope("app", "a").check(f"absent{i}", if_version=0)
        return b.results

    writer = started(block)
    assert held.wait(WAIT)
    w = started(checks)
    wait_blocked(admin, 1, w)
    try:
        assert not w.is_alive(), "the checks waited for a lock"
        assert w.join_ok() == [1] + [0] * 300
    finally:
        release.set()
        writer.join_ok()
    assert s.get_versioned("k") == ("uncommitted", 2)


def _count_in_blocks(url: str, rounds: int, start) -> None:
    db = agentstate.open(url, busy_timeout=WAIT)
    s = db.scope("app", "a")
    start.wait()
    for r in range(rounds):
        while True:
            try:
                with db.transaction():
                    s.put(f"c{r}", s.get(f"c{r}", 0) + 1)
                break
            except agentstate.Busy:  # a deadlock the server broke: the block did nothing
                continue
    db.close()


def test_processes_counting_from_absent_keys_lose_nothing(pg_url):
    """Blocks in 3 processes, each incrementing keys that start absent: every increment is
    counted (a lost update is never an outcome)."""
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    rounds = 40
    procs = [ctx.Process(target=_count_in_blocks, args=(pg_url, rounds, start)) for _ in range(3)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with agentstate.open(pg_url) as db:
        s = db.scope("app", "a")
        assert [s.get(f"c{r}") for r in range(rounds)] == [3] * rounds


def test_a_block_reading_many_absent_keys_takes_a_bounded_number_of_locks(db, admin):
    """A block that reads and creates thousands of keys does not fill the server's lock
    table (shared by every database on it): it holds a bounded number of locks."""
    s = db.scope("app", "a")
    with db.transaction():
        for i in range(3000):
            assert s.get(f"k{i}") is None
            s.put(f"k{i}", i)
        held = db._store.query("SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid()")[0][0]
    assert held < 600
    assert s.get("k2999") == 2999


# -- 5. prune never deletes a session whose turn started meanwhile --------------------------


def test_prune_never_deletes_a_session_whose_turn_started_meanwhile(db, admin, pg_url):
    """sessions.prune() deletes a session only if it is idle when it is deleted: a turn
    that started while the prune ran keeps its session (or was refused)."""
    s = db.sessions.create(ALICE)
    db.sessions.state(s.id, ALICE).put("note", 1)
    with RawSQL(db) as raw:  # holds the prune inside its delete of the session's keys
        raw.execute("BEGIN")
        raw.execute("SELECT key FROM kv WHERE scope_id = ? FOR UPDATE", (s.id,))
        prune = started(lambda: db.sessions.prune(ADMIN, idle_for=0))
        wait_blocked(admin, 1, prune)
        turn = started(db.sessions.start_turn, s.id, ALICE)
        wait_blocked(admin, 2, turn)
        raw.execute("ROLLBACK")
    pruned = prune.join_ok()
    try:
        t = turn.join_ok()
    except agentstate.NotFound:  # the prune came first: no turn started
        assert pruned == [s.id]
        return
    assert pruned == []
    assert db.sessions.get_turn(t.id, ALICE).status == "running"


# -- 6. a ttl counts from the write, not from the block's start -----------------------------


def server_now(db) -> float:
    return db._store.clock()


def test_a_ttl_inside_a_block_counts_from_the_write(db):
    """ttl makes a key expire that long after the write (§10), also late in a long block."""
    s = db.scope("app", "a")
    s.put("list", [0])
    with db.transaction():
        s.get("other")  # the block's transaction has begun
        time.sleep(1.0)
        before = server_now(db)
        s.put("k", 1, ttl=1.5)
        s.put_bytes("b", b"1", ttl=1.5)
        s.append("list", [1], ttl=1.5)
        s.append("new", [1], ttl=1.5)
        s.put("t", 1)
        s.touch("t", 1.5)
    for key in ("k", "b", "list", "new", "t"):
        assert s.expires_at(key).timestamp() >= before + 1.5, key


def test_a_key_that_expired_during_a_block_is_absent_inside_it(db):
    """From the instant it expires, a key is absent to every call (§10), a block's too."""
    s = db.scope("app", "a")
    for key in ("k", "d", "list", "gone"):
        s.put(key, [1], ttl=0.5)
    ends = max(s.expires_at(key).timestamp() for key in ("k", "d", "list", "gone"))
    with db.transaction():
        s.get("other")  # the block's transaction has begun before the keys expire
        while server_now(db) <= ends + 0.05:
            time.sleep(0.05)
        assert s.get("k") is None and s.get_versioned("k") == (None, 0)
        assert s.length("list") == 0 and s.slice("list") == [] and s.expires_at("k") is None
        assert s.put("k", 2, if_version=0) >= 2
        assert s.delete("d") is False
        assert s.append("list", [2]).length == 1
        assert s.touch("gone", 10) is False
    assert s.get("k") == 2 and s.slice("list") == [2]


# -- 7. nothing after a COMMIT turns a committed write into an error -------------------------


@pytest.fixture
def sync_server():
    """A server of its own, whose commits with synchronous_commit on wait for a standby
    that never comes (once ``stall()`` is called): a NOTIFY committed so holds the
    server's notification lock, as a slow flush or synchronous replication would."""
    bin_dir = pgserver.bindir()
    if bin_dir is None:
        pytest.fail("no PostgreSQL binaries")
    server = pgserver.Server(bin_dir).start()
    yield server
    server.stop()


def test_a_committed_write_is_never_reported_as_busy(sync_server):
    """A write whose wake-up (the NOTIFY after its COMMIT) times out waiting for the
    server's notification lock still returns its result: it was committed."""
    url = sync_server.admin_url
    db = agentstate.open(url, durability="normal", busy_timeout=0.2)
    s = db.scope("app", "a")
    s.put("k", 0)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        c.execute("SELECT pg_reload_conf()")
        deadline = time.monotonic() + WAIT
        while psycopg.connect(url).execute("SHOW synchronous_standby_names").fetchone()[0] != "nobody":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        blocker = psycopg.connect(url)
        blocker.execute("SET synchronous_commit = on")
        blocker.execute("CREATE TABLE blocker (i int)")  # a write: its commit waits for the standby
        blocker.execute("NOTIFY someone")
        commit = started(blocker.commit)
        deadline = time.monotonic() + WAIT
        while not c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
                            ).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        try:
            assert s.put("k", 1) == 2
            with db.transaction():
                s.put("k", 2)
            assert s.append("l", [1]).version == 1
        finally:
            c.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
            commit.join(WAIT)
            blocker.close()
            c.execute("ALTER SYSTEM RESET synchronous_standby_names")
            c.execute("SELECT pg_reload_conf()")
    assert s.get_versioned("k") == (2, 3) and s.slice("l") == [1]
    db.close()


# -- 20. a turn's status is the store's clock's -------------------------------------------


@pytest.mark.parametrize("skew", [120.0, -120.0])
def test_a_turn_s_status_follows_the_server_s_clock(db, monkeypatch, skew):
    """The store's clock is the server's (§11): a client whose clock is 2 minutes off
    sees a running turn as running and a lapsed one as expired."""
    s = db.sessions.create(ALICE)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    with db.sessions.turn(s.id, ALICE, lease=60) as t:
        assert t.status == "running"
        assert db.sessions.get_turn(t.id, ALICE).status == "running"
    assert db.sessions.get_turn(t.id, ALICE).status == "finished"
    short = db.sessions.start_turn(s.id, ALICE, lease=0.3)
    while server_now(db) <= short.lease_until + 0.05:
        time.sleep(0.05)
    assert short.refresh().status == "expired"
    assert db.sessions.turns(s.id, ALICE)[0].status == "expired"


# -- 24. an idle watcher holds back no notification queue -----------------------------------


def test_an_idle_watcher_holds_back_no_notification(db, admin):
    """A watcher used once and then idle does not hold the server's notification queue
    (shared by every database on it): many wake-ups later it is still empty."""
    s = db.scope("app", "a")
    assert db.watch(db.last_change(), timeout=0.01) == []
    with RawSQL(db) as raw:
        channel = raw.execute("SELECT feed_channel()")[0][0]
        for _ in range(2000):  # as many writes' wake-ups, but large: the socket fills sooner
            raw.execute("SELECT pg_notify(?, repeat('x', 7900))", (channel,))
    s.put("k", 1)
    assert admin.execute("SELECT pg_notification_queue_usage()").fetchone()[0] < 1e-4
    new = db.watch(0, key="k", timeout=WAIT)  # the watcher still works
    assert [c.key for c in new] == ["k"]


# -- 25. a database that is not UTF-8 -------------------------------------------------------


@pytest.mark.parametrize("encoding", ["SQL_ASCII", "LATIN1"])
def test_a_database_that_is_not_utf8_is_refused_clearly(pg_admin_url, admin, encoding):
    """A database whose encoding cannot hold every value is refused at open with a
    StorageError that names the encoding and what to do; nothing is created in it."""
    name = f"enc_{encoding.lower()}_{os.getpid()}"
    admin.execute(f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' "
                  "TEMPLATE template0")
    try:
        url = pg_admin_url.rsplit("/", 1)[0] + "/" + name
        with pytest.raises(agentstate.StorageError) as e:
            agentstate.open(url)
        assert encoding in str(e.value) and "UTF8" in str(e.value)
        with psycopg.connect(url) as c:
            assert c.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
                             ).fetchone()[0] == 0
    finally:
        admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


# -- 27. a fork()ed child goes on using its parent's Database -------------------------------


def _backends(admin) -> set[int]:
    return {r[0] for r in admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'").fetchall()}


def test_a_forked_child_uses_its_parent_s_database(db, admin):
    """A fork()ed child may go on using its parent's Database: it opens connections of
    its own and sends nothing on the parent's; both write afterwards."""
    s = db.scope("app", "a")
    s.put("parent", 1)
    assert db.watch(db.last_change(), timeout=0.01) == []  # an idle watcher's connection too
    parents = _backends(admin) - {admin.info.backend_pid}
    pid = os.fork()
    if pid == 0:  # the child: exits without running the parent's test code
        code = 1
        try:
            assert s.get("parent") == 1
            s.put("child", 2)
            with db.transaction():
                s.append("both", ["child"])
            db.close()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert parents <= _backends(admin)  # the child closed none of the parent's connections
    assert s.get("child") == 2
    s.append("both", ["parent"])
    assert s.slice("both") == ["child", "parent"]


def _child_writes(db, n):
    db.scope("app", "a").put(f"child{n}", n)


def test_children_of_the_fork_context_use_the_parent_s_database(db):
    """multiprocessing's fork children write with the parent's Database, as the parent does."""
    db.scope("app", "a").put("parent", 0)
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_child_writes, args=(db, n)) for n in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(WAIT)
        assert p.exitcode == 0
    db.scope("app", "a").put("parent", 3)
    assert [db.scope("app", "a").get(k) for k in ("parent", "child1", "child2")] == [3, 1, 2]


FORK_SCRIPT = """
import os, sys
import agentstate
db = agentstate.open(sys.argv[1])
s = db.scope("app", "a")
s.put("before", 1)
assert db.watch(db.last_change(), timeout=0.01) == []  # an idle watcher's connection too
mine = {r[0] for r in db._store.query(
    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'")}
pid = os.fork()
if pid == 0:
    s.put("child", 1)
    sys.exit(0)  # a normal exit: the interpreter's clean-up runs in the child
assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
s.put("after", 1)
now = {r[0] for r in db._store.query(
    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'")}
print(sorted(mine - now))
"""


def test_a_forked_child_s_exit_closes_none_of_the_parent_s_connections(pg_url, tmp_path):
    """A child that exits normally (its interpreter cleans up) leaves every connection of
    the parent's open: nothing was sent on them."""
    import subprocess
    import sys

    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    done = subprocess.run([sys.executable, str(script), pg_url], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]"]  # none of the parent's connections went
    with agentstate.open(pg_url) as db:
        s = db.scope("app", "a")
        assert [s.get(k) for k in ("before", "child", "after")] == [1, 1, 1]


# -- the schema version: a store of the previous version is upgraded ------------------------


V1 = (Path(__file__).parent / "fixtures" / "schema_postgres_v1.sql").read_text()


def _definitions(url: str) -> dict[str, str]:
    with psycopg.connect(url) as c:
        funcs = c.execute(
            "SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')', "
            "pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.pronamespace = current_schema()::regnamespace"
        ).fetchall()
        views = c.execute("SELECT viewname, definition FROM pg_views WHERE schemaname = current_schema()"
                          ).fetchall()
        tables = c.execute(
            "SELECT table_name || '.' || column_name, data_type FROM information_schema.columns "
            "WHERE table_schema = current_schema()").fetchall()
    schema = url.rsplit("%3D", 1)[1]
    return {k: v.replace(schema, "S") for k, v in [*funcs, *views, *tables]}


def test_a_version_1_store_is_upgraded_in_one_transaction(pg_admin_url):
    """A store made by the previous version is upgraded when opened: its functions and views
    become exactly a new store's, and every value is kept."""
    old_url = pgserver.schema_url(pg_admin_url, pgserver.new_schema(pg_admin_url))
    new_url = pgserver.schema_url(pg_admin_url, pgserver.new_schema(pg_admin_url))
    with psycopg.connect(old_url, autocommit=True) as c:
        c.execute(V1)
        c.execute("SELECT kv_put('app', 'a', 'k', 'json', '{\"x\":1}', NULL, 7, NULL, NULL, NULL, false)")
        c.execute("SELECT kv_delete('app', 'a', 'k', NULL)")
        c.execute("SELECT kv_append('app', 'a', 'l', ARRAY['1', '2'], 5, NULL)")
    agentstate.open(new_url).close()
    with agentstate.open(old_url, busy_timeout=WAIT) as db:
        s = db.scope("app", "a")
        assert s.slice("l") == [1, 2] and s.put("k", 2) == 3  # above the deleted version
        assert db.check() == []
    assert _definitions(old_url) == _definitions(new_url)
    with psycopg.connect(old_url) as c:
        assert c.execute("SELECT version FROM agentstate_version").fetchone()[0] == pgstore.SCHEMA_VERSION
