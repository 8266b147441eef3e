"""SPEC §2 pop and the async twins, and SPEC §12's batch() on a local Database."""

from __future__ import annotations

import asyncio
import gc
import itertools
import threading
import time
import weakref
from contextlib import contextmanager

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate

from .conftest import digest, on_postgres, target
from .strategies import JSON


@pytest.fixture
def db(any_db):
    """Every test here runs on both backends: an SQLite file and a PostgreSQL schema."""
    return any_db


@contextmanager
def writes_held(db):
    """Another connection keeps every key writer waiting until the block ends: SQLite's write
    lock, or on PostgreSQL a lock on the kv table that no row writer can share."""
    if on_postgres(db):
        import psycopg

        other = psycopg.connect(target(db))
        other.execute("LOCK TABLE kv IN EXCLUSIVE MODE")
        try:
            yield
        finally:
            other.commit()
            other.close()
        return
    other = apsw.Connection(db.path)
    other.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        other.execute("COMMIT")
        other.close()


EXAMPLES = itertools.count()


@settings(max_examples=60)
@given(items=st.lists(JSON, max_size=8), pops=st.lists(st.integers(0, 5), max_size=4))
def test_pop_matches_a_python_list(db, items, pops):
    """pop(n) removes and returns the last n items in list order; the version rises only
    when something was removed; check() holds (sizes stay exact)."""
    kv = db.scope("app", f"p{next(EXAMPLES)}")  # a new scope per example
    model = list(items)
    kv.put("l", items)
    for n in pops:
        version = kv.get_versioned("l").version
        got = kv.pop("l", n)
        want = model[len(model) - min(n, len(model)):]
        del model[len(model) - len(want):]
        assert got == want
        assert kv.get_versioned("l") == (model, version + (1 if want else 0))
    assert kv.length("l") == len(model) and db.check() == []


def test_pop_of_absent_and_of_a_non_list(db):
    kv = db.scope("app", "p")
    assert kv.pop("none", 3) == [] and kv.get_versioned("none").version == 0
    kv.put("s", "text")
    before = digest(db)
    with pytest.raises(agentstate.NotAList):
        kv.pop("s")
    with pytest.raises(agentstate.InvalidValue):
        kv.pop("s", -1)
    assert digest(db) == before


def test_async_twins_behave_like_their_twins(db):
    kv = db.scope("session", "a")

    async def main():
        assert await kv.aput("k", {"x": 1}) == 1
        assert await kv.aget("k") == {"x": 1}
        assert await kv.aget_versioned("k") == (({"x": 1}), 1)
        assert await kv.aappend("l", [1, 2, 3]) == (3, 1)
        assert await kv.aslice("l", -2) == [2, 3]
        assert await kv.alength("l") == 3
        assert await kv.apop("l", 2) == [2, 3]
        assert await kv.alist() == ["k", "l"]
        assert await kv.aput_bytes("b", b"[1]") == 1
        assert await kv.aget_bytes("b") == b"[1]"
        assert await kv.adelete("k") is True
        with pytest.raises(agentstate.VersionConflict):
            await kv.aput("l", 1, if_version=99)

    asyncio.run(main())


def test_aupdate_from_many_tasks_and_threads_loses_nothing(db):
    """Plain and async fns, many tasks on two event loops in two threads: every increment counts."""
    kv = db.scope("agent", "c")

    async def bump_async(n):
        await asyncio.sleep(0)
        return n + 1

    async def loop_body():
        await asyncio.gather(*(kv.aupdate("n", bump_async if i % 2 else (lambda n: n + 1), default=0)
                               for i in range(40)))

    threads = [threading.Thread(target=asyncio.run, args=(loop_body(),)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert kv.get("n") == 80


def counting_increment():
    """An update function that adds 1, and the list that counts its runs."""
    calls: list[int] = []

    def inc(n):
        calls.append(1)
        return n + 1

    return calls, inc


def test_an_event_loop_s_tasks_take_turns_updating_one_key(db, monkeypatch):
    """8 tasks of one event loop aupdate one key 25 times each: the function runs once
    per update (1,267 times for 200 before: each task's compare-and-set lost to its
    siblings and retried). TURN_WAIT made long: on a loaded machine the 7 updates
    ahead of a task may take over a second, and then it would go without."""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    kv = db.scope("agent", "turns")
    calls, inc = counting_increment()

    async def one():
        for _ in range(25):
            await kv.aupdate("n", inc, default=0)

    async def main():
        await asyncio.gather(*(one() for _ in range(8)))

    asyncio.run(main())
    assert len(calls) == 200
    assert kv.get_versioned("n") == (200, 200)


def test_an_aupdate_inside_aupdate_s_function_goes_without_a_turn(db, monkeypatch):
    """A task holds one turn at most: an aupdate of the same key inside aupdate's
    function, or in a task it starts and awaits, must not wait for the outer turn (a
    deadlock, caught here with TURN_WAIT made longer than the test's wait)."""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    kv = db.scope("agent", "nested")
    runs = []

    async def outer(n):
        runs.append(n)
        if len(runs) == 1:  # the first run only: the write then loses to the inner ones
            await kv.aupdate("x", lambda m: m + 1, default=0)
            await asyncio.create_task(kv.aupdate("x", lambda m: m + 10, default=0))
        return n + 100

    async def main():
        return await asyncio.wait_for(kv.aupdate("x", outer, default=0), 30)

    assert asyncio.run(main()) == 111
    assert runs == [0, 11] and kv.get("x") == 111


def test_an_aupdate_whose_function_waits_for_another_task_s_aupdate_does_not_hang(db):
    """aupdate's function waits for another task, started earlier, to aupdate the same
    key: that task cannot have the key's turn, so it goes without after TURN_WAIT (1 s)
    and both increments land."""
    kv = db.scope("agent", "waits")

    async def main():
        go, done = asyncio.Event(), asyncio.Event()

        async def other():
            await go.wait()
            await kv.aupdate("x", lambda m: m + 1, default=0)
            done.set()

        helper = asyncio.create_task(other())

        async def fn(n):
            if not go.is_set():  # the first run only: it runs again after losing
                go.set()
                await asyncio.wait_for(done.wait(), 10)
            return n + 1

        began = time.monotonic()
        result = await kv.aupdate("x", fn, default=0)
        await helper
        return result, time.monotonic() - began

    result, took = asyncio.run(main())
    assert result == 2 and kv.get("x") == 2
    assert 0.9 * agentstate._turns.TURN_WAIT < took < 8  # it waited out TURN_WAIT, not the function's 10 s


def test_a_task_updating_again_at_once_is_bounded_by_turn_wait_too(db):
    """A task that aupdates a key again right after its turn ends finds the lock free
    but a woken waiter ahead of it; that wait is bounded like any other. Here the
    waiter's function waits for that second update: both finish after ~TURN_WAIT
    (an unbounded acquire on a free lock hung for ever)."""
    kv = db.scope("agent", "again")

    async def main():
        second_done, first_turn = asyncio.Event(), asyncio.Event()

        async def first(n):
            first_turn.set()
            await asyncio.sleep(0.2)  # the other task comes to wait for the turn
            return n + 1

        async def holder():
            await kv.aupdate("x", first, default=0)
            await kv.aupdate("x", lambda n: n + 1, default=0)  # again, at once
            second_done.set()

        async def waits_for_the_second(n):
            await second_done.wait()
            return n + 10

        async def waiter():
            await first_turn.wait()
            await kv.aupdate("x", waits_for_the_second, default=0)

        await asyncio.wait_for(asyncio.gather(holder(), waiter()), 20)

    asyncio.run(main())
    assert kv.get("x") == 12


def test_a_task_cancelled_while_waiting_for_a_turn_is_cancelled(db, monkeypatch):
    """Cancelled in the very step its turn is granted, a waiting aupdate raises
    CancelledError and writes nothing (asyncio.wait_for on 3.11 swallowed that cancel:
    the update ran and the task went on)."""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    kv = db.scope("agent", "cancel")
    after: list[str] = []

    async def main():
        holding, release = asyncio.Event(), asyncio.Event()
        waiter_task: asyncio.Task | None = None

        async def held(n):
            holding.set()
            await release.wait()
            return n + 1

        async def holder():
            await kv.aupdate("x", held, default=0)
            waiter_task.cancel()  # the turn was just handed to the waiter

        async def waiter():
            await holding.wait()
            await kv.aupdate("x", lambda n: n + 100, default=0)
            after.append("went on")

        waiter_task = asyncio.create_task(waiter())
        h = asyncio.create_task(holder())
        await holding.wait()
        await asyncio.sleep(0.05)  # the waiter is queued for the turn
        release.set()
        await h
        with pytest.raises(asyncio.CancelledError):
            await waiter_task

    asyncio.run(main())
    assert after == [] and kv.get("x") == 1


def test_an_unrelated_key_never_waits_for_a_slow_update(db, monkeypatch):
    """A slow aupdate (an LLM call in its function) holds its key's turn only: another
    key's aupdate goes at once. (Striped over 64 locks, a key whose hash shared the
    slow one's stripe waited out TURN_WAIT; this test uses such a key.)"""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    kv = db.scope("agent", "slow")
    other = next(f"counter{i}" for i in range(100_000)
                 if hash(("agent", "slow", f"counter{i}")) % 64 == hash(("agent", "slow", "summary")) % 64)

    async def main():
        started = asyncio.Event()

        async def summarise(text):
            started.set()
            await asyncio.sleep(3)
            return "summary"

        slow = asyncio.create_task(kv.aupdate("summary", summarise, default=""))
        await started.wait()
        t0 = time.monotonic()
        await kv.aupdate(other, lambda n: n + 1, default=0)
        took = time.monotonic() - t0
        slow.cancel()
        return took

    assert asyncio.run(main()) < 1.5 and kv.get(other) == 1


def test_tasks_started_inside_a_turn_take_turns_once_it_is_over(db, monkeypatch):
    """Workers started inside an aupdate's function (a lazy start-up) inherit its turn
    while it lasts, and take turns like any task once it is over: 8 of them x 25
    aupdates run the function 200 times (1,237 when the inherited turn never ended)."""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    kv = db.scope("agent", "workers")
    calls, inc = counting_increment()

    async def main():
        workers, booted = [], asyncio.Event()

        async def worker():
            await booted.wait()  # the turn that started it is over
            for _ in range(25):
                await kv.aupdate("n", inc, default=0)

        def start(v):
            workers.extend(asyncio.create_task(worker()) for _ in range(8))
            return v + 1

        await kv.aupdate("boot", start, default=0)
        booted.set()
        await asyncio.gather(*workers)

    asyncio.run(main())
    assert len(calls) == 200 and kv.get("n") == 200


@pytest.mark.slow_on_postgres  # PostgreSQL's case in CI's -m slow (seconds)
def test_a_cancelled_task_s_cleanup_aupdate_goes_without_a_turn_it_cannot_get(db):
    """A task being cancelled records its status in its except clause, on a key another
    task holds for longer than TURN_WAIT: the update goes without the turn and lands
    (on Python 3.11.0-3.11.2 asyncio.timeout raised its own expiry there as
    CancelledError: the update was lost)."""
    kv = db.scope("agent", "cleanup")
    log: list[str] = []

    async def main():
        held = asyncio.Event()

        async def slow(v):
            held.set()
            await asyncio.sleep(1.5 * agentstate._turns.TURN_WAIT)  # an LLM call
            return v

        async def worker():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                await kv.aupdate("status", lambda v: "cancelled", default="")
                log.append("recorded")
                raise

        holder = asyncio.create_task(kv.aupdate("status", slow, default="running"))
        w = asyncio.create_task(worker())
        await held.wait()
        w.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w
        await holder

    asyncio.run(main())
    assert log == ["recorded"]


def test_a_loop_closed_while_a_task_waits_for_a_turn_is_not_kept(db):
    """run_until_complete then close(), with a task still queued for a turn: the next
    loop that takes turns lets the closed one go (its waiter's lock refers to it)."""
    kv = db.scope("agent", "closed")
    loops = []
    for _ in range(3):
        loop = asyncio.new_event_loop()
        loops.append(weakref.ref(loop))

        async def hold_and_queue():
            held, release = asyncio.Event(), asyncio.Event()

            async def holding(v):
                held.set()
                await release.wait()
                return v + 1

            asyncio.ensure_future(kv.aupdate("k", holding, default=0))
            await held.wait()
            asyncio.ensure_future(kv.aupdate("k", lambda v: v + 1, default=0))
            await asyncio.sleep(0.05)  # the second one waits for the turn

        loop.run_until_complete(hold_and_queue())
        loop.close()  # the holder and the waiter never finish
        del loop
    asyncio.run(kv.aupdate("other", lambda v: v + 1, default=0))  # a later loop's turn
    gc.collect()
    assert [r for r in loops if r() is not None] == []


def test_turns_keep_no_event_loop_alive(db):
    """Programs that asyncio.run() per job: a loop whose tasks waited for turns is freed
    when it ends (a lock that has had a waiter refers to its loop, so locks kept per
    loop kept every such loop)."""
    kv = db.scope("agent", "loops")
    loops = []

    async def main():
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await asyncio.gather(*(kv.aupdate("n", lambda n: n + 1, default=0) for _ in range(4)))

    for _ in range(5):
        asyncio.run(main())
    gc.collect()
    assert [r for r in loops if r() is not None] == []
    assert kv.get("n") == 20


def test_async_twins_never_block_the_event_loop(db):
    """While another connection holds the writers back, an aput waits without stopping the loop."""
    kv = db.scope("app", "a")

    async def main():
        ticks = 0
        with writes_held(db):
            writer = asyncio.create_task(kv.aput("k", 1))
            t0 = time.monotonic()
            while time.monotonic() - t0 < 0.5:
                await asyncio.sleep(0.01)
                ticks += 1
            assert not writer.done()
        assert await writer == 1
        return ticks

    assert asyncio.run(main()) >= 10  # the loop kept running while the write waited


def test_batch_applies_all_or_none(db):
    kv = db.scope("app", "b")
    kv.put("x", 1)
    with db.batch() as b:
        b.scope("app", "b").put("x", 2, if_version=1)
        b.scope("app", "b").append("l", [1])
        b.scope("user", "u").delete("gone")
    assert b.results == [2, (1, 1), False]
    assert kv.get("x") == 2 and kv.get("l") == [1]
    before = digest(db)
    with pytest.raises(agentstate.VersionConflict) as e:
        with db.batch() as b:
            b.scope("app", "b").put("y", 1)
            b.scope("app", "b").put("x", 3, if_version=1)  # stale: refused, so nothing is written
    assert e.value.current_version == 2 and kv.get("y") is None
    assert digest(db) == before
    with pytest.raises(RuntimeError):
        with db.batch() as b:
            b.scope("app", "b").put("z", 1)
            raise RuntimeError("the block failed: nothing applied")
    assert kv.get("z") is None
    with pytest.raises(agentstate.InvalidKey):
        with db.batch() as b:
            b.scope("app", "b").put("bad key", 1)


def test_a_batch_check_holds_the_batch_to_a_version_and_writes_nothing(db):
    """check(key, if_version=N): the batch applies only if the key is at N (0: absent, an
    expired key included); the first failing op's VersionConflict otherwise, with nothing
    written. A check changes neither its key's version nor the feed; its result is N."""
    kv = db.scope("app", "b")
    kv.put("x", 1)
    kv.put("x", 2)
    kv.put("short", 1, ttl=0.05)
    head = db.last_change()
    with db.batch() as b:
        b.scope("app", "b").check("x", if_version=2)
        b.scope("app", "b").check("none", if_version=0)
        b.scope("user", "u").put("y", "written", if_version=0)
        b.scope("app", "b").check("x", if_version=2)
    assert b.results == [2, 0, 1, 2]
    assert kv.get_versioned("x") == (2, 2) and kv.get("none") is None
    assert [(c.key, c.op) for c in db.changes(head)] == [("y", "put")]  # the checks wrote nothing
    time.sleep(0.1)
    before = digest(db)
    for key, version, current in [("x", 1, 2), ("x", 3, 2), ("x", 0, 2), ("none", 1, 0),
                                  ("short", 1, 0)]:  # expired: absent, at version 0
        with pytest.raises(agentstate.VersionConflict, match=f"check app:b {key}") as e:
            with db.batch() as b:
                b.scope("user", "u").put("z", 1)
                b.scope("app", "b").check(key, if_version=version)
                b.scope("user", "u").put("w", 1)
        assert e.value.current_version == current
        assert digest(db) == before
    assert db.scope("user", "u").list() == ["y"]
    with pytest.raises(agentstate.VersionConflict) as e:  # the first op that fails is the error
        with db.batch() as b:
            b.scope("app", "b").check("x", if_version=2)
            b.scope("app", "b").put("x", 9, if_version=1)
            b.scope("app", "b").check("x", if_version=5)
    assert e.value.current_version == 2 and kv.get("x") == 2


def test_a_batch_of_checks_only_is_a_read_that_waits_for_no_writer(db):
    """A batch that only checks writes nothing, so it is one read: it takes no lock (a
    token that may only read cannot hold up writers with it) and does not wait for a
    writer that holds the store."""
    kv = db.scope("app", "b")
    kv.put("k", 1)
    done = []

    def checks():
        with db.batch() as b:
            b.scope("app", "b").check("k", if_version=1)
            b.scope("app", "b").check("none", if_version=0)
        done.append(b.results)
        with pytest.raises(agentstate.VersionConflict, match="check app:b k") as e:
            with db.batch() as b:
                b.scope("app", "b").check("none", if_version=0)
                b.scope("app", "b").check("k", if_version=2)
        done.append(e.value.current_version)

    with writes_held(db):
        t = threading.Thread(target=checks)
        t.start()
        t.join(30)
        assert not t.is_alive(), "the checks waited for the writer"
    assert done == [[1, 0], 1]


def test_a_check_in_a_transaction_holds_its_key_until_the_end(db):
    """Inside transaction(), a batch's check keeps its key at the version checked until
    the block ends, as a read inside the block does: a writer of that key waits."""
    kv = db.scope("app", "held")
    kv.put("k", 1)
    done: list[int] = []
    with db.transaction():
        with db.batch() as b:
            b.scope("app", "held").check("k", if_version=1)
        writer = threading.Thread(target=lambda: done.append(kv.put("k", 2)))
        writer.start()
        time.sleep(0.5)
        assert done == []
        kv.put("other", 1)
    writer.join(10)
    assert done == [2] and kv.get_versioned("k") == (2, 2)


def _nested(depth):
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


# Each refused write of a batch: how it is added, and the §6 error. Values, items and
# every field are checked by the scope's own rules, the same locally and over HTTP.
BAD_BATCH_WRITES = {
    "int and str keys that collide": (lambda s: s.put("k", {1: "a", "1": "b"}), agentstate.InvalidValue),
    "an int key": (lambda s: s.put("k", {1: "a"}), agentstate.InvalidValue),
    "a None key": (lambda s: s.put("k", {None: 1}), agentstate.InvalidValue),
    "5,000 levels deep": (lambda s: s.put("k", _nested(5000)), agentstate.InvalidValue),
    "513 levels deep": (lambda s: s.put("k", _nested(513)), agentstate.InvalidValue),
    "NaN": (lambda s: s.put("k", {"x": float("nan")}), agentstate.InvalidValue),
    "2**64": (lambda s: s.put("k", 2**64), agentstate.InvalidValue),
    "NUL": (lambda s: s.put("k", "a\x00b"), agentstate.InvalidValue),
    "a lone surrogate": (lambda s: s.put("k", ["\ud800"]), agentstate.InvalidValue),
    "a set": (lambda s: s.put("k", {1, 2}), agentstate.InvalidValue),
    "over 1 MiB": (lambda s: s.put("k", "x" * (1 << 20)), agentstate.TooLarge),
    "items with an int key": (lambda s: s.append("l", [{1: "a", "1": "b"}]), agentstate.InvalidValue),
    "items 5,000 deep": (lambda s: s.append("l", _nested(5000)), agentstate.InvalidValue),
    "items not a list": (lambda s: s.append("l", "abc"), agentstate.InvalidValue),
    "if_version -1": (lambda s: s.put("k", 1, if_version=-1), agentstate.InvalidValue),
    "if_version True": (lambda s: s.put("k", 1, if_version=True), agentstate.InvalidValue),
    "delete if_version '1'": (lambda s: s.delete("k", if_version="1"), agentstate.InvalidValue),
    "ttl 0": (lambda s: s.put("k", 1, ttl=0), agentstate.InvalidValue),
    "ttl NaN": (lambda s: s.append("l", [1], ttl=float("nan")), agentstate.InvalidValue),
    "ttl keep": (lambda s: s.put("k", 1, ttl="keep"), agentstate.InvalidValue),
    "a bad key": (lambda s: s.put("bad key", 1), agentstate.InvalidKey),
    "check without if_version": (lambda s: s.check("x", if_version=None), agentstate.InvalidValue),
    "check if_version -1": (lambda s: s.check("x", if_version=-1), agentstate.InvalidValue),
    "check if_version 1.0": (lambda s: s.check("x", if_version=1.0), agentstate.InvalidValue),
    "check a bad key": (lambda s: s.check("bad key", if_version=0), agentstate.InvalidKey),
}


@pytest.mark.parametrize("name", list(BAD_BATCH_WRITES))
def test_a_batch_refuses_a_bad_write_and_writes_nothing(db, name):
    """A batch write is validated by the scope's rules when it is added (SPEC §2): the §6
    error, never a raw RecursionError nor a value stored otherwise, and none of the
    batch's writes applied. (Over HTTP {1: "a", "1": "b"} was stored as {"1": "b"}.)"""
    add, error = BAD_BATCH_WRITES[name]
    kv = db.scope("app", "b")
    kv.put("x", 1)
    before = digest(db)
    with pytest.raises(error):
        with db.batch() as b:
            b.scope("app", "b").put("x", 2)
            b.scope("app", "b").append("l", [1])
            add(b.scope("app", "b"))
    assert digest(db) == before and kv.get_versioned("x") == (1, 1) and kv.get("l") is None


def test_a_batch_write_is_refused_when_it_is_added(db):
    """The refusal comes from the call that adds the bad write; the writes added
    around it are still applied together when the block ends."""
    with db.batch() as b:
        b.scope("app", "b").put("a", 1)
        with pytest.raises(agentstate.InvalidValue):
            b.scope("app", "b").put("k", {1: "a", "1": "b"})
        b.scope("app", "b").put("c", 3)
    assert b.results == [1, 1] and db.scope("app", "b").list() == ["a", "c"]


def test_a_batch_writes_what_the_scope_writes(db):
    """Each batch write stores what the same scope call stores: value, list, expiry, bytes
    and version (a batch's values are encoded once and sent as that JSON text)."""
    value = {"é": [1, -2.5, 1e16, 2**63 - 1, "\u2028", None, True], "": {}}
    direct, batched = db.scope("app", "direct"), db.scope("app", "batched")
    direct.put("gone", 1)
    batched.put("gone", 1)
    results = [direct.put("v", value), direct.put("l", [value, 2], ttl=60),
               direct.append("a", [1, {"x": 2}], ttl=60), direct.append("a", [3]),
               direct.delete("gone", if_version=1), direct.put("t", (1, (2,)))]
    with db.batch() as b:
        s = b.scope("app", "batched")
        s.put("v", value)
        s.put("l", [value, 2], ttl=60)
        s.append("a", [1, {"x": 2}], ttl=60)
        s.append("a", [3])
        s.delete("gone", if_version=1)
        s.put("t", (1, (2,)))
    assert b.results == results
    for key in ("v", "l", "a", "gone", "t"):
        assert batched.get_versioned(key) == direct.get_versioned(key)
        assert batched.get_bytes(key) == direct.get_bytes(key)
        assert (batched.expires_at(key) is None) == (direct.expires_at(key) is None)
    assert batched.length("l") == 2 and batched.slice("a", 1) == [{"x": 2}, 3]


async def _call_async_twin(scope, name, args, kwargs):
    return await getattr(scope, "a" + name)(*args, **kwargs)


def _outcome(call):
    try:
        return ("ok", call())
    except Exception as e:
        return ("error", type(e), getattr(e, "current_version", None))


def test_each_async_twin_answers_as_its_twin(db):
    """Every Scope method and its async twin, on two scopes set up alike: the same answer
    or the same error, and the same state after (SPEC §2: "behaves exactly like its twin").
    (aupdate cleared a key's expiry where update keeps it.)"""
    def inc(n):
        return n + 1

    calls = [
        ("get", ("n",), {}), ("get", ("absent", 5), {}), ("get_versioned", ("n",), {}),
        ("get_versioned", ("absent",), {}), ("get", ("raw",), {}),
        ("put", ("p", {"a": 1}), {"if_version": 0}), ("put", ("p", 2), {"if_version": 5}),
        ("put", ("p", {1: 2}), {}), ("put", ("p", 3), {"ttl": 60}),
        ("update", ("n", inc), {}), ("update", ("new", inc), {"default": 0}),
        ("update", ("p", inc), {}), ("update", ("raw", inc), {}),
        ("append", ("l", [4]), {}), ("append", ("l2", [1]), {"ttl": 60}), ("append", ("n", [1]), {}),
        ("pop", ("l", 2), {}), ("pop", ("absent", 1), {}), ("slice", ("l", -1), {}),
        ("length", ("l",), {}), ("length", ("n",), {}), ("list", (), {}), ("list", ("l",), {"limit": 1}),
        ("put_bytes", ("b2", b"x"), {"ttl": 60}), ("get_bytes", ("raw",), {}), ("get_bytes", ("n",), {}),
        ("touch", ("l", 120), {}), ("touch", ("absent", 1), {}),
        ("delete", ("b2",), {"if_version": 7}), ("delete", ("b2",), {}),
    ]
    plain, twin = db.scope("app", "plain"), db.scope("app", "twin")
    for s in (plain, twin):
        s.put("n", 1, ttl=60)
        s.put("l", [1, 2, 3], ttl=60)
        s.put_bytes("raw", b"not json")
    for name, args, kwargs in calls:
        want = _outcome(lambda: getattr(plain, name)(*args, **kwargs))
        got = _outcome(lambda: asyncio.run(_call_async_twin(twin, name, args, kwargs)))
        assert got == want, f"a{name}{args}"
    keys = plain.list()
    assert twin.list() == keys
    for key in keys:
        assert twin.get_bytes(key) == plain.get_bytes(key), key
        assert _outcome(lambda: twin.get_versioned(key)) == _outcome(lambda: plain.get_versioned(key))
        assert (twin.expires_at(key) is None) == (plain.expires_at(key) is None), key
