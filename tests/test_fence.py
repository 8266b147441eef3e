"""Fenced writes (SPEC §14): a worker whose turn lost its lease writes nothing, on every backend."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest

import agentstate
from agentstate import InvalidTransition, LeaseLost

from . import callworkers
from .conftest import digest, target


@pytest.fixture
def db(any_db):
    """SQLite and PostgreSQL (tests/test_remote.py runs these through connect() too)."""
    return any_db


ALICE = agentstate.Principal("alice")


def taken_over(db, lease: float = 0.05):
    """A session whose first turn lapsed and whose second turn now runs: (session, old, new)."""
    s = db.sessions.create(ALICE)
    old = db.sessions.start_turn(s.id, ALICE, lease=lease)
    time.sleep(lease + 0.05)
    new = db.sessions.start_turn(s.id, ALICE)
    return s, old, new


def every_write(db, sid: str, fence):
    """One of each fenced write, by name: scope writes, a run write, a claim."""
    kv = db.scope("session", sid)
    return {
        "put": lambda: kv.put("k", "stale", fence=fence),
        "put_bytes": lambda: kv.put_bytes("b", b"stale", fence=fence),
        "delete": lambda: kv.delete("k", fence=fence),
        "append": lambda: kv.append("log", ["stale"], fence=fence),
        "pop": lambda: kv.pop("log", fence=fence),
        "update": lambda: kv.update("n", lambda v: v + 1, default=0, fence=fence),
        "touch": lambda: kv.touch("k", 60, fence=fence),
        "run write": lambda: db.runs.write("run", [{"seq": 2}], None, fence=fence),
        "claim": lambda: db.runs.claim("run", "c", fence=fence),
        "settle": lambda: db.runs.settle("run", "open", result=1, fence=fence),
        "scope": lambda: db.scope("session", sid, fence=fence).put("k", "stale"),
        "state": lambda: db.state(session=sid, fence=fence).session.append("log", [1]),
        "batch": lambda: _batch(db, sid, fence),
        "batch of checks": lambda: _checks(db, sid, fence),
    }


def _batch(db, sid, fence):
    with db.batch(fence=fence) as b:
        b.scope("session", sid).put("k", "stale")


def _checks(db, sid, fence):
    """Writes nothing, but is fenced all the same: a lapsed lease is LeaseLost."""
    with db.batch(fence=fence) as b:
        b.scope("session", sid).check("absent", if_version=0)


def seed(db, sid):
    kv = db.scope("session", sid)
    kv.put("k", "v")
    kv.append("log", [1, 2])
    db.runs.write("run", [{"seq": 0}], None, create=True)
    db.runs.claim("run", "open")


def test_a_turn_that_lost_its_session_writes_nothing(db):
    """Every fenced write by a worker whose turn lapsed and was taken over: LeaseLost
    naming the turn, and the store is byte for byte as before."""
    s, old, new = taken_over(db)
    seed(db, s.id)
    before = digest(db)
    for name, write in every_write(db, s.id, old).items():
        with pytest.raises(LeaseLost) as e:
            write()
        assert e.value.turn_id == old.id and e.value.code == "lease_lost", name
    assert digest(db) == before


def test_the_running_turn_writes(db):
    """The same writes fenced by the turn that holds the session land."""
    s, _old, new = taken_over(db)
    seed(db, s.id)
    for _name, write in every_write(db, s.id, new).items():
        write()
    kv = db.scope("session", s.id)
    assert kv.get("k") == "stale" and kv.get("n") == 1


def test_a_lapsed_lease_or_an_unknown_turn_is_lease_lost(db):
    """Nobody took over, but the lease lapsed: LeaseLost too; so is a turn id that names
    no turn, and a turn that finished."""
    s = db.sessions.create(ALICE)
    t = db.sessions.start_turn(s.id, ALICE, lease=0.05)
    time.sleep(0.1)
    kv = db.scope("session", s.id)
    for fence in (t, t.id, "t-nobody"):
        with pytest.raises(LeaseLost):
            kv.put("k", 1, fence=fence)
    done = db.sessions.start_turn(s.id, ALICE)
    done.finish()
    with pytest.raises(LeaseLost):
        kv.put("k", 1, fence=done)
    assert kv.get("k") is None


def test_a_fenced_write_fails_its_whole_transaction(db):
    """A fenced write inside transaction() raises and the block rolls back: the plain
    writes before it in the block are gone too."""
    s, old, _new = taken_over(db)
    before = digest(db)
    with pytest.raises(LeaseLost):
        with db.transaction():
            db.scope("app", "a").put("plain", 1)
            db.scope("session", s.id).put("k", 1, fence=old)
    assert digest(db) == before


def test_a_caught_lease_lost_still_dooms_its_transaction(db):
    """A fenced write that fails with LeaseLost inside transaction() dooms the block even if
    the exception is caught (SPEC §16): the block ends with LeaseLost and writes nothing
    (the plain writes before and after the caught one committed)."""
    s, old, _new = taken_over(db)
    before = digest(db)
    with pytest.raises(LeaseLost) as e:
        with db.transaction():
            db.scope("app", "a").put("before", 1)
            with db.transaction():  # a nested block: the outermost one is doomed
                try:
                    db.scope("session", s.id).put("k", 1, fence=old)
                except LeaseLost:
                    pass
            db.scope("app", "a").put("after", 1)
    assert e.value.turn_id == old.id
    assert digest(db) == before
    with db.transaction():  # the next block is not doomed
        db.scope("app", "a").put("next", 1)
    assert db.scope("app", "a").get("next") == 1 and db.scope("app", "a").get("before") is None


def test_a_call_s_fence_replaces_the_scope_s(db):
    """fence= on a call of a fenced scope replaces the scope's fence for that call (SPEC
    §16): a scope fenced by a lapsed turn writes with a live turn's fence, and a scope fenced
    by the live turn does not write with the lapsed one's."""
    s, old, new = taken_over(db)
    stale, fresh = db.scope("session", s.id, fence=old), db.scope("session", s.id, fence=new)
    assert stale.put("k", 1, fence=new) == 1
    assert stale.append("l", [1], fence=new).length == 1
    before = digest(db)
    with pytest.raises(LeaseLost) as e:
        fresh.put("k", 2, fence=old)
    assert e.value.turn_id == old.id and digest(db) == before
    with pytest.raises(LeaseLost):
        stale.put("k", 3)


def test_a_lapsed_turn_cannot_move_once_another_started(db):
    """heartbeat, hold and finish of the lapsed turn after the takeover: InvalidTransition."""
    s, old, _new = taken_over(db)
    for move in (old.heartbeat, old.hold, old.finish):
        with pytest.raises(InvalidTransition):
            move()


def test_bad_fences_are_refused_before_anything(db):
    """A fence that is neither a Turn nor a turn id: InvalidValue or InvalidKey."""
    kv = db.scope("app", "a")
    for bad in (1, b"t", ["t"]):
        with pytest.raises(agentstate.InvalidValue):
            kv.put("k", 1, fence=bad)
    with pytest.raises(agentstate.InvalidKey):
        kv.put("k", 1, fence="bad id!")


def test_a_worker_stopped_past_its_lease_writes_nothing_after_a_takeover(db):
    """A real worker process writes fenced by its turn, is stopped (SIGSTOP) past its
    lease, another worker takes the session over and writes; continued (SIGCONT), every
    write it tries is LeaseLost and the new owner's state stands."""
    s = db.sessions.create(agentstate.Principal("worker"))
    db.runs.write("shared", [], None, create=True)
    ctx = mp.get_context("spawn")
    ready, resume, results = ctx.Event(), ctx.Event(), ctx.Queue()
    worker = ctx.Process(target=callworkers.fenced_worker,
                         args=(getattr(db, "callworker_target", None) or target(db), s.id, 0.5,
                               ready, resume, results))
    worker.start()
    try:
        deadline = time.monotonic() + 300
        while not ready.wait(0.2):  # or the worker's failure, at once
            assert worker.is_alive() and time.monotonic() < deadline, results.get(timeout=5)
        os.kill(worker.pid, signal.SIGSTOP)
        time.sleep(0.7)
        p = agentstate.Principal("worker")
        new = db.sessions.start_turn(s.id, p)
        db.state(session=s.id, fence=new).session.put("owner", "second")
        os.kill(worker.pid, signal.SIGCONT)  # first: a stopped waiter would block set()
        resume.set()
        outcome = results.get(timeout=120)
    finally:
        os.kill(worker.pid, signal.SIGCONT)
        worker.join(60)
    assert worker.exitcode == 0
    assert set(outcome.values()) == {"lease_lost"}, outcome
    kv = db.scope("session", s.id)
    assert kv.get("owner") == "second" and kv.get("log") is None and kv.get("n") is None
    assert db.runs.head("r") is None and db.runs.read("shared").entries == []
