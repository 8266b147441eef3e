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
                        InvalidValue, LeaseLost, RunNotFound)

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


def test_a_result_that_cannot_be_recorded_leaves_the_call_in_doubt(db, run):
    """fn returned something that is not JSON: InvalidValue, and the claim stays without a
    result (its effect may have happened): load() marks it unknown."""
    with pytest.raises(InvalidValue):
        db.runs.once(run, "c1", lambda: {1, 2}, lease=0.01)
    time.sleep(0.05)
    assert db.runs.claim(run, "c1").status == "in_doubt"
    assert db.runs.load(run).entries[-1]["status"] == "unknown"


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


def test_killed_loops_resume_without_a_second_effect(db, run, tmp_path):
    """A loop of once() calls is killed (SIGKILL) at random moments and run again, with a
    reconcile that checks the outside effect: every effect happens exactly once."""
    import random

    out = str(tmp_path / "effects.txt")
    n = 30
    code = ("import sys; from tests import callworkers; "
            f"callworkers.once_loop(sys.argv[1], {run!r}, {n}, sys.argv[2])")
    cwd = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rng = random.Random()
    for kill in range(8):  # then one run to the end
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
