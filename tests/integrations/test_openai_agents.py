"""AgentStateSession: the openai-agents Session on agentstate.

What the framework's own suite does not check (test_openai_agents_suite.py
runs that one): real processes sharing one session, the layout that keeps
adding and reading flat as the history grows, reads that never tear, an
event loop that keeps running while a write waits for the lock, and
cancellation that never leaves half a call written.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing as mp
import os
import random
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, SessionSettings
from agents.testing import ScriptedModel
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate.integrations import openai_agents as oa
from agentstate.integrations.openai_agents import (AgentStateSession, SessionClosed, scope_id,
                                                   session_id_of)

_ids = itertools.count()


def _roundtrip(item: Any) -> str:
    """What json.dumps/json.loads (so SQLiteSession) gives back, as comparable text."""
    return json.dumps(json.loads(json.dumps(item)), sort_keys=True)


class _SmallLists:
    """A session's scope whose lists hold at most 300 bytes of JSON instead of 1 MiB
    (appending past that raises TooLarge, as the store does past its limit), so
    small histories cross many chunk borders."""

    LIMIT = 300

    def __init__(self, scope: agentstate.Scope) -> None:
        self.scope = scope

    def __getattr__(self, name: str) -> Any:
        return getattr(self.scope, name)

    def append(self, key: str, items: list[Any]) -> Any:
        size = len(json.dumps(self.scope.slice(key) + items, separators=(",", ":")))
        if size > self.LIMIT:
            raise agentstate.TooLarge(f"{size} bytes", size, self.LIMIT)
        return self.scope.append(key, items)


def _small(session: AgentStateSession) -> AgentStateSession:
    session._scope = _SmallLists(session._scope)  # type: ignore[assignment]
    return session


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """New chunks planned at 300 bytes and bytes parts of 50 (use with _small)."""
    monkeypatch.setattr(oa, "CHUNK_BYTES", 300)
    monkeypatch.setattr(oa, "PART_BYTES", 50)


# -- the history -------------------------------------------------------------------


def test_history_in_order_with_limits_pop_and_clear(db_path: str) -> None:
    """get_items gives the newest `limit` oldest first (0: none, negative or None: all);
    pop_item takes the newest; clear_session leaves only the layout's meta and an empty
    tail behind."""

    async def main() -> None:
        s = AgentStateSession("s-1", db_path=db_path)
        assert await s.get_items() == [] and await s.pop_item() is None
        items = [{"role": "user", "content": f"m{i}"} for i in range(7)]
        await s.add_items(items[:3])
        await s.add_items(items[3:])
        assert await s.get_items() == items
        for limit in (1, 3, 7, 100):
            assert await s.get_items(limit) == items[-limit:]
        assert await s.get_items(0) == []
        assert await s.get_items(-1) == items  # SQLite's LIMIT -1, as SQLiteSession
        assert await s.pop_item() == items[-1]
        assert await s.get_items(2) == items[4:6]
        await s.clear_session()
        assert await s.get_items() == [] and await s.pop_item() is None
        scope = s.db.scope("session", scope_id("s-1"))
        assert scope.list() == ["c.tail", "meta"] and scope.slice("c.tail") == [["h", -1]]
        s.close()

    asyncio.run(main())


def test_session_settings_limit_is_the_default(db_path: str) -> None:
    """session_settings.limit bounds get_items() unless a limit is passed."""

    async def main() -> None:
        s = AgentStateSession("s", db_path=db_path, session_settings={"limit": 2})
        assert s.session_settings == SessionSettings(limit=2)
        await s.add_items([{"n": i} for i in range(5)])
        assert await s.get_items() == [{"n": 3}, {"n": 4}]
        assert await s.get_items(limit=4) == [{"n": i} for i in range(1, 5)]
        s.close()

    asyncio.run(main())


def test_odd_items_come_back_as_json_dumps_would_give_them(db_path: str) -> None:
    """Items SPEC §2 does not store as JSON (NUL, NaN, 2**70, 600 levels, int keys),
    items over 1 MiB and items that are not dicts round-trip as through json.dumps."""
    deep: Any = "bottom"
    for _ in range(600):
        deep = [deep]
    odd = [
        {"role": "user", "content": "big " + "é" * 1_500_000},  # 3 MB: bytes parts
        {"content": "a NUL \x00 inside"}, {"score": float("nan")}, {"inf": float("inf")},
        {"n": 2**70}, {"deep": deep}, {1: "int key"}, ["a", "list"], "a string", 7, None,
        {"role": "assistant", "content": "plain"},
    ]

    async def main() -> None:
        s = AgentStateSession("odd", db_path=db_path)
        await s.add_items(odd)
        got = await s.get_items()
        assert [_roundtrip(x) for x in got] == [_roundtrip(x) for x in odd]
        assert [_roundtrip(x) for x in await s.get_items(5)] == [_roundtrip(x) for x in odd[-5:]]
        for expected in reversed(odd):
            assert _roundtrip(await s.pop_item()) == _roundtrip(expected)
        assert await s.pop_item() is None
        keys = s.db.scope("session", scope_id("odd")).list()
        assert keys == ["c.tail", "meta"]  # the bytes parts went with their items
        s.close()

    asyncio.run(main())


def test_a_part_removed_by_hand_is_reported_as_damaged(db_path: str) -> None:
    """A large item whose bytes part was deleted outside the session raises Damaged
    from get_items and pop_item (which then pops nothing) instead of returning
    something else."""

    async def main() -> None:
        s = AgentStateSession("hand", db_path=db_path)
        await s.add_items([{"n": 0}, {"big": "b" * 1_200_000}])
        scope = s.db.scope("session", scope_id("hand"))
        scope.delete([k for k in scope.list() if k.startswith("x.")][0])
        with pytest.raises(agentstate.Damaged):
            await s.get_items()
        keys = scope.list()
        with pytest.raises(agentstate.Damaged):
            await s.pop_item()
        assert scope.list() == keys and scope.slice("c.tail")[:2] == [["h", -1], {"n": 0}]
        assert scope.length("c.tail") == 3
        s.close()

    asyncio.run(main())


def test_a_newer_layout_is_refused_not_misread(db_path: str) -> None:
    """A session in a layout newer than this agentstate's (meta's format, and c.tail no
    longer a list, as the layout rule asks of later layouts) raises SchemaTooNew from
    every call, of a session object that used it before or of a new one, and is left
    as it is."""

    async def main() -> None:
        s = AgentStateSession("new", db_path=db_path)
        await s.add_items([{"n": 0}])
        scope = s.db.scope("session", scope_id("new"))
        scope.put("meta", {**scope.get("meta"), "format": oa.FORMAT + 1})
        scope.put("c.tail", {"layout": oa.FORMAT + 1})
        keys = {k: v for k, v in scope.items()}
        for session in (s, AgentStateSession("new", s.db)):
            for call in (session.get_items(), session.get_items(5), session.add_items([{"n": 1}]),
                         session.pop_item(), session.clear_session()):
                with pytest.raises(agentstate.SchemaTooNew):
                    await call
        assert {k: v for k, v in scope.items()} == keys
        s.close()

    asyncio.run(main())


def test_a_newer_meta_is_refused_by_a_first_write(db_path: str) -> None:
    """A session object's first write reads meta: a newer layout is refused even where
    c.tail is still a list, and nothing is written."""

    async def main() -> None:
        s = AgentStateSession("new", db_path=db_path)
        await s.add_items([{"n": 0}])
        scope = s.db.scope("session", scope_id("new"))
        scope.put("meta", {**scope.get("meta"), "format": oa.FORMAT + 1})
        fresh = AgentStateSession("new", s.db)
        for call in (fresh.add_items([{"n": 1}]), fresh.clear_session()):
            with pytest.raises(agentstate.SchemaTooNew):
                await call
        assert scope.slice("c.tail") == [["h", -1], {"n": 0}]
        s.close()

    asyncio.run(main())


def _layout_1(db: agentstate.Database, sid: str, chunks: list[list[Any]]) -> agentstate.Scope:
    """A session as agentstate 0.2 wrote it: meta format 1, chunks c.0..c.last (the
    last one the only one that changes, and possibly emptied by pops)."""
    scope = db.scope("session", scope_id(sid))
    for n, chunk in enumerate(chunks):
        scope.put(oa._chunk(n), chunk)
    scope.put("meta", {"format": 1, "last": len(chunks) - 1, "spills": 0})
    return scope


@pytest.mark.parametrize("emptied", [False, True])
def test_a_layout_1_session_reads_as_it_is_and_moves_to_layout_2(db_path: str,
                                                                 emptied: bool) -> None:
    """A session written by agentstate 0.2 (layout 1) reads back whole and by limit;
    its first write makes it layout 2 (meta format 2, its chunks kept, an emptied last
    one removed), after which adds, pops past the tail and reads keep the order."""

    async def main() -> None:
        with agentstate.open(db_path) as db:
            old = [[{"n": 0}, {"n": 1}], [{"n": 2}, ["v", "three"]]] + ([[]] if emptied else [])
            scope = _layout_1(db, "old", old)
            model: list[Any] = [{"n": 0}, {"n": 1}, {"n": 2}, "three"]
            s = AgentStateSession("old", db)
            assert await s.get_items() == model and await s.get_items(3) == model[-3:]
            await s.add_items([{"n": 4}])
            model.append({"n": 4})
            assert scope.get("meta") == {"format": 2, "last": 1, "spills": 0}
            assert scope.list() == ["c.00000000", "c.00000001", "c.tail", "meta"]
            assert scope.slice("c.tail") == [["h", 1], {"n": 4}]
            other = AgentStateSession("old", db)
            assert await other.get_items() == model and await other.get_items(2) == model[-2:]
            for _ in range(3):
                assert await other.pop_item() == model.pop()
            assert await s.get_items() == model == await s.get_items(10)
            assert scope.list() == ["c.00000000", "c.tail", "meta"]
            assert scope.slice("c.tail") == [["h", 0]]

    asyncio.run(main())


def test_add_items_refuses_what_json_refuses_and_writes_nothing(db_path: str) -> None:
    """An item json.dumps cannot encode raises TypeError; none of the call's items is kept."""

    async def main() -> None:
        s = AgentStateSession("t", db_path=db_path)
        await s.add_items([{"n": 0}])
        with pytest.raises(TypeError):
            await s.add_items([{"n": 1}, {"content": object()}])
        assert await s.get_items() == [{"n": 0}]
        s.close()

    asyncio.run(main())


def test_failed_add_items_writes_nothing_and_keeps_no_lock(
        db_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write refused inside its transaction, after its first chunk was appended,
    rolls back whole and leaves the write lock free for another connection at once."""
    monkeypatch.setattr(oa, "CHUNK_BYTES", 2 * 1024 * 1024)  # planned past the list limit

    async def main() -> None:
        s = AgentStateSession("t", db_path=db_path)
        await s.add_items([{"n": 0}])
        with pytest.raises(agentstate.TooLarge):
            await s.add_items([{"n": 1}, {"x": "y" * 1_100_000}])
        with agentstate.open(db_path, busy_timeout=0) as other:
            other.scope("app", "probe").put("k", 1)
        assert await s.get_items() == [{"n": 0}]
        await s.add_items([{"n": 1}])
        assert await s.get_items() == [{"n": 0}, {"n": 1}]
        s.close()

    asyncio.run(main())


@settings(max_examples=40)
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 400), min_size=0, max_size=6)),  # pads
    st.tuples(st.just("pop"), st.just(0)),
    st.tuples(st.just("get"), st.integers(-2, 40) | st.none()),
    st.tuples(st.just("clear"), st.just(0)),
), max_size=30))
def test_history_matches_a_python_list(tmp_path_factory: pytest.TempPathFactory,
                                       ops: list[tuple[str, Any]]) -> None:
    """Any sequence of add / pop / get(limit) / clear across chunk and part borders
    behaves as the same calls on a Python list."""
    path = str(tmp_path_factory.getbasetemp() / "model.db")
    saved = oa.CHUNK_BYTES, oa.PART_BYTES
    oa.CHUNK_BYTES, oa.PART_BYTES = 300, 50
    try:
        asyncio.run(_model_run(path, f"m-{next(_ids)}", ops))
    finally:
        oa.CHUNK_BYTES, oa.PART_BYTES = saved


async def _model_run(path: str, sid: str, ops: list[tuple[str, Any]]) -> None:
    s = _small(AgentStateSession(sid, db_path=path))
    model: list[Any] = []
    serial = itertools.count()
    for op, arg in ops:
        if op == "add":
            batch = [{"i": next(serial), "pad": "p" * size} for size in arg]
            await s.add_items(batch)
            model += batch
        elif op == "pop":
            assert await s.pop_item() == (model.pop() if model else None)
        elif op == "get":
            want = model if arg is None or arg < 0 else model[max(0, len(model) - arg):] if arg else []
            assert await s.get_items(arg) == want
        else:
            await s.clear_session()
            model.clear()
        _check_layout(s)
    assert await s.get_items() == model
    s.close()


def _check_layout(s: AgentStateSession) -> None:
    """Chunks 0..last exist and none is empty; c.tail starts with the header naming
    last; every bytes part belongs to an item still in a chunk; nothing else is in the
    scope."""
    scope = s.db.scope("session", scope_id(s.session_id))
    meta = scope.get("meta")
    if meta is None:
        assert scope.list() == []
        return
    assert meta["format"] == oa.FORMAT
    chunks = [scope.slice(oa._chunk(n)) for n in range(meta["last"] + 1)]
    assert all(chunks)
    tail = scope.slice("c.tail")
    assert tail[0] == ["h", meta["last"]]
    parts = {oa._part(x[1], k) for chunk in [*chunks, tail[1:]] for x in chunk
             if isinstance(x, list) and x[0] == "x" for k in range(x[2])}
    assert set(scope.list()) == {"meta", "c.tail", *map(oa._chunk, range(meta["last"] + 1)),
                                 *parts}


# -- flat cost ----------------------------------------------------------------------


class _Counting:
    """A scope that counts the calls made on it and the items its slices return."""

    def __init__(self, scope: agentstate.Scope) -> None:
        self.scope, self.calls, self.sliced = scope, [], 0

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self.scope, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            out = fn(*args, **kwargs)
            if name == "slice":
                self.sliced += len(out)
            return out

        return counted


@pytest.mark.parametrize("history", [10, 10_000])
def test_every_call_is_one_store_call_at_10_and_10000(db_path: str, history: int) -> None:
    """Adding a turn is one append to c.tail, get_items(20) one slice of it (its header
    too when the history is shorter), pop_item one pop, get_items() one items(): the
    same at 10 and at 10,000 items (10,000 of ~125 bytes fill a first chunk)."""

    async def main() -> None:
        s = AgentStateSession("flat", db_path=db_path)
        for i in range(0, history, 500):
            await s.add_items([{"role": "user", "content": f"message {n}" + "x" * 100}
                               for n in range(i, min(i + 500, history))])
        assert s._scope.get("meta")["last"] == (-1 if history == 10 else 0)
        counting = _Counting(s._scope)
        s._scope = counting  # type: ignore[assignment]
        turn = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
        await s.add_items(turn)
        assert counting.calls == ["append"]
        counting.calls.clear()
        got = await s.get_items(20)
        assert len(got) == min(20, history + 2)
        assert counting.sliced == len(got) + (history < 20)
        assert got[-2:] == turn
        assert counting.calls == ["slice"]
        counting.calls.clear()
        assert await s.pop_item() == turn[1]
        assert counting.calls == ["pop"]
        counting.calls.clear()
        assert len(await s.get_items()) == history + 1
        assert counting.calls == ["items"]
        s.close()

    asyncio.run(main())


# -- processes ------------------------------------------------------------------------


def _adder(path: str, who: int, batches: int, start: Any, results: Any) -> None:
    async def main() -> None:
        s = AgentStateSession("shared", db_path=path)
        start.wait()
        for b in range(batches):
            await s.add_items([{"who": who, "batch": b, "k": k} for k in range(3)])
        s.close()

    asyncio.run(main())
    results.put(who)


def _popper(path: str, who: int, start: Any, results: Any) -> None:
    async def main() -> list[Any]:
        s = AgentStateSession("shared", db_path=path)
        start.wait()
        popped = []
        while (item := await s.pop_item()) is not None:
            popped.append(item["n"])
        s.close()
        return popped

    results.put((who, asyncio.run(main())))


def _race(target: Any, args_for: Any, n: int) -> list[Any]:
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(w), start, results)) for w in range(n)]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return out


def test_processes_adding_to_one_session_lose_and_double_nothing(db_path: str) -> None:
    """4 processes x 30 add_items of 3 items, started together: all 360 items, each
    once, each call's 3 items side by side, each process's calls in its order."""
    agentstate.open(db_path).close()
    assert sorted(_race(_adder, lambda w: (db_path, w, 30), 4)) == [0, 1, 2, 3]

    async def check() -> None:
        s = AgentStateSession("shared", db_path=db_path)
        items = await s.get_items()
        s.close()
        assert len(items) == 360
        assert len({(x["who"], x["batch"], x["k"]) for x in items}) == 360
        for i in range(0, 360, 3):
            assert [x["k"] for x in items[i:i + 3]] == [0, 1, 2]
            assert len({(x["who"], x["batch"]) for x in items[i:i + 3]}) == 1
        for w in range(4):
            assert [x["batch"] for x in items if x["who"] == w and x["k"] == 0] == list(range(30))

    asyncio.run(check())


def test_processes_popping_one_session_never_get_the_same_item(db_path: str) -> None:
    """4 processes pop 200 items until empty: every item popped exactly once, and each
    process sees them newest first."""

    async def fill() -> None:
        s = AgentStateSession("shared", db_path=db_path)
        await s.add_items([{"n": n} for n in range(200)])
        s.close()

    asyncio.run(fill())
    popped = dict(_race(_popper, lambda w: (db_path, w), 4))
    everything = [n for got in popped.values() for n in got]
    assert sorted(everything) == list(range(200))
    for got in popped.values():
        assert got == sorted(got, reverse=True)


# -- threads: reads never tear -----------------------------------------------------------


@pytest.mark.parametrize("tries", [oa.READ_TRIES, 0])
def test_reads_never_see_half_a_write(db_path: str, small_chunks: None,
                                      monkeypatch: pytest.MonkeyPatch, tries: int) -> None:
    """While a writer adds 4-item calls, pops and clears across chunk and part borders,
    every get_items() is a history the writer committed, every get_items(4) the newest
    4 of one, and each committed history is read (tries=0: every read is the locked one)."""
    monkeypatch.setattr(oa, "READ_TRIES", tries)
    done, turn = threading.Event(), threading.Condition()
    pairs = [0]  # read pairs finished by the reader
    states: list[tuple[Any, ...]] = [()]  # every history the writer committed, in order
    errors: list[BaseException] = []

    def two_more_reads() -> None:
        """The second pair of reads to finish from now starts after this commit."""
        with turn:
            target = pairs[0] + 2
            assert turn.wait_for(lambda: pairs[0] >= target, timeout=30)

    def writer() -> None:
        async def main() -> None:
            s = _small(AgentStateSession("torn", db_path=db_path))
            model: list[Any] = []

            async def committed() -> None:
                states.append(tuple(model))
                await asyncio.to_thread(two_more_reads)

            for b in range(120):
                # the last item of each call is over CHUNK_BYTES: kept in bytes parts
                batch = [(b, k) for k in range(4)]
                await s.add_items([{"b": b, "k": k, "pad": "x" * (300 if k == 3 else 40)}
                                   for b, k in batch])
                model += batch
                await committed()
                for _ in range(3 if b % 7 == 6 else 0):
                    await s.pop_item()
                    model.pop()
                    await committed()
                if b % 50 == 49:
                    await s.clear_session()
                    model.clear()
                    await committed()
            s.close()

        try:
            asyncio.run(main())
        except BaseException as e:  # reported by the test thread
            errors.append(e)
        finally:
            done.set()

    async def reader() -> list[tuple[str, tuple[Any, ...]]]:
        s = AgentStateSession("torn", db_path=db_path)
        reads = []
        while not done.is_set():
            for kind, items in (("all", await s.get_items()), ("newest", await s.get_items(4))):
                reads.append((kind, tuple((x["b"], x["k"]) for x in items)))
            with turn:
                pairs[0] += 1
                turn.notify_all()
        s.close()
        return reads

    t = threading.Thread(target=writer)
    t.start()
    try:
        reads = asyncio.run(reader())
    finally:
        t.join()
    assert errors == []
    whole, newest = set(states), {state[-4:] for state in states}
    for kind, items in reads:
        assert items in (whole if kind == "all" else newest)
    assert {items for kind, items in reads if kind == "all"} == whole


# -- the event loop and cancellation ------------------------------------------------------


def _hold_write_lock(path: str, locked: threading.Event, release: threading.Event) -> None:
    """Another connection holds the write lock until `release` (at most 30 s)."""
    with agentstate.open(path) as other, other.transaction():
        other.scope("app", "holder").put("k", 1)
        locked.set()
        release.wait(30)


def test_event_loop_runs_while_add_items_waits_for_the_lock(db_path: str) -> None:
    """With another connection holding the write lock, add_items waits in a worker
    thread: the loop runs 50 ticks meanwhile, and get_items answers without waiting."""
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db_path, locked, release))

    async def main() -> None:
        s = AgentStateSession("loop", agentstate.open(db_path, busy_timeout=60))
        await s.add_items([{"n": 0}])
        holder.start()
        await asyncio.to_thread(locked.wait, 30)
        adding = asyncio.create_task(s.add_items([{"n": 1}]))
        ticks = 0
        while ticks < 50:
            await asyncio.sleep(0.005)
            assert not adding.done()  # still waiting on the lock
            ticks += 1
        assert await s.get_items() == [{"n": 0}]  # a read takes no lock
        release.set()
        await adding
        assert await s.get_items() == [{"n": 0}, {"n": 1}]
        s.db.close()

    try:
        asyncio.run(main())
    finally:
        release.set()
        holder.join()


def test_cancelled_add_items_settles_before_it_raises(db_path: str) -> None:
    """add_items cancelled while it waits for the lock raises CancelledError only once
    its transaction ended: after the lock is released all its items are there, whole."""
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db_path, locked, release))

    async def main() -> None:
        s = AgentStateSession("cancel", agentstate.open(db_path, busy_timeout=60))
        holder.start()
        await asyncio.to_thread(locked.wait, 30)
        adding = asyncio.create_task(s.add_items([{"n": k} for k in range(5)]))
        await asyncio.sleep(0.05)
        adding.cancel()
        await asyncio.sleep(0.05)
        adding.cancel()
        assert not adding.done()  # it waits for the outcome, not for the caller
        assert await s.get_items() == []
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await adding
        assert await s.get_items() == [{"n": k} for k in range(5)]
        s.db.close()

    try:
        asyncio.run(main())
    finally:
        release.set()
        holder.join()


def test_cancelled_add_items_that_fails_writes_nothing(db_path: str) -> None:
    """A cancelled add_items whose transaction then fails (Busy past busy_timeout)
    raises CancelledError and leaves nothing written."""
    locked, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_write_lock, args=(db_path, locked, release))

    async def main() -> None:
        s = AgentStateSession("cancel", agentstate.open(db_path, busy_timeout=0.3))
        holder.start()
        await asyncio.to_thread(locked.wait, 30)
        adding = asyncio.create_task(s.add_items([{"n": k} for k in range(5)]))
        await asyncio.sleep(0)
        adding.cancel()
        with pytest.raises(asyncio.CancelledError):
            await adding  # the worker gave up with Busy meanwhile
        release.set()
        await asyncio.to_thread(holder.join)
        assert await s.get_items() == []
        s.db.close()

    try:
        asyncio.run(main())
    finally:
        release.set()
        holder.join()


def test_add_items_cancelled_at_random_moments_lands_whole_or_not_at_all(db_path: str) -> None:
    """200 add_items of 5 items, each cancelled after a random delay: the history is
    whole calls only, and every call that returned normally is in it."""

    async def main() -> None:
        s = AgentStateSession("random", db_path=db_path)
        rnd = random.Random(7)
        finished = set()
        for b in range(200):
            task = asyncio.create_task(s.add_items([{"b": b, "k": k} for k in range(5)]))
            await asyncio.sleep(rnd.choice([0, 0, 0.0005, 0.001, 0.003]))
            task.cancel()
            try:
                await task
                finished.add(b)
            except asyncio.CancelledError:
                pass
        items = await s.get_items()
        assert len(items) % 5 == 0
        calls = [items[i:i + 5] for i in range(0, len(items), 5)]
        for call in calls:
            assert [x["k"] for x in call] == [0, 1, 2, 3, 4] and len({x["b"] for x in call}) == 1
        assert finished <= {call[0]["b"] for call in calls}
        s.close()

    asyncio.run(main())


# -- opening, closing, ids ---------------------------------------------------------------


def test_close_refuses_later_calls_and_closes_only_what_it_opened(tmp_path: Path) -> None:
    """After close() every call raises SessionClosed (a RuntimeError, like SQLiteSession's);
    close() is idempotent; a Database passed in stays open; one opened from a path closes."""
    path = str(tmp_path / "a.db")

    async def main() -> None:
        db = agentstate.open(path)
        lent = AgentStateSession("a", db)
        owned = AgentStateSession("a", path)
        await owned.add_items([{"n": 1}])
        for s in (lent, owned):
            s.close()
            s.close()
            for call in (s.get_items(), s.add_items([]), s.pop_item(), s.clear_session()):
                with pytest.raises(SessionClosed, match="is closed"):
                    await call
        assert isinstance(SessionClosed("x"), RuntimeError)
        assert db.scope("app", "x").get("k") is None  # still open
        with pytest.raises(agentstate.Closed):
            owned.db.scope("app", "x").get("k")
        db.close()

    asyncio.run(main())


def test_memory_path_is_a_private_file_removed_on_close() -> None:
    """db_path=":memory:" opens a temporary file of its own and close() removes it."""
    s = AgentStateSession("m", db_path=":memory:")
    folder = os.path.dirname(s.db.path)
    asyncio.run(s.add_items([{"n": 1}]))
    assert asyncio.run(s.get_items()) == [{"n": 1}]
    s.close()
    assert not os.path.exists(folder)


def test_no_path_opens_the_agentstate_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With neither db nor db_path the session opens agentstate.open(): $AGENTSTATE_DB."""
    monkeypatch.setenv("AGENTSTATE_DB", str(tmp_path / "env.db"))
    s = AgentStateSession("d")
    assert s.db.path == str(tmp_path / "env.db")
    s.close()


def test_bad_arguments_are_refused_before_any_file_is_made(tmp_path: Path) -> None:
    """Both db and db_path, an unknown setting or an id too long: refused, no file made."""
    path = tmp_path / "never.db"
    with pytest.raises(TypeError):
        AgentStateSession("a", str(path), db_path=str(path))
    with pytest.raises(TypeError, match="limitt"):
        AgentStateSession("a", db_path=str(path), session_settings={"limitt": 1})
    with pytest.raises(agentstate.InvalidKey):
        AgentStateSession("é" * 40, db_path=str(path))
    assert not path.exists()


@given(st.text(max_size=60))
def test_session_ids_map_to_scope_ids_and_back(session_id: str) -> None:
    """Any session id has a scope id that follows the key rules and gives it back,
    or, past 200 characters once escaped, is refused with InvalidKey."""
    try:
        sid = scope_id(session_id)
    except agentstate.InvalidKey:
        escaped = sum(1 if c.isascii() and (c.isalnum() or c in "._-") else
                      3 * len(c.encode("utf-8", "surrogatepass")) for c in session_id)
        assert len(oa.SCOPE_PREFIX) + escaped > 200
        return
    assert session_id_of(sid) == session_id
    assert re.fullmatch(r"[A-Za-z0-9._:-]{1,200}", sid)


def test_sessions_are_apart_whatever_their_ids(db_path: str) -> None:
    """Ids that differ only where escaping applies ("a b", "a:20b", "a_b") never share items."""

    async def main() -> None:
        db = agentstate.open(db_path)
        ids = ["a b", "a:20b", "a_b", "a%20b", ""]
        for sid in ids:
            await AgentStateSession(sid, db).add_items([{"id": sid}])
        for sid in ids:
            assert await AgentStateSession(sid, db).get_items() == [{"id": sid}]
        db.close()

    asyncio.run(main())


def test_runner_keeps_the_conversation_in_the_session(db_path: str) -> None:
    """Runner.run with the session: the second turn's model input holds the first turn."""

    async def main() -> None:
        model = ScriptedModel()
        agent = Agent(name="t", model=model)
        s = AgentStateSession("runner", db_path=db_path)
        model.enqueue([_text("Paris")])
        await Runner.run(agent, "Capital of France?", session=s)
        model.enqueue([_text("About 2 million")])
        await Runner.run(agent, "How many people live there?", session=s)
        contents = [str(x.get("content")) for x in model.calls[-1].input]
        assert "Capital of France?" in contents[0] and "Paris" in contents[1]
        assert len(await s.get_items()) == 4
        s.close()

    asyncio.run(main())


def _text(text: str) -> Any:
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    return ResponseOutputMessage(
        id="m", type="message", role="assistant", status="completed",
        content=[ResponseOutputText(text=text, type="output_text", annotations=[])])
