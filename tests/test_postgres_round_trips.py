"""Round trips to PostgreSQL (issue 31): what the reads and batches of a transaction send.

A round trip to a server costs more than most statements (~0.1-0.3 ms on a local
socket, more across a network), so these counts are a promise the adapters rely on:
a read inside a write transaction is one round trip with its lock, and a batch of
writes is one round trip (with its BEGIN and COMMIT when it is a write of its own).
Counted as the queries this thread hands psycopg, not timed.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

import agentstate

from .test_postgres_defects import WAIT, started


@pytest.fixture
def db(pg_url):
    with agentstate.open(pg_url, busy_timeout=WAIT) as d:
        yield d


@pytest.fixture
def sent(monkeypatch):
    """The queries this thread sends from here on."""
    queries: list[str] = []
    me = threading.get_ident()
    real = psycopg.Connection.execute

    def execute(self, query, *args, **kwargs):
        if threading.get_ident() == me:
            queries.append(str(query))
        return real(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", execute)
    return queries


def test_a_read_of_an_absent_key_in_a_block_is_one_round_trip_with_its_lock(db, sent):
    s = db.scope("app", "a")
    s.put("there", 1)
    sent.clear()
    with db.transaction():
        assert s.get("absent") is None
        assert len(sent) == 1  # BEGIN, the key lock and the read
        assert s.get("there") == 1
        assert s.get_many(["there", "absent", "gone"]) == {
            "there": agentstate.Versioned(1, 1), "absent": agentstate.Versioned(None, 0),
            "gone": agentstate.Versioned(None, 0)}
        assert len(sent) == 3
    assert len(sent) == 4  # and the COMMIT


def test_a_batch_is_one_round_trip(db, sent):
    s = db.scope("app", "a")
    s.put("old", 1)
    sent.clear()
    with db.batch() as b:
        w = b.scope("app", "a")
        w.check("old", if_version=1)
        w.put("x", {"v": 1})
        w.put("y", "it's \\ é; -- not SQL")
        w.append("l", [1, 2])
        w.delete("old")
        w.put("z", 3, if_version=0)
        w.check("x", if_version=1)
    assert len(sent) == 1  # BEGIN, the checks and the five writes, COMMIT and the wake-up
    assert b.results == [1, 1, 1, agentstate.Appended(2, 1), True, 1, 1]
    assert (s.get("x"), s.get("y"), s.get("l"), s.get("old"), s.get("z")) == (
        {"v": 1}, "it's \\ é; -- not SQL", [1, 2], None, 3)
    ops = [(c.op, c.key) for c in db.changes(since=0)]
    assert ops[-5:] == [("put", "x"), ("put", "y"), ("append", "l"), ("delete", "old"), ("put", "z")]


def test_a_batch_inside_a_block_is_one_round_trip(db, sent):
    s = db.scope("app", "a")
    with db.transaction():
        s.get("a")
        before = len(sent)
        with db.batch() as b:
            for i in range(10):
                b.scope("app", "a").put(f"k{i}", i)
        assert len(sent) == before + 1
        assert s.get("k9") == 9
    assert [s.get(f"k{i}") for i in range(10)] == list(range(10))


def test_a_refused_batch_writes_nothing_and_the_connection_goes_on(db):
    s = db.scope("app", "a")
    s.put("taken", 1)
    with pytest.raises(agentstate.VersionConflict):
        with db.batch() as b:
            w = b.scope("app", "a")
            w.put("first", 1)
            w.put("taken", 2, if_version=0)
            w.put("after", 3)
    assert (s.get("first"), s.get("taken"), s.get("after")) == (None, 1, None)
    with db.transaction():  # a refusal inside a block undoes the batch, not the block
        s.put("kept", 1)
        with pytest.raises(agentstate.VersionConflict):
            with db.batch() as b:
                b.scope("app", "a").put("first", 1)
                b.scope("app", "a").put("taken", 2, if_version=0)
        s.put("kept2", 2)
    assert (s.get("kept"), s.get("kept2"), s.get("first")) == (1, 2, None)


def test_a_fenced_batch_of_several_writes_is_one_round_trip_and_all_or_none(db, sent):
    """The turn's check goes first in the batch's one round trip: a lapsed turn writes
    none of the batch (LeaseLost), the running turn all of it."""
    from .test_fence import taken_over

    s, old, new = taken_over(db)
    kv = db.scope("session", s.id)
    sent.clear()
    with pytest.raises(agentstate.LeaseLost):
        with db.batch(fence=old) as b:
            for i in range(3):
                b.scope("session", s.id).put(f"k{i}", i)
    assert len(sent) == 2 and sent[1] == "ROLLBACK"  # refused: the batch, then its ROLLBACK
    assert [kv.get(f"k{i}") for i in range(3)] == [None, None, None]
    sent.clear()
    with db.batch(fence=new) as b:
        for i in range(3):
            b.scope("session", s.id).put(f"k{i}", i)
    assert len(sent) == 1
    assert [kv.get(f"k{i}") for i in range(3)] == [0, 1, 2]


@pytest.mark.parametrize("read", ["get", "get_many"])
@pytest.mark.parametrize("existed", [False, True])
def test_a_key_that_expired_while_a_block_waited_for_its_lock_reads_absent(db, read, existed):
    """A read in a block is sent with its lock and waits for it: liveness is judged when
    the read starts, after the wait, not when the two statements arrived. (Found by
    review: the key read as live 0.5 s after it expired, and absent on a second read.)"""
    s = db.scope("app", "a")
    if existed:
        s.put("k", "old")
    written, release = threading.Event(), threading.Event()
    done: dict[str, float] = {}

    def writer():
        with db.transaction():
            s.put("k", "soon gone", ttl=0.2)
            done["expires"] = time.monotonic() + 0.2
            written.set()
            assert release.wait(WAIT)
            time.sleep(0.4)  # the key expires while the block still holds it
            done["committing"] = time.monotonic()

    w = started(writer)
    assert written.wait(WAIT)
    release.set()
    with db.transaction():
        got = s.get("k") if read == "get" else s.get_many(["k"])["k"].value
        done["read"] = time.monotonic()
        again = s.get("k")
    w.join_ok()
    assert done["read"] >= done["committing"] > done["expires"]  # it waited past the expiry
    assert (got, again) == (None, None)


def test_a_batch_sent_a_statement_at_a_time_is_still_all_or_none(db):
    """A parameter ``inline`` does not write as a literal (here a str subclass: no public
    call makes one today) sends the batch a statement at a time, in one transaction all the
    same (found by review: each committed on its own)."""

    class Key(str):
        pass

    s = db.scope("app", "a")
    s.put("taken", 1)
    ops = [("put", "app", "a", Key("k1"), ("json", "1", 1, None), {"if_version": None, "ttl": None}),
           ("put", "app", "a", "taken", ("json", "2", 1, None), {"if_version": 0, "ttl": None})]
    with pytest.raises(agentstate.VersionConflict):
        db._ops.apply_batch(ops)
    assert (s.get("k1"), s.get("taken")) == (None, 1)
    with pytest.raises(agentstate.VersionConflict, match="check app:a taken"):
        db._ops.apply_batch([ops[0], ("check", "app", "a", "taken", (), {"if_version": 2})])
    assert s.get("k1") is None
    assert db._ops.apply_batch([ops[0], ("check", "app", "a", "taken", (), {"if_version": 1})]) \
        == [1, 1] and s.get("k1") == 1


def test_a_batch_check_waits_for_a_writer_of_its_key_and_sees_its_commit(db):
    """A check locks its key and reads its version after the lock's wait (a snapshot of
    its own): a block that wrote the key meanwhile is seen once it commits."""
    s = db.scope("app", "a")
    s.put("k", 1)
    written, release = threading.Event(), threading.Event()

    def writer():
        with db.transaction():
            s.put("k", 2)
            written.set()
            assert release.wait(WAIT)
            time.sleep(0.3)

    w = started(writer)
    assert written.wait(WAIT)
    start = time.monotonic()  # before the release: the writer commits 0.3 s after it at least
    release.set()
    with db.batch() as b:
        b.scope("app", "a").check("k", if_version=2)
        b.scope("app", "a").put("after", 1)
    w.join_ok()
    assert time.monotonic() - start >= 0.2 and b.results == [2, 1]


def test_an_error_after_the_feed_s_numbering_is_raised(db):
    """The feed's numbering (BEGIN; feed_sequence(); COMMIT) is not joined with the read
    after it: the cursor drops an error that follows a COMMIT (meant for the wake-up after
    a write's COMMIT), so a failing read there would have returned nothing, silently."""
    from agentstate.backends.postgres.statements import READ, SEQUENCE, Conn, quiet_rollback

    store = db._ops.store
    raw = store._checkout()
    try:
        c = Conn(raw, READ, SEQUENCE)
        with pytest.raises(psycopg.errors.DivisionByZero):
            c.execute("SELECT 1 / %s", (0,))
    finally:
        quiet_rollback(raw)
        store._checkin(raw)

