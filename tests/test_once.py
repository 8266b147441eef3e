"""Tool calls that run at most once (SPEC §14): claim, settle, once, on every backend."""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time

import pytest

import agentstate
from agentstate import (NOT_RUN, CallFailed, CallInProgress, InDoubt, InvalidTransition,
                        InvalidValue, LeaseLost, RunNotFound, TooLarge, UsageError)

from . import callworkers
from .conftest import digest, target


@pytest.fixture
def db(any_db):
    """SQLite and PostgreSQL (tests/test_remote.py runs these through connect() too)."""
    return any_db


@pytest.fixture
def run(db):
    db.runs.write("r", [], None, create=True)
    return "r"


def test_a_call_runs_once_and_its_result_is_returned_after(db, run):
    """once() runs fn once; a later once() of the same call id returns the recorded
    result without calling anything; the claim and the result are ordinary entries."""
    calls = []
    assert db.runs.once(run, "c1", lambda: calls.append(1) or {"id": "ch_1"},
                        call={"name": "charge", "args": {"cents": 500}}) == {"id": "ch_1"}
    assert db.runs.once(run, "c1", lambda: calls.append(1) or {"id": "ch_2"}) == {"id": "ch_1"}
    assert calls == [1]
    claim, result = db.runs.read(run).entries
    assert claim["type"] == "tool_call" and claim["call_id"] == "c1" and claim["seq"] == 0
    assert claim["name"] == "charge" and claim["args"] == {"cents": 500}
    assert claim["fence"] is None and claim["lease"] == 300.0 and isinstance(claim["at"], str)
    assert result == {"seq": 1, "type": "tool_result", "call_id": "c1", "status": "ok",
                      "result": {"id": "ch_1"}}
    assert db.runs.load(run).entries == [claim, result]  # paired: nothing synthetic


def test_an_error_is_recorded_and_raised_again_without_a_second_run(db, run):
    """fn's exception propagates and its text is recorded; later: CallFailed, no call."""
    calls = []

    def fail():
        calls.append(1)
        raise RuntimeError("card declined")

    with pytest.raises(RuntimeError, match="card declined"):
        db.runs.once(run, "c1", fail)
    with pytest.raises(CallFailed) as e:
        db.runs.once(run, "c1", fail)
    assert e.value.call_id == "c1" and e.value.error == "RuntimeError: card declined"
    assert e.value.code == "call_failed" and e.value.status == 409
    assert calls == [1]
    assert db.runs.read(run).entries[-1]["status"] == "error"


def test_a_live_claim_is_in_progress_and_a_lapsed_one_in_doubt(db, run):
    """Another worker's claim within its lease: CallInProgress; after it: InDoubt with the
    claim's time, and fn is not called either way."""
    assert db.runs.claim(run, "c1", lease=0.3).status == "claimed"
    calls = []
    with pytest.raises(CallInProgress) as e:
        db.runs.once(run, "c1", lambda: calls.append(1))
    assert e.value.call_id == "c1"
    time.sleep(0.4)
    with pytest.raises(InDoubt) as e:
        db.runs.once(run, "c1", lambda: calls.append(1))
    assert e.value.call_id == "c1" and e.value.at == db.runs.read(run).entries[0]["at"]
    assert calls == [] and db.runs.claim(run, "c1").status == "in_doubt"


def test_reconcile_settles_a_call_in_doubt(db, run):
    """reconcile's result is recorded and returned; NOT_RUN runs fn under a new claim
    with "retry": 1; an error from reconcile records nothing and propagates."""
    db.runs.claim(run, "found", lease=0.01)
    db.runs.claim(run, "lost", lease=0.01)
    db.runs.claim(run, "unsure", lease=0.01)
    time.sleep(0.05)
    seen = []
    assert db.runs.once(run, "found", lambda: "ran",
                        reconcile=lambda cid, entry: seen.append(entry) or "ch_9") == "ch_9"
    assert seen[0]["call_id"] == "found" and seen[0]["type"] == "tool_call"
    assert db.runs.once(run, "found", lambda: "ran") == "ch_9"
    assert db.runs.once(run, "lost", lambda: "ran", reconcile=lambda cid, e: NOT_RUN) == "ran"
    retry = [e for e in db.runs.read(run).entries if e["call_id"] == "lost"][1]
    assert retry["type"] == "tool_call" and retry["retry"] == 1
    before = digest(db)

    def broken(cid, entry):
        raise ConnectionError("provider down")

    with pytest.raises(ConnectionError):
        db.runs.once(run, "unsure", lambda: "ran", reconcile=broken)
    assert digest(db) == before


def test_a_fenced_claim_lives_as_long_as_its_turn(db, run):
    """A claim made under a fence is in progress while the turn holds its lease, in doubt
    once it lapsed, whatever the claim's own lease."""
    p = agentstate.Principal("alice")
    s = db.sessions.create(p)
    turn = db.sessions.start_turn(s.id, p, lease=0.3)
    c = db.runs.claim(run, "c1", fence=turn, lease=1000)
    assert c.status == "claimed" and c.entry["fence"] == turn.id
    assert db.runs.claim(run, "c1").status == "in_progress"
    time.sleep(0.4)
    assert db.runs.claim(run, "c1").status == "in_doubt"


def test_a_lapsed_fence_claims_nothing(db, run):
    """claim, settle and once with a fence that no longer holds its lease (or names no
    turn): LeaseLost before anything is appended, and fn never runs."""
    p = agentstate.Principal("alice")
    s = db.sessions.create(p)
    turn = db.sessions.start_turn(s.id, p, lease=0.05)
    time.sleep(0.1)
    before = digest(db)
    for fence in (turn, turn.id, "t-no-such-turn"):
        with pytest.raises(LeaseLost) as e:
            db.runs.once(run, "c1", lambda: pytest.fail("ran"), fence=fence)
        assert e.value.turn_id == getattr(fence, "id", fence)
        with pytest.raises(LeaseLost):
            db.runs.claim(run, "c1", fence=fence)
    assert digest(db) == before


def test_settle_needs_an_open_claim(db, run):
    """settle of a call never claimed, or settled already: InvalidTransition, nothing written."""
    before = digest(db)
    with pytest.raises(InvalidTransition):
        db.runs.settle(run, "c1", result=1)
    assert digest(db) == before
    db.runs.claim(run, "c1")
    db.runs.settle(run, "c1", error="it broke")
    with pytest.raises(InvalidTransition):
        db.runs.settle(run, "c1", result=1)
    assert db.runs.claim(run, "c1") == agentstate.Claim("failed", None, "it broke",
                                                        db.runs.read(run).entries[-1])


def test_missing_runs_and_bad_input_change_nothing(db, run):
    """RunNotFound for a missing run; InvalidKey for a bad call id; InvalidValue for a
    call dict using the entry's own keys, a bad lease or a result that is not JSON."""
    before = digest(db)
    for call in (lambda: db.runs.once("nope", "c", lambda: 1),
                 lambda: db.runs.claim("nope", "c"),
                 lambda: db.runs.settle("nope", "c", result=1)):
        with pytest.raises(RunNotFound):
            call()
    with pytest.raises(agentstate.InvalidKey):
        db.runs.claim(run, "bad id!")
    for bad in ({"call": {"seq": 3}}, {"call": {"type": "x"}}, {"call": [1]}, {"lease": 0},
                {"lease": True}, {"retry": 1}):
        with pytest.raises(InvalidValue):
            db.runs.claim(run, "c", **bad)
    assert digest(db) == before


def test_a_result_that_cannot_be_recorded_fails_the_call(db, run):
    """fn ran and returned something that is not JSON, or too large: the call is settled as
    failed ("ResultNotRecorded: ...", SPEC §16) and the §6 error raised; later callers get
    CallFailed and nothing runs again."""
    calls = []
    with pytest.raises(InvalidValue):
        db.runs.once(run, "c1", lambda: calls.append(1) or {1, 2})
    with pytest.raises(TooLarge):
        db.runs.once(run, "c2", lambda: calls.append(2) or "x" * (16 * 1024 * 1024))
    for call_id in ("c1", "c2"):
        with pytest.raises(CallFailed) as e:
            db.runs.once(run, call_id, lambda: calls.append(3))
        assert e.value.error.startswith("ResultNotRecorded: ")
    assert calls == [1, 2]
    assert [e["status"] for e in db.runs.load(run).entries if e["type"] == "tool_result"] \
        == ["error", "error"]


def test_a_large_result_is_recorded(db, run):
    """A result up to a run entry's limit is recorded, locally and over HTTP (whose claim
    and settle take what a run entry takes: 16 MiB), and returned to later callers."""
    big = {"text": "y" * (5 * 1024 * 1024)}
    assert db.runs.once(run, "big", lambda: big) == big
    assert db.runs.once(run, "big", lambda: pytest.fail("ran again")) == big


def test_once_and_claim_inside_a_block_are_usage_errors(db, run):
    """once() and claim() inside transaction(), batch() or snapshot(): UsageError before
    anything is claimed (the block could roll the claim back and the call run again)."""
    before = digest(db)
    blocks = [db.batch]
    if not hasattr(db, "callworker_target"):  # the remote client has neither of these
        blocks += [db.transaction, db.snapshot]
    for block in blocks:
        for call in (lambda: db.runs.once(run, "c1", lambda: pytest.fail("ran")),
                     lambda: db.runs.claim(run, "c1")):
            with pytest.raises(UsageError, match="inside"):
                with block():
                    call()

        async def inside() -> None:
            with block():
                await db.runs.aonce(run, "c1", lambda: pytest.fail("ran"))

        with pytest.raises(UsageError, match="inside"):
            asyncio.run(inside())
    assert digest(db) == before


def test_once_needs_a_function(db, run):
    """fn that is not callable (None, a text, the result of calling it), or an async fn given
    to the sync once: UsageError before anything is claimed; later correct calls run."""
    async def charge():
        return 1

    before = digest(db)
    for fn in (None, "charge", 42, charge):
        with pytest.raises(UsageError):
            db.runs.once(run, "c1", fn)
    with pytest.raises(UsageError):
        db.runs.once(run, "c1", lambda: 1, reconcile="no")
    with pytest.raises(UsageError):
        asyncio.run(db.runs.aonce(run, "c1", None))
    assert digest(db) == before
    assert db.runs.once(run, "c1", lambda: 5) == 5


def test_only_an_ok_or_error_result_settles_a_call(db, run):
    """A tool_result with another status (load()'s synthetic "unknown", written back) does
    not settle the call: it is in doubt, reconcile may run it, and settle records it."""
    db.runs.claim(run, "c1")
    unknown = db.runs.load(run).entries[-1]
    assert unknown["status"] == "unknown"
    db.runs.write(run, [{**unknown, "seq": 1}], None)
    assert db.runs.claim(run, "c1").status == "in_doubt"
    with pytest.raises(InDoubt):
        db.runs.once(run, "c1", lambda: pytest.fail("ran"))
    assert db.runs.once(run, "c1", lambda: "ran", reconcile=lambda cid, e: NOT_RUN) == "ran"
    assert db.runs.read(run).entries[-2]["retry"] == 1
    db.runs.claim(run, "c2")
    db.runs.write(run, [{"seq": 5, "type": "tool_result", "call_id": "c2", "status": "maybe"}], None)
    db.runs.settle(run, "c2", result=3)
    assert db.runs.once(run, "c2", lambda: pytest.fail("ran")) == 3


def test_call_ids_of_other_json_types_are_other_calls(db, run):
    """The call "7" is not the call whose call_id is the number 7 (nor "true" true), on every
    backend: once() of "7" runs its own function."""
    db.runs.write(run, [{"seq": 0, "type": "tool_call", "call_id": 7},
                        {"seq": 1, "type": "tool_result", "call_id": 7, "status": "ok",
                         "result": "another call's"},
                        {"seq": 2, "type": "tool_call", "call_id": True}], None)
    assert db.runs.once(run, "7", lambda: "mine") == "mine"
    assert db.runs.once(run, "true", lambda: "mine too") == "mine too"
    assert db.runs.claim(run, "7").status == "done"


def test_a_settle_names_its_claim(db, run):
    """A claimer whose claim a retry superseded settles nothing (InvalidTransition, nothing
    written); the newest claim's settle is recorded. Both result and error: InvalidValue."""
    db.runs.claim(run, "c1", lease=0.01)
    time.sleep(0.05)
    again = db.runs.claim(run, "c1", retry=True)
    assert again.status == "claimed" and again.entry["retry"] == 1
    before = digest(db)
    with pytest.raises(InvalidTransition, match="superseded"):
        db.runs.settle(run, "c1", result="late", retry=0)
    with pytest.raises(InvalidValue):
        db.runs.settle(run, "c1", result="x", error="y")
    with pytest.raises(InvalidValue):
        db.runs.settle(run, "c1", result="x", retry=-1)
    assert digest(db) == before
    db.runs.settle(run, "c1", result="fresh", retry=1)
    assert db.runs.once(run, "c1", lambda: pytest.fail("ran")) == "fresh"


def test_calls_outlive_a_trim(db, run):
    """Trimming a run's entries keeps each call's claim and outcome (SPEC §16): once()
    after a trim returns the recorded result or raises CallFailed / CallInProgress, never
    runs fn again; a fork of the trimmed run keeps them too."""
    assert db.runs.once(run, "ok", lambda: {"id": 1}) == {"id": 1}
    with pytest.raises(RuntimeError):
        db.runs.once(run, "bad", lambda: (_ for _ in ()).throw(RuntimeError("no")))
    db.runs.claim(run, "live", lease=1000)
    head = db.runs.head(run)
    assert db.runs.trim(run, before=head.next_seq) == head.next_seq
    assert db.runs.read(run).entries == []
    db.runs.fork(run, "forked")
    for rid in (run, "forked"):
        assert db.runs.once(rid, "ok", lambda: pytest.fail("ran")) == {"id": 1}
        with pytest.raises(CallFailed):
            db.runs.once(rid, "bad", lambda: pytest.fail("ran"))
        with pytest.raises(CallInProgress):
            db.runs.once(rid, "live", lambda: pytest.fail("ran"))
    db.runs.settle(run, "live", result="done")
    db.runs.trim(run, before=db.runs.head(run).next_seq)
    assert db.runs.once(run, "live", lambda: pytest.fail("ran")) == "done"


def test_a_held_turn_keeps_its_claims_in_progress(db, run):
    """A fenced claim stays in progress while its turn is held or decided (a hold is a
    pause); once the turn failed it is in doubt."""
    p = agentstate.Principal("alice")
    s = db.sessions.create(p)
    turn = db.sessions.start_turn(s.id, p, lease=0.3)
    db.runs.claim(run, "c1", fence=turn)
    turn.hold({"ask": "ok?"})
    time.sleep(0.4)  # past the lease it had while running
    assert db.runs.claim(run, "c1").status == "in_progress"
    db.sessions.decide(turn.id, p, {"yes": True})
    assert db.runs.claim(run, "c1").status == "in_progress"
    resumed = db.sessions.resume(turn.id, p, lease=60)
    assert db.runs.claim(run, "c1").status == "in_progress"
    resumed.fail("gave up")
    assert db.runs.claim(run, "c1").status == "in_doubt"


def test_aonce_takes_async_functions(db, run):
    """aonce: fn and reconcile may be async; the same rules."""
    async def main():
        async def fn():
            await asyncio.sleep(0)
            return 7

        assert await db.runs.aonce(run, "a", fn) == 7
        assert await db.runs.aonce(run, "a", fn) == 7
        await asyncio.to_thread(db.runs.claim, run, "b", lease=0.01)
        await asyncio.sleep(0.05)

        async def reconcile(cid, entry):
            return NOT_RUN

        assert await db.runs.aonce(run, "b", fn, reconcile=reconcile) == 7

    asyncio.run(main())


def test_once_lookup_costs_the_same_at_any_run_length(tmp_path):
    """Finding a call id is an index probe: a claim costs the same SQLite instructions at
    100 and 100,000 entries (test_postgres.py counts the server's buffer reads)."""
    from .test_runs import vm_steps

    with agentstate.open(str(tmp_path / "a.db")) as db:
        db._store.housekeeping = None  # the bounded purge every few writes: not the lookup's
        costs = {}
        for n in (100, 100_000):
            rid = f"r{n}"
            db.runs.write(rid, [{"seq": i, "type": "tool_call" if i % 2 else "message",
                                 "call_id": f"x{i}"} for i in range(n)], None, create=True)
            db.runs.claim(rid, "old")
            costs[n] = (vm_steps(db, lambda: db.runs.claim(rid, "old")),
                        vm_steps(db, lambda: db.runs.claim(rid, f"new{n}")))
        for small, big in zip(costs[100], costs[100_000]):
            assert big <= small * 1.5 + 5, costs


# -- real processes -----------------------------------------------------------------------

def served_target(db) -> str:
    return getattr(db, "callworker_target", None) or target(db)


def test_racing_processes_run_each_call_once(db, run, tmp_path):
    """8 processes call once() for the same call id at the same moment, for 12 call ids:
    each effect happens exactly once; the others see it done or in progress."""
    out = str(tmp_path / "effects.txt")
    calls = [f"c{i}" for i in range(12)]
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(8), ctx.Queue()
    procs = [ctx.Process(target=callworkers.race_once,
                         args=(served_target(db), run, calls, out, barrier, results))
             for _ in range(8)]
    for p in procs:
        p.start()
    ended = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 8
    assert sorted(callworkers.effects(out)) == sorted(calls)
    for i in range(len(calls)):
        assert sorted(e[i] for e in ended).count("ran") == 1


def _killed_loops_resume(db, run, tmp_path, kills: int) -> None:
    """A loop of once() calls is killed (SIGKILL) at random moments ``kills`` times and run
    again, with a reconcile that checks the outside effect: every effect happens exactly once."""
    import random

    out = str(tmp_path / "effects.txt")
    n = 30
    code = ("import sys; from tests import callworkers; "
            f"callworkers.once_loop(sys.argv[1], {run!r}, {n}, sys.argv[2])")
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rng = random.Random()
    for _kill in range(kills):  # then one run to the end
        proc = subprocess.Popen([sys.executable, "-c", code, served_target(db), out], cwd=cwd,
                                stdout=subprocess.PIPE)
        assert proc.stdout.readline() == b"started\n"  # it opened the store: kill from here on
        time.sleep(rng.uniform(0, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        time.sleep(0.6)  # past the claims' lease (0.5 s): the next run finds them in doubt
    done = subprocess.run([sys.executable, "-c", code, served_target(db), out], cwd=cwd,
                          stdout=subprocess.PIPE, timeout=300)
    assert done.returncode == 0
    assert callworkers.effects(out) == [f"c{i}" for i in range(n)]
    assert db.runs.claim(run, f"c{n - 1}").status == "done"


def test_killed_loops_resume_without_a_second_effect(db, run, tmp_path):
    """Four kills at random moments (each costs a start and a lease: ~1 s)."""
    _killed_loops_resume(db, run, tmp_path, kills=4)


@pytest.mark.slow  # ~16 s a backend: CI's -m slow
def test_killed_loops_resume_without_a_second_effect_many_times(db, run, tmp_path):
    """Sixteen kills at random moments, the same checks."""
    _killed_loops_resume(db, run, tmp_path, kills=16)
