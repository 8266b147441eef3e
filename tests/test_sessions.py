"""Sessions and turns (SPEC §4): ownership, one turn at a time, leases, the diagram."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

import agentstate
from agentstate import (Forbidden, InvalidKey, InvalidTransition, NotFound, Principal,
                        SessionBusy)

from . import workers
from .conftest import RawSQL, digest, on_postgres, target

ALICE, BOB, ADMIN = Principal("alice"), Principal("bob"), Principal("ops", admin=True)


@pytest.fixture
def db(any_db):
    """Every test here runs on both backends: an SQLite file and a PostgreSQL schema."""
    return any_db


def lapse(db, turn_id: str) -> None:
    """End a turn's lease by hand, as a crashed holder would leave it."""
    zero = "to_timestamp(0)" if on_postgres(db) else "0"  # a timestamptz there, unix seconds here
    with RawSQL(db) as c:
        c.execute(f"UPDATE turn SET lease_until = {zero} WHERE id = ?", (turn_id,))


def test_create_get_list(db):
    s = db.sessions.create(ALICE, metadata={"channel": "web"})
    assert s.owner == "alice" and s.metadata == {"channel": "web"}
    assert s.created_at.tzinfo is not None
    assert db.sessions.get(s.id, ALICE) == s
    assert db.sessions.get(s.id, ADMIN) == s
    b = db.sessions.create(BOB)
    assert [x.id for x in db.sessions.list(ALICE)] == [s.id]
    assert [x.id for x in db.sessions.list(BOB)] == [b.id]
    assert {x.id for x in db.sessions.list(ADMIN)} == {s.id, b.id}


def pages(read, size: int) -> list[list[str]]:
    """Every page of a paged list, following ``after`` from each page's last id."""
    out, after = [], None
    while True:
        page = [x.id for x in read(after=after, limit=size)]
        out.append(page)
        if len(page) < size:
            return out
        after = page[-1]


def test_session_and_turn_lists_are_paged(db):
    mine = [db.sessions.create(ALICE).id for _ in range(7)]
    theirs = [db.sessions.create(BOB).id for _ in range(3)]
    everything = [x.id for x in db.sessions.list(ALICE)]
    assert sorted(everything) == sorted(mine)
    got = pages(lambda **kw: db.sessions.list(ALICE, **kw), 3)
    assert [len(p) for p in got] == [3, 3, 1] and sum(got, []) == everything
    admin = [x.id for x in db.sessions.list(ADMIN)]
    assert sorted(admin) == sorted(mine + theirs) and sum(pages(
        lambda **kw: db.sessions.list(ADMIN, **kw), 4), []) == admin
    assert db.sessions.list(ALICE, limit=0) == []
    with pytest.raises(NotFound):  # another's session is no place to continue from
        db.sessions.list(ALICE, after=theirs[0])
    with pytest.raises(agentstate.InvalidValue):
        db.sessions.list(ALICE, limit=-1)

    sid = mine[0]
    turns = []
    for i in range(5):
        t = db.sessions.start_turn(sid, ALICE, input=i)
        t.finish(i)
        turns.append(t.id)
    assert [t.id for t in db.sessions.turns(sid, ALICE)] == turns[::-1]
    assert pages(lambda **kw: db.sessions.turns(sid, ALICE, **kw), 2) == \
        [turns[4:2:-1], turns[2:0:-1], turns[:1]]
    other = db.sessions.start_turn(mine[1], ALICE).id
    with pytest.raises(NotFound):  # a turn of another session
        db.sessions.turns(sid, ALICE, after=other)
    with pytest.raises(NotFound):
        db.sessions.turns(theirs[0], ALICE, limit=1)


def test_turns_by_status_across_sessions(db):
    def turn(owner, lease=600.0):
        return db.sessions.start_turn(db.sessions.create(owner).id, owner, lease=lease)

    running = [turn(ALICE).id, turn(BOB).id]
    held = [turn(ALICE).hold({"q": i}).id for i in range(3)] + [turn(BOB).hold().id]
    decided = turn(ALICE).hold()
    decided = db.sessions.decide(decided.id, ALICE, {"ok": True}).id
    lapsed = [turn(ALICE, lease=0.05).id, turn(BOB, lease=0.05).id]
    done = turn(ALICE)
    done.finish()
    time.sleep(0.3)
    find = db.sessions.turns_by_status
    assert {t.id for t in find(ADMIN, "running")} == set(running)
    assert {t.id for t in find(ALICE, "running")} == {running[0]}
    assert {t.id for t in find(ADMIN, "held")} == set(held)
    assert [t.status for t in find(ALICE, "held")] == ["held"] * 3
    assert [t.id for t in find(ALICE, "decided")] == [decided]
    assert {t.id for t in find(ADMIN, "expired")} == set(lapsed)
    assert [t.status for t in find(BOB, "expired")] == ["expired"]
    both = find(ADMIN, ["held", "expired"])
    assert {t.id for t in both} == set(held + lapsed)
    assert [t.created_at for t in both] == sorted((t.created_at for t in both), reverse=True)
    assert {t.id for t in find(ADMIN)} == set(running + held + [decided] + lapsed)  # all open ones
    assert sum(pages(lambda **kw: find(ADMIN, ["held", "expired"], **kw), 2), []) == [t.id for t in both]
    assert sum(pages(lambda **kw: find(ADMIN, "held", **kw), 3), []) == [t.id for t in find(ADMIN, "held")]
    for bad in ("finished", "failed", "", "HELD", ["held", "nope"], [], 3, None):
        with pytest.raises(agentstate.InvalidValue):
            find(ADMIN, bad)
    with pytest.raises(NotFound) as theirs:  # bob's turn is no place for alice to continue from
        find(ALICE, "held", after=held[-1])
    with pytest.raises(NotFound) as unknown:
        find(ALICE, "held", after="t-nope")
    assert str(theirs.value) == str(unknown.value).replace("t-nope", held[-1])  # says no more


def test_turns_by_status_pages_keep_their_place_and_list_settled_expired_turns(db):
    s = [db.sessions.create(ALICE).id for _ in range(6)]
    turns = [db.sessions.start_turn(sid, ALICE, lease=600) for sid in s]
    first = db.sessions.turns_by_status(ALICE, "running", limit=3)
    for t in turns:  # every turn heartbeats between the pages (its updated_at moves)
        t.heartbeat()
    rest = db.sessions.turns_by_status(ALICE, "running", after=first[-1].id)
    assert [t.id for t in first + rest] == [t.id for t in reversed(turns)]
    lost = db.sessions.start_turn(db.sessions.create(ALICE).id, ALICE, lease=0.05)
    time.sleep(0.2)
    assert [t.id for t in db.sessions.turns_by_status(ALICE, "expired")] == [lost.id]
    db.sessions.start_turn(lost.session_id, ALICE)  # marks the lapsed turn expired in storage
    assert db.sessions.get_turn(lost.id, ALICE).status == "expired"
    assert [t.id for t in db.sessions.turns_by_status(ALICE, "expired")] == [lost.id]
    both = db.sessions.turns_by_status(ALICE, ["running", "expired"])
    assert len({t.id for t in both}) == len(both) == 8


def test_principal_names_follow_key_rules():
    for bad in ("", "a b", "x" * 201, "é", 3):
        with pytest.raises(InvalidKey):
            Principal(bad)
    assert Principal("a:b.c-d_e").admin is False


def test_someone_elses_session_does_not_exist(db):
    """Every method answers NotFound for another's session, exactly as for an unknown id."""
    s = db.sessions.create(ALICE)
    t = db.sessions.start_turn(s.id, ALICE)
    t.hold({"q": 1})
    calls = {
        "get": lambda sid, tid: db.sessions.get(sid, BOB),
        "state": lambda sid, tid: db.sessions.state(sid, BOB),
        "turns": lambda sid, tid: db.sessions.turns(sid, BOB),
        "start_turn": lambda sid, tid: db.sessions.start_turn(sid, BOB),
        "delete": lambda sid, tid: db.sessions.delete(sid, BOB),
        "release": lambda sid, tid: db.sessions.release(sid, BOB),
        "get_turn": lambda sid, tid: db.sessions.get_turn(tid, BOB),
        "decide": lambda sid, tid: db.sessions.decide(tid, BOB, "yes"),
        "resume": lambda sid, tid: db.sessions.resume(tid, BOB),
    }
    for name, call in calls.items():
        with pytest.raises(NotFound) as other:
            call(s.id, t.id)
        with pytest.raises(NotFound) as unknown:
            call("s-unknown", "t-unknown")
        assert type(other.value) is type(unknown.value), name
        assert str(other.value).replace(s.id, "X").replace(t.id, "X") == \
            str(unknown.value).replace("s-unknown", "X").replace("t-unknown", "X"), name
    assert db.sessions.get_turn(t.id, ALICE).status == "held"


def test_admin_uses_every_session(db):
    s = db.sessions.create(ALICE)
    with db.sessions.turn(s.id, ADMIN, input="from admin") as t:
        db.sessions.state(s.id, ADMIN).put("k", 1)
    assert db.sessions.get_turn(t.id, ALICE).status == "finished"
    assert db.sessions.state(s.id, ALICE).get("k") == 1


def test_one_turn_at_a_time_and_held_or_resuming_do_not_block(db):
    s = db.sessions.create(ALICE)
    t1 = db.sessions.start_turn(s.id, ALICE, input={"m": 1})
    with pytest.raises(SessionBusy) as e:
        db.sessions.start_turn(s.id, ALICE)
    assert e.value.turn_id == t1.id and e.value.code == "session_busy"
    t1.hold({"approve?": True})
    t2 = db.sessions.start_turn(s.id, ALICE, queued=True)
    assert t2.status == "queued"
    with pytest.raises(SessionBusy) as e:
        db.sessions.start_turn(s.id, ALICE)
    assert e.value.turn_id == t2.id
    t2.start()
    decided = db.sessions.decide(t1.id, ALICE, {"ok": True})
    assert decided.status == "decided" and decided.decision == {"ok": True}
    resumed = db.sessions.resume(t1.id, ALICE)  # while t2 runs
    assert resumed.status == "resuming"
    t2.finish({"done": 2})
    t3 = db.sessions.start_turn(s.id, ALICE)  # a resuming turn does not block
    resumed.finish("r1")
    t3.fail(RuntimeError("boom"))
    got = {t.id: t for t in db.sessions.turns(s.id, ALICE)}
    assert [t.n for t in db.sessions.turns(s.id, ALICE)] == [3, 2, 1]
    assert got[t1.id].status == "finished" and got[t1.id].result == "r1"
    assert got[t1.id].request == {"approve?": True} and got[t1.id].input == {"m": 1}
    assert got[t2.id].result == {"done": 2}
    assert got[t3.id].status == "failed" and "boom" in got[t3.id].error


@pytest.mark.parametrize("setup,move", [
    ("held", lambda t, db: t.finish()),
    ("held", lambda t, db: t.hold()),
    ("held", lambda t, db: db.sessions.resume(t.id, ALICE)),
    ("running", lambda t, db: db.sessions.decide(t.id, ALICE, "x")),
    ("running", lambda t, db: db.sessions.resume(t.id, ALICE)),
    ("running", lambda t, db: t.start()),
    ("finished", lambda t, db: t.fail("x")),
    ("finished", lambda t, db: t.finish()),
    ("finished", lambda t, db: t.heartbeat()),
    ("finished", lambda t, db: db.sessions.decide(t.id, ALICE, "x")),
    ("decided", lambda t, db: db.sessions.decide(t.id, ALICE, "again")),
    ("decided", lambda t, db: t.finish()),
    ("queued", lambda t, db: t.finish()),
    ("queued", lambda t, db: t.hold()),
])
def test_moves_outside_the_diagram_change_nothing(db, setup, move):
    s = db.sessions.create(ALICE)
    t = db.sessions.start_turn(s.id, ALICE, queued=setup == "queued")
    if setup in ("held", "decided"):
        t.hold()
    if setup == "decided":
        db.sessions.decide(t.id, ALICE, "d")
    if setup == "finished":
        t.finish()
    before = digest(db)
    with pytest.raises(InvalidTransition):
        move(t, db)
    assert digest(db) == before
    assert db.sessions.get_turn(t.id, ALICE).status == setup


def test_turn_context_manager(db):
    s = db.sessions.create(ALICE)
    with db.sessions.turn(s.id, ALICE, input={"m": "hi"}) as t:
        assert t.status == "running"
    assert db.sessions.get_turn(t.id, ALICE).status == "finished"
    with pytest.raises(KeyError):
        with db.sessions.turn(s.id, ALICE) as t2:
            raise KeyError("lost")
    got = db.sessions.get_turn(t2.id, ALICE)
    assert got.status == "failed" and "lost" in got.error
    with db.sessions.turn(s.id, ALICE) as t3:
        t3.hold("wait")
    assert db.sessions.get_turn(t3.id, ALICE).status == "held"


def test_lapsed_lease_frees_the_session_and_reads_expired(db):
    s = db.sessions.create(ALICE)
    t = db.sessions.start_turn(s.id, ALICE, lease=30)  # long: a loaded machine is slow
    with pytest.raises(SessionBusy):
        db.sessions.start_turn(s.id, ALICE)
    t.heartbeat(0.3)  # now let it lapse
    time.sleep(0.35)
    assert db.sessions.get_turn(t.id, ALICE).status == "expired"
    t2 = db.sessions.start_turn(s.id, ALICE)
    with pytest.raises(InvalidTransition):
        t.finish()
    with pytest.raises(InvalidTransition):
        t.heartbeat()
    t2.finish()
    assert db.sessions.get_turn(t.id, ALICE).status == "expired"


def test_release_is_for_admins(db):
    s = db.sessions.create(ALICE)
    t = db.sessions.start_turn(s.id, ALICE)
    with pytest.raises(Forbidden):
        db.sessions.release(s.id, ALICE)
    released = db.sessions.release(s.id, ADMIN)
    assert released.id == t.id and released.status == "failed"
    assert "released" in db.sessions.get_turn(t.id, ALICE).error
    with pytest.raises(InvalidTransition):
        db.sessions.release(s.id, ADMIN)
    db.sessions.start_turn(s.id, ALICE)


def test_delete_removes_session_turns_and_state(db):
    db.set_setting("history_retention", 0)  # else its list is kept for the past (test_history.py)
    s = db.sessions.create(ALICE)
    other = db.sessions.create(ALICE)
    t = db.sessions.start_turn(s.id, ALICE)
    db.sessions.state(s.id, ALICE).append("history", [1, 2])
    db.sessions.state(other.id, ALICE).put("keep", 1)
    db.sessions.delete(s.id, ALICE)
    with pytest.raises(NotFound):
        db.sessions.get(s.id, ALICE)
    with pytest.raises(NotFound):
        db.sessions.get_turn(t.id, ALICE)
    assert db.scope("session", s.id).list() == []
    assert db._store.query("SELECT count(*) FROM list_item")[0][0] == 0
    assert db._store.query("SELECT count(*) FROM turn")[0][0] == 0
    assert db.scope("session", other.id).get("keep") == 1


def test_database_enforces_one_active_turn_for_any_writer(db):
    """The partial unique index refuses a second active turn from the sqlite3 shell or psql."""
    s = db.sessions.create(ALICE)
    t = db.sessions.start_turn(s.id, ALICE)
    now = "now()" if on_postgres(db) else "''"
    with RawSQL(db) as c:
        with pytest.raises(c.refused):
            c.execute("INSERT INTO turn (id, session_id, n, status, created_at, updated_at) "
                      f"VALUES ('x', ?, 99, 'running', {now}, {now})", (s.id,))
    t.finish()


def test_eight_processes_race_start_turn(db):
    """8 processes x 15 rounds: exactly one wins each round; the rest are told its turn id."""
    sid = db.sessions.create(ALICE).id
    ctx = mp.get_context("spawn")
    rounds, n = 15, 8
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=workers.turn_racer, args=(target(db), sid, rounds, barrier, results))
             for _ in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=300) for _ in range(rounds * n)]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    for r in range(rounds):
        this = [x for x in got if x[0] == r]
        winners = [x[2] for x in this if x[1] == "won"]
        assert len(winners) == 1, this
        assert all(x[1] == "busy" and x[2] == winners[0] for x in this if x[1] != "won"), this


@pytest.mark.slow_on_postgres  # PostgreSQL's case in CI's -m slow (seconds)
def test_killed_process_turn_expires_and_frees_the_session(db):
    """SIGKILL a process mid-turn: once its lease lapses another process starts a turn."""
    sid = db.sessions.create(ALICE).id
    ctx = mp.get_context("spawn")
    ready = ctx.Queue()
    p = ctx.Process(target=workers.hold_turn_forever, args=(target(db), sid, ready))
    p.start()
    dead_turn = ready.get(timeout=120)
    time.sleep(0.5)
    os.kill(p.pid, signal.SIGKILL)
    p.join(30)
    with pytest.raises(SessionBusy) as e:
        db.sessions.start_turn(sid, ALICE)
    assert e.value.turn_id == dead_turn
    deadline = time.monotonic() + 30
    while True:
        try:
            t = db.sessions.start_turn(sid, ALICE)
            break
        except SessionBusy:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert db.sessions.get_turn(dead_turn, ALICE).status == "expired"
    t.finish()
    assert db.check() == []  # on SQLite this includes PRAGMA integrity_check


class TurnModel(RuleBasedStateMachine):
    """start/hold/decide/resume/finish/fail/expire against a model of the diagram."""

    NEXT = {
        "start": {"queued": "running"},
        "hold": {"running": "held"},
        "decide": {"held": "decided"},
        "resume": {"decided": "resuming"},
        "finish": {"running": "finished", "resuming": "finished"},
        "fail": {"running": "failed", "resuming": "failed"},
        "expire": {"queued": "expired", "running": "expired", "resuming": "expired"},
    }

    store: agentstate.Database  # the store under test: set by test_turn_model

    @initialize()
    def setup(self):
        self.db = self.store
        self.sid = self.db.sessions.create(ALICE).id  # a new session per example
        self.turns: dict[str, tuple[agentstate.Turn, str]] = {}

    def active(self):
        return [tid for tid, (_, st_) in self.turns.items() if st_ in ("queued", "running")]

    @rule(queued=st.booleans())
    def start_turn(self, queued):
        act = self.active()
        if act:
            with pytest.raises(SessionBusy) as e:
                self.db.sessions.start_turn(self.sid, ALICE, queued=queued)
            assert e.value.turn_id == act[0]
        else:
            t = self.db.sessions.start_turn(self.sid, ALICE, queued=queued)
            self.turns[t.id] = (t, "queued" if queued else "running")

    @precondition(lambda self: self.turns)
    @rule(data=st.data(), action=st.sampled_from(sorted(NEXT)))
    def act(self, data, action):
        order = list(self.turns)  # creation order: ids are random, positions are not
        tid = order[data.draw(st.integers(0, len(order) - 1))]
        t, state = self.turns[tid]
        want = self.NEXT[action].get(state)
        calls = {
            "start": t.start, "hold": lambda: t.hold("r"), "finish": lambda: t.finish("ok"),
            "fail": lambda: t.fail("e"),
            "decide": lambda: self.db.sessions.decide(tid, ALICE, "d"),
            "resume": lambda: self.db.sessions.resume(tid, ALICE),
        }
        if action == "expire":
            if want:
                lapse(self.db, tid)
                self.turns[tid] = (t, want)
            return
        if want is None:
            with pytest.raises(InvalidTransition):
                calls[action]()
        else:
            calls[action]()
            self.turns[tid] = (t, want)

    @invariant()
    def matches(self):
        if not hasattr(self, "db"):
            return
        got = {t.id: t.status for t in self.db.sessions.turns(self.sid, ALICE)}
        assert got == {tid: s for tid, (_, s) in self.turns.items()}


@pytest.mark.slow_on_postgres  # PostgreSQL's case in CI's -m slow (seconds)
def test_turn_model(db):
    machine = type("TurnModelHere", (TurnModel,), {"store": db})
    run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=30,
                                                         deadline=None))
