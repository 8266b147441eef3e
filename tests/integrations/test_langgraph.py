"""AgentStateSaver and AgentStateStore beyond LangGraph's own suites: a real
graph, growth that stays flat, values over 1 MiB, ids of any length, pruning
that keeps what the survivors use, real processes racing on one thread, and
async calls that never block the loop and end whole when cancelled."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from typing import Annotated, Any, TypedDict

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import agentstate
from agentstate.integrations.langgraph import AgentStateSaver, AgentStateStore
from agentstate.integrations.langgraph._common import descending, esc, unesc

from ..conftest import on_postgres, target
from agentstate.integrations.langgraph._layout import names

# -- helpers ---------------------------------------------------------------------------


def config(thread: str, ns: str = "", cid: str | None = None) -> dict[str, Any]:
    conf = {"thread_id": thread, "checkpoint_ns": ns}
    if cid:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


def checkpoint(cid: str, values: dict[str, Any], versions: dict[str, Any]) -> dict[str, Any]:
    return {"v": 1, "id": cid, "ts": "2026-12-01T00:00:00+00:00", "channel_values": values,
            "channel_versions": versions, "versions_seen": {}, "updated_channels": None}


def cid(n: int, prefix: str = "1f0") -> str:
    """Checkpoint ids that sort like LangGraph's (uuid6: later is larger)."""
    return f"{prefix}{n:05d}-0000-6000-8000-000000000000"


def chain(saver, thread, n, *, size=200, start=None, ns="", tag="m", writes=False):
    """Put ``n`` checkpoints, each adding one ``size``-byte message to a list
    channel and leaving a large unchanged channel alone; returns their ids."""
    parent = start
    messages = []
    if start:
        messages = list(saver.get_tuple(config(thread, ns, start)).checkpoint["channel_values"]["messages"])
    ids = []
    for i in range(n):
        messages = messages + [f"{tag}{i}:" + "x" * size]
        c = cid(len(messages))
        values = {"messages": messages, "docs": "D" * 5000}
        versions = {"messages": len(messages), "docs": 1}
        new = {"messages": len(messages)} if parent else versions
        got = saver.put(config(thread, ns, parent), checkpoint(c, values, versions),
                        {"source": "loop", "step": len(messages), "run_id": f"run-{tag}"}, new)
        if writes:
            saver.put_writes(got, [("messages", f"pending {i}")], f"task-{i}")
        parent = got["configurable"]["checkpoint_id"]
        ids.append(parent)
    return ids


def in_two_processes(worker, args_of, wait: float = 120) -> list[Any]:
    """Run ``worker(*args_of(name, barrier, queue))`` in two spawned processes ("a", "b"),
    which meet at the barrier; what each put in the queue, once both ended well."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=worker, args=args_of(w, barrier, out)) for w in "ab"]
    for p in procs:
        p.start()
    results = [out.get(timeout=wait) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return results


def stored_bytes(db: agentstate.Database, scope: agentstate.Scope) -> int:
    """Bytes of every checkpoint record and channel blob of a thread."""
    total = 0
    for key in scope.list(""):
        if key.startswith("b."):
            total += len(scope.get_bytes(key))
        elif key.startswith("c."):
            total += len(scope.get_bytes(key))
    return total


@pytest.fixture
def saver(db):
    return AgentStateSaver(db)


# -- a real graph ----------------------------------------------------------------------


class State(TypedDict):
    messages: Annotated[list, add_messages]
    step: int
    docs: str


def _node(state: State) -> dict[str, Any]:
    n = state["step"]
    update: list[Any] = [AIMessage(f"reply {n}", id=f"a{n}")]
    if n % 7 == 6:  # now and then an old message goes: the list is no longer a prefix
        update.append(RemoveMessage(id=f"h{n - 3}"))
    return {"messages": update, "step": n + 1}


def _graph(checkpointer):
    b = StateGraph(State)
    b.add_node("reply", _node)
    b.add_edge(START, "reply")
    b.add_edge("reply", END)
    return b.compile(checkpointer=checkpointer)


def test_a_real_graph_reads_back_as_with_the_in_memory_saver(saver):
    """State and full history of a message graph (with removals) equal InMemorySaver's,
    and the message list is stored as few segments."""
    ours, theirs = _graph(saver), _graph(InMemorySaver())
    cfg = config("chat")
    for i in range(40):
        update = {"messages": [HumanMessage("hi " * 50 + str(i), id=f"h{i}")], "step": i,
                  "docs": "D" * 3000 if i < 2 else "constant"}
        assert ours.invoke(update, cfg) == theirs.invoke(update, cfg)
    assert ours.get_state(cfg).values == theirs.get_state(cfg).values
    mine = [s.values for s in ours.get_state_history(cfg)]
    assert mine == [s.values for s in theirs.get_state_history(cfg)] and len(mine) == 120
    scope = saver._scope("chat")
    newest = scope.get(next(k for k in scope.list("c..") if k.endswith(".r")))
    assert len(newest["channels"]["messages"]["segs"]) <= 10


def test_async_graph_and_history(saver):
    graph = _graph(saver)

    async def main():
        cfg = config("async-chat")
        for i in range(5):
            await graph.ainvoke({"messages": [HumanMessage(f"q{i}", id=f"h{i}")], "step": i,
                                 "docs": ""}, cfg)
        state = await graph.aget_state(cfg)
        history = [s async for s in graph.aget_state_history(cfg)]
        return state, history

    state, history = asyncio.run(main())
    assert [m.content for m in state.values["messages"]] == sum(
        ([f"q{i}", f"reply {i}"] for i in range(5)), [])
    assert len(history) == 15


# -- growth ------------------------------------------------------------------------------


def test_adding_a_checkpoint_writes_the_new_items_not_the_history(tmp_path):
    """Bytes stored per checkpoint grow with log(history), not with history: a thread
    of 1,000 checkpoints, each one 200-byte message longer, holds a few MB, where
    copying the list each time (LangGraph's SQLite saver) holds 100 MB."""
    db = agentstate.open(str(tmp_path / "growth.db"), durability="normal")
    saver = AgentStateSaver(db)
    chain(saver, "short", 100)
    chain(saver, "long", 1000)
    per_short = stored_bytes(db, saver._scope("short")) / 100
    per_long = stored_bytes(db, saver._scope("long")) / 1000
    assert per_long < 1.5 * per_short  # 10x the history, not 10x the bytes
    assert per_long < 0.05 * 1000 * 200  # a copy per checkpoint averages 100 KB here
    tup = saver.get_tuple(config("long"))
    assert len(tup.checkpoint["channel_values"]["messages"]) == 1000
    assert tup.checkpoint["channel_values"]["messages"][-1] == "m999:" + "x" * 200
    db.close()


# -- sizes and ids -----------------------------------------------------------------------


def test_values_and_writes_over_one_mib_round_trip(saver):
    big = "B" * (2_600_000)
    items = ["i" * 300_000 for _ in range(5)]  # list items over the inline size
    stored = saver.put(config("big"), checkpoint(cid(1), {"big": big, "items": items},
                                                 {"big": 1, "items": 1}), {"step": 0},
                       {"big": 1, "items": 1})
    grown = items + ["j" * 1_500_000]
    second = saver.put(config("big", cid=cid(1)),
                       checkpoint(cid(2), {"big": big, "items": grown}, {"big": 1, "items": 2}),
                       {"step": 1}, {"items": 2})
    saver.put_writes(second, [("out", b"\x00" * 1_500_000)], "task")
    first = saver.get_tuple(stored).checkpoint["channel_values"]
    assert first == {"big": big, "items": items}
    tup = saver.get_tuple(config("big"))
    assert tup.checkpoint["channel_values"] == {"big": big, "items": grown}
    assert tup.pending_writes == [("task", "out", b"\x00" * 1_500_000)]
    assert [t.checkpoint["id"] for t in saver.list(config("big"))] == [cid(2), cid(1)]


def test_ids_of_any_length_and_characters(saver):
    thread = "thread/" + "é" * 300
    ns = "parent:" + "n" * 120 + "|child:ü"
    task = "t" * 500
    stored = saver.put(config(thread, ns), checkpoint(cid(1), {"v": 1}, {"v": 1}), {"step": 0},
                       {"v": 1})
    saver.put_writes(stored, [("v", 2)], task)
    tup = saver.get_tuple(config(thread, ns))
    assert tup.config["configurable"] == {"thread_id": thread, "checkpoint_ns": ns,
                                          "checkpoint_id": cid(1)}
    assert tup.pending_writes == [(task, "v", 2)]
    assert [t.config["configurable"]["thread_id"] for t in saver.list(None)] == [thread]
    assert [t.config["configurable"]["checkpoint_ns"] for t in saver.list({"configurable": {"thread_id": thread}})] \
        == [ns]


def test_list_merges_namespaces_and_threads_newest_first(saver):
    for n, (thread, ns) in enumerate([("a", ""), ("b", "x:1"), ("a", "y:2"), ("b", ""), ("a", "")]):
        saver.put(config(thread, ns), checkpoint(cid(n), {}, {}), {"step": n, "source": "loop"}, {})
    assert [t.metadata["step"] for t in saver.list(None)] == [4, 3, 2, 1, 0]
    assert [t.metadata["step"] for t in saver.list({"configurable": {"thread_id": "a"}})] == [4, 2, 0]
    everywhere = {"configurable": {"thread_id": "b", "checkpoint_ns": None}}
    assert [t.metadata["step"] for t in saver.list(everywhere)] == [3, 1]
    assert [t.metadata["step"] for t in saver.list(None, before=config("a", cid=cid(3)), limit=2)] \
        == [2, 1]
    assert [t.metadata["step"] for t in saver.list(None, filter={"step": 3})] == [3]


# -- never overwriting, deleting what is unused ------------------------------------------


def test_a_checkpoint_id_with_other_content_is_refused(saver):
    first = checkpoint(cid(1), {"v": "mine"}, {"v": 1})
    saver.put(config("t"), first, {"step": 0}, {"v": 1})
    saver.put(config("t"), first, {"step": 0}, {"v": 1})  # a retry: nothing changes
    with pytest.raises(agentstate.VersionConflict):
        saver.put(config("t"), checkpoint(cid(1), {"v": "theirs"}, {"v": 1}), {"step": 0}, {"v": 1})
    assert saver.get_tuple(config("t")).checkpoint["channel_values"] == {"v": "mine"}
    assert len(list(saver.list(config("t")))) == 1


def test_a_record_of_a_newer_format_is_refused(saver):
    stored = saver.put(config("f"), checkpoint(cid(1), {"v": 1}, {"v": 1}), {"step": 0}, {"v": 1})
    scope, key = saver._scope("f"), names("", cid(1))[1] + ".r"
    record = scope.get(key)
    scope.put(key, {**record, "format": 3})
    with pytest.raises(agentstate.SchemaTooNew):
        saver.get_tuple(stored)


def test_prune_and_delete_for_runs_keep_the_bytes_survivors_use(db, saver):
    """The unchanged 5 KB channel was written by the first checkpoint only; the
    newest still reads it after everything older is pruned or its run deleted."""
    ids = chain(saver, "p", 30, writes=True, tag="old")
    chain(saver, "p", 5, start=ids[-1], tag="new", writes=True)
    saver.delete_for_runs(["run-old"])
    tups = list(saver.list(config("p")))
    assert [t.metadata["run_id"] for t in tups] == ["run-new"] * 5
    assert tups[0].checkpoint["channel_values"]["docs"] == "D" * 5000
    assert len(tups[0].checkpoint["channel_values"]["messages"]) == 35
    saver.prune(["p"])
    (only,) = saver.list(config("p"))
    assert only.checkpoint["channel_values"]["docs"] == "D" * 5000
    assert only.pending_writes == [("task-4", "messages", "pending 4")]
    scope = saver._scope("p")
    kept = names("", only.checkpoint["id"])[1]
    assert [k for k in scope.list("c.")] == [f"{kept}.p", f"{kept}.r"]
    saver.delete_thread("p")
    assert scope.list("") == [] and list(saver.list(None)) == []
    assert db.scope("app", "langgraph.saver").list("") == []


def test_a_put_whose_parent_another_saver_deleted_stores_its_own_bytes(any_db):
    """A saver remembers the parent it wrote last, and a put points at that parent's
    channel bytes; its one batch checks the parent is still the one it read. Deleted
    meanwhile (by another saver: this one's memory still has it), the check refuses the
    batch, nothing is written, and the put is made again without the parent, with bytes of
    its own. Without the check the record would point at bytes that are gone."""
    saver, other = AgentStateSaver(any_db), AgentStateSaver(any_db)
    ids = chain(saver, "gone", 2)
    other.delete_thread("gone")
    messages = ["m0:" + "x" * 200, "m1:" + "x" * 200, "m2:" + "x" * 200]
    got = saver.put(config("gone", "", ids[-1]),
                    checkpoint(cid(3), {"messages": messages, "docs": "D" * 5000},
                               {"messages": 3, "docs": 1}),
                    {"source": "loop", "step": 3, "run_id": "run-m"}, {"messages": 3})
    values = saver.get_tuple(got).checkpoint["channel_values"]
    assert values == {"messages": messages, "docs": "D" * 5000}
    assert [t.config["configurable"]["checkpoint_id"] for t in saver.list(config("gone"))] == [cid(3)]


def test_steady_puts_are_one_batch_each_and_index_each_new_run(any_db, monkeypatch):
    """After the first, a put whose channel bytes are inline or its parent's is one
    batch (one write); one that starts a new run indexes the run in the same batch, so
    delete_for_runs finds it."""
    saver = AgentStateSaver(any_db)
    ids = chain(saver, "steady", 2, tag="a")
    batches, transactions = [], []  # a batch: one call of the ops' apply_batch (db.batch's too)
    real_batch, real_txn = any_db._ops.apply_batch, type(any_db).transaction
    monkeypatch.setattr(any_db._ops, "apply_batch", lambda ops: (batches.append(1), real_batch(ops))[1])
    monkeypatch.setattr(type(any_db), "transaction", lambda self: (transactions.append(1), real_txn(self))[1])
    more = chain(saver, "steady", 3, start=ids[-1], tag="b")  # a new run: run-b
    assert (len(batches), len(transactions)) == (3, 0)
    monkeypatch.undo()
    saver.delete_for_runs(["run-b"])
    assert [t.config["configurable"]["checkpoint_id"] for t in saver.list(config("steady"))] == ids[::-1]
    assert saver.get_tuple(config("steady", "", more[0])) is None


def test_prune_keeps_the_ancestors_a_delta_channel_needs(saver):
    """keep_latest keeps the newest checkpoint's ancestors back to the first whose
    metadata has no delta counters (there every DeltaChannel has its snapshot)."""
    parent, ids = None, []
    counters = [None, {"d": [1, 1]}, None, {"d": [1, 1]}, {"d": [2, 2]}]
    for i, counter in enumerate(counters):
        meta = {"step": i, **({"counters_since_delta_snapshot": counter} if counter else {})}
        parent = saver.put(config("delta", cid=parent), checkpoint(cid(i), {"v": i}, {"v": i + 1}),
                           meta, {"v": i + 1})["configurable"]["checkpoint_id"]
        ids.append(parent)
    saver.prune(["delta"])
    assert [t.checkpoint["id"] for t in saver.list(config("delta"))] == ids[:1:-1]


def test_copy_outlives_its_source(saver):
    chain(saver, "src", 12, writes=True)
    saver.copy_thread("src", "dst")
    saver.delete_thread("src")
    tup = saver.get_tuple(config("dst"))
    assert len(tup.checkpoint["channel_values"]["messages"]) == 12
    assert tup.pending_writes == [("task-11", "messages", "pending 11")]
    saver.delete_for_runs(["run-m"])
    assert list(saver.list(None)) == []


# -- processes ---------------------------------------------------------------------------


def _fork_worker(path: str, who: str, parent: str, barrier: Any, out: Any) -> None:
    """Extend the shared parent by 15 checkpoints with the same integer versions as
    the other worker (the versions LangGraph's base saver hands out) but other values."""
    with agentstate.open(path) as db:
        saver = AgentStateSaver(db)
        barrier.wait()
        prev, written = parent, []
        for i in range(15):
            c = f"1f1{i:05d}-0000-6000-8000-{who * 12}"
            msgs = [f"{who}{j}:" + who * 600 for j in range(i + 1)]  # lists over the inline size
            got = saver.put(config("shared", cid=prev), checkpoint(c, {"msgs": msgs, "base": "B"},
                                                                   {"msgs": i + 2, "base": 1}),
                            {"step": i, "who": who}, {"msgs": i + 2})
            saver.put_writes(got, [("msgs", f"{who}-write-{i}")], "task")
            prev = c
            written.append((c, msgs))
        out.put(written)


def test_two_processes_extending_one_thread_never_overwrite_each_other(any_db):
    """Two processes fork one thread from the same checkpoint at the same moment,
    with equal channel versions: every checkpoint of both reads back as its writer
    left it (LangGraph's savers key channel bytes by version, so one would read the
    other's). On both backends: puts as one batch where they can, else a transaction."""
    saver = AgentStateSaver(any_db)
    root = saver.put(config("shared"), checkpoint(cid(0), {"msgs": [], "base": "B"},
                                                  {"msgs": 1, "base": 1}), {"step": -1},
                     {"msgs": 1, "base": 1})["configurable"]["checkpoint_id"]
    results = in_two_processes(_fork_worker, lambda w, barrier, out: (target(any_db), w, root,
                                                                       barrier, out))
    for written in results:
        for c, msgs in written:
            tup = saver.get_tuple(config("shared", cid=c))
            assert tup.checkpoint["channel_values"] == {"msgs": msgs, "base": "B"}
            who = msgs[0][0]
            assert tup.pending_writes == [("task", "msgs", f"{who}-write-{len(msgs) - 1}")]
    assert len(list(saver.list(config("shared")))) == 31


def _same_id_worker(path: str, who: str, barrier: Any, out: Any) -> None:
    with agentstate.open(path) as db:
        saver = AgentStateSaver(db)
        barrier.wait()
        try:
            saver.put(config("race"), checkpoint(cid(7), {"v": who * 3000}, {"v": 1}),
                      {"who": who}, {"v": 1})
            out.put((who, "stored"))
        except agentstate.VersionConflict:
            out.put((who, "refused"))


def test_two_processes_putting_one_checkpoint_id_one_wins_whole(any_db):
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_same_id_worker, args=(target(any_db), w, barrier, out))
             for w in "ab"]
    for p in procs:
        p.start()
    outcome = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    assert sorted(outcome.values()) == ["refused", "stored"]
    (winner,) = [w for w, o in outcome.items() if o == "stored"]
    tup = AgentStateSaver(any_db).get_tuple(config("race"))
    assert tup.checkpoint["channel_values"] == {"v": winner * 3000}
    assert tup.metadata["who"] == winner


# -- async -----------------------------------------------------------------------------


class Ticker:
    """Counts how often the event loop got to run while something else was awaited."""

    def __init__(self) -> None:
        self.ticks = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.ticks += 1
            await asyncio.sleep(0.01)


def hold_write_lock(path: str, seconds: float, started: threading.Event) -> threading.Thread:
    """Another connection holds the file's write lock for ``seconds``."""

    def hold() -> None:
        with agentstate.open(path) as other, other.transaction():
            other.scope("app", "holder").put("k", 1)
            started.set()
            time.sleep(seconds)

    t = threading.Thread(target=hold)
    t.start()
    started.wait(10)
    return t


def test_async_calls_wait_for_the_lock_without_blocking_the_loop(db, db_path, saver):
    """While another writer holds the lock, aput, aget_tuple, alist and the store's
    abatch wait in worker threads: the loop keeps ticking."""
    store = AgentStateStore(db)
    holder = hold_write_lock(db_path, 0.6, threading.Event())

    async def main():
        ticker, stop = Ticker(), asyncio.Event()
        tick = asyncio.create_task(ticker.run(stop))
        await saver.aput(config("t"), checkpoint(cid(1), {"v": 1}, {"v": 1}), {"step": 0}, {"v": 1})
        await store.aput(("ns",), "k", {"v": 1})
        ticks_while_locked = ticker.ticks
        assert (await saver.aget_tuple(config("t"))).checkpoint["channel_values"] == {"v": 1}
        assert [t.checkpoint["id"] async for t in saver.alist(config("t"))] == [cid(1)]
        assert (await store.aget(("ns",), "k")).value == {"v": 1}
        stop.set()
        await tick
        return ticks_while_locked

    assert asyncio.run(main()) >= 10  # 0.6 s of lock at 10 ms a tick; 0 if the loop were blocked
    holder.join()


def test_aget_tuple_reads_a_file_on_the_loop_s_thread(any_db, monkeypatch):
    """On a file aget_tuple reads on the loop's own thread (a read there costs less
    than the hop to a worker, and never waits for a writer in WAL mode); on PostgreSQL
    (round trips) it goes to a worker thread. Either way it gives get_tuple's answer."""
    saver = AgentStateSaver(any_db)
    ids = chain(saver, "inline", 3, writes=True)
    hops = []
    real = asyncio.to_thread
    monkeypatch.setattr(asyncio, "to_thread", lambda fn, *a, **kw: (hops.append(fn), real(fn, *a, **kw))[1])

    async def main():
        return [await saver.aget_tuple(config("inline")),
                await saver.aget_tuple(config("inline", "", ids[0])),
                await saver.aget_tuple(config("none"))]

    got = asyncio.run(main())
    assert len(hops) == (3 if on_postgres(any_db) else 0)
    assert got == [saver.get_tuple(config("inline")), saver.get_tuple(config("inline", "", ids[0])),
                   None]
    assert got[0].checkpoint["id"] == ids[-1] and got[0].pending_writes


def test_aget_tuple_on_a_file_waits_for_no_writer(db, db_path, saver):
    """A writer holding the file's lock does not hold up aget_tuple on the loop's
    thread: in WAL mode its read goes on, and sees the last commit."""
    ids = chain(saver, "held", 2)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # until the read is done: a read that waited would wait it out
        with agentstate.open(db_path) as other, other.transaction():
            other.scope("app", "holder").put("k", 1)
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    try:
        tup = asyncio.run(saver.aget_tuple(config("held")))
    finally:
        release.set()
        holder.join()
    assert tup.checkpoint["id"] == ids[-1]


def test_a_cancelled_aput_ends_whole(db_path):
    """Cancelling aput while it waits for the lock cancels the wait; the put still
    commits whole once the lock frees. A put that gives up (Busy) writes nothing."""
    with agentstate.open(db_path) as db:
        saver = AgentStateSaver(db)
        big = {"big": "x" * 3_000_000, "small": 1}
        holder = hold_write_lock(db_path, 0.5, threading.Event())

        async def cancelled():
            task = asyncio.create_task(saver.aput(config("c"), checkpoint(cid(1), big, {"big": 1, "small": 1}),
                                                  {"step": 0}, {"big": 1, "small": 1}))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cancelled())  # returns once the worker thread has finished
        holder.join()
        assert saver.get_tuple(config("c")).checkpoint["channel_values"] == big

    with agentstate.open(db_path, busy_timeout=0.1) as impatient:
        saver = AgentStateSaver(impatient)
        holder = hold_write_lock(db_path, 0.6, threading.Event())
        with pytest.raises(agentstate.Busy):
            asyncio.run(saver.aput(config("d"), checkpoint(cid(1), big, {"big": 1, "small": 1}),
                                   {"step": 0}, {"big": 1, "small": 1}))
        holder.join()
        assert saver._scope("d").list("") == [] and saver.get_tuple(config("d")) is None
        # refused inside the transaction, after its bytes were written: rolled back too
        with pytest.raises(agentstate.InvalidValue):
            saver.put(config("d"), checkpoint(cid(1), big, {"big": 1, "small": 1}),
                      {"step": 0, "score": float("nan")}, {"big": 1, "small": 1})
        assert saver._scope("d").list("") == []


def test_one_saver_and_store_serve_many_event_loops(db, saver):
    """Nothing is bound to a loop: one saver and one store, used from successive
    loops and from two loops in two threads at once."""
    store = AgentStateStore(db)

    async def work(name: str) -> None:
        for i in range(5):
            await saver.aput(config(name), checkpoint(cid(i), {"i": i}, {"i": i + 1}), {"step": i},
                             {"i": i + 1})
            await store.aput((name,), f"k{i}", {"i": i})
        assert (await saver.aget_tuple(config(name))).checkpoint["channel_values"] == {"i": 4}
        assert len(await store.asearch((name,))) == 5

    asyncio.run(work("first"))
    asyncio.run(work("second"))
    errors: list[BaseException] = []

    def in_thread(name: str) -> None:
        try:
            asyncio.run(work(name))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=in_thread, args=(f"thread{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_a_call_inside_a_transaction_of_a_fresh_thread_is_part_of_it(db, saver):
    """A saver call made inside db.transaction() runs in that transaction, whatever the
    thread: rolled back with it, never waiting for the lock its own thread holds."""
    outcome: list[Any] = []

    def fresh() -> None:
        try:
            with db.transaction():
                saver.put(config("t"), checkpoint(cid(1), {"v": 1}, {"v": 1}), {"step": 0},
                          {"v": 1})
                raise KeyError("undo")
        except BaseException as e:  # noqa: BLE001 - reported below
            outcome.append(e)

    thread = threading.Thread(target=fresh)
    thread.start()
    thread.join(60)
    assert [type(e) for e in outcome] == [KeyError]
    assert saver.get_tuple(config("t")) is None


def _in_fresh_thread(fn: Any) -> list[Any]:
    """fn() in a new thread, given a minute: [its result], or [] if it did not return."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(60)
    return out


def _child_reads_from_a_fresh_thread(saver: AgentStateSaver) -> None:
    got = _in_fresh_thread(lambda: saver.get_tuple(config("f")))
    raise SystemExit(0 if got and got[0].checkpoint["channel_values"] == {"v": 1} else 3)


def test_a_forked_child_calls_from_a_fresh_thread(db, saver):
    """A process fork()ed (while idle) after the saver was used from fresh threads calls it
    from a fresh thread of its own: it does not wait for the parent's pool threads."""
    saver.put(config("f"), checkpoint(cid(1), {"v": 1}, {"v": 1}), {"step": 0}, {"v": 1})
    assert _in_fresh_thread(lambda: saver.get_tuple(config("f"))) != []  # ran on the pool
    child = multiprocessing.get_context("fork").Process(target=_child_reads_from_a_fresh_thread,
                                                        args=(saver,))
    child.start()
    child.join(120)
    assert child.exitcode == 0


# -- the store ---------------------------------------------------------------------------


class _RacedScope:
    """A store's scope that counts its get_many calls, and runs another writer's call right
    after the first one."""

    def __init__(self, scope, meanwhile=()):
        self._scope, self._meanwhile, self.reads = scope, list(meanwhile), 0

    def __getattr__(self, name):
        return getattr(self._scope, name)

    def get_many(self, keys):
        self.reads += 1
        found = self._scope.get_many(keys)
        if self._meanwhile:
            self._meanwhile.pop()()
        return found


def _recency_keys(store) -> int:
    return len(store._scope.list("u."))


def test_store_puts_are_one_batch_held_to_what_they_were_decided_on(any_db, monkeypatch):
    """A put without deletes is one batch whose checks hold it to what it was decided on:
    what this store last wrote of the item and namespace (a new item taken for absent),
    or else one read first. A writer that came in between makes the batch refused
    (nothing written) and the put is read and made again: no update is lost, every item
    keeps one recency key, a namespace with items keeps its entry. Without the checks the
    item was written over the other's and the other's recency key stayed (a search listed
    it twice), or a namespace's entry stayed deleted under a new item."""
    store, other = AgentStateStore(any_db), AgentStateStore(any_db)
    store.put(("docs",), "a", {"n": 0})
    batches, transactions = [], []
    real_batch, real_txn = type(any_db).batch, type(any_db).transaction
    monkeypatch.setattr(type(any_db), "batch", lambda self, **kw: (batches.append(1), real_batch(self, **kw))[1])
    monkeypatch.setattr(type(any_db), "transaction", lambda self: (transactions.append(1), real_txn(self))[1])
    store._scope = counted = _RacedScope(store._scope)
    store.put(("docs",), "b", {"n": 1})  # a new item in a namespace this store wrote: no read
    store.put(("docs",), "b", {"n": 2})  # an item it wrote: no read
    assert (len(batches), len(transactions), counted.reads) == (2, 0, 0)
    monkeypatch.undo()
    store._scope = counted._scope

    # what it remembers is stale: the item was written by another store since
    other.put(("docs",), "a", {"n": "other"})
    store.put(("docs",), "a", {"n": "mine"})
    assert store.get(("docs",), "a").value == {"n": "mine"} and _recency_keys(store) == 2
    # a writer between a store's read and its batch (a store that remembers nothing)
    fresh = AgentStateStore(any_db)
    fresh._scope = _RacedScope(fresh._scope, [lambda: other.put(("docs",), "b", {"n": "other"})])
    fresh.put(("docs",), "b", {"n": "fresh"})
    fresh._scope = fresh._scope._scope
    assert store.get(("docs",), "b").value == {"n": "fresh"} and _recency_keys(store) == 2
    assert [i.key for i in store.search(("docs",))] == ["b", "a"]

    # the namespace's last item deleted by another store: the entry this one remembers is
    # gone, and the put makes it again
    store.put(("tmp",), "x", {"n": 1})
    other.delete(("tmp",), "x")
    assert ("tmp",) not in store.list_namespaces()
    store.put(("tmp",), "y", {"n": 2})
    assert [i.key for i in store.search(("tmp",))] == ["y"] and ("tmp",) in store.list_namespaces()
    # ... and deleted between a read and the batch
    other.put(("tmp2",), "x", {"n": 1})
    fresh._scope = _RacedScope(fresh._scope, [lambda: other.delete(("tmp2",), "x")])
    fresh.put(("tmp2",), "y", {"n": 2})
    fresh._scope = fresh._scope._scope
    assert [i.key for i in store.search(("tmp2",))] == ["y"] and ("tmp2",) in store.list_namespaces()


def test_a_remote_database_is_refused_up_front():
    """The adapters' deletes, first puts and fallbacks are transaction() blocks, which a
    remote database cannot run: refused when made, not on some calls later (found by
    review once puts became batches that a remote database can send)."""
    remote = agentstate.connect("http://127.0.0.1:9", token="t" * 40)
    for make in (AgentStateSaver, AgentStateStore):
        with pytest.raises(agentstate.UsageError, match="not a remote one"):
            make(remote)


def test_store_search_pages_newest_first_with_filters(db):
    store = AgentStateStore(db)
    for i in range(30):
        store.put(("mem", "u1" if i % 3 else "u2"), f"k{i}", {"n": i, "tag": "even" if i % 2 == 0 else "odd"})
    store.put(("mem", "u1"), "k1", {"n": 100, "tag": "odd"})  # updated: now the newest
    store.delete(("mem", "u2"), "k27")
    pages = [store.search(("mem",), limit=7, offset=o) for o in range(0, 35, 7)]
    keys = [item.key for page in pages for item in page]
    assert keys == ["k1"] + [f"k{i}" for i in range(29, -1, -1) if i not in (1, 27)]
    assert [i.key for i in store.search(("mem",), filter={"n": {"$gte": 20, "$lt": 25}, "tag": "even"})] \
        == ["k24", "k22", "k20"]
    assert [i.key for i in store.search(("mem", "u2"), filter={"tag": {"$ne": "even"}}, limit=3)] \
        == ["k21", "k15", "k9"]
    assert store.list_namespaces() == [("mem", "u1"), ("mem", "u2")]


def test_store_filtered_search_across_many_reads_matches_a_scan(db):
    """A search whose filter turns down most items reads candidates in several rounds
    (of growing size, two namespaces merged): its pages are a plain scan's, newest first."""
    store = AgentStateStore(db)
    order: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace label, key) -> value, oldest first
    for i in range(360):
        ns, key = "ab"[i % 2], f"k{i % 300}"  # the last 60 update earlier items
        value = {"i": i, "rare": i % 23 == 0, "some": i % 5 == 0}
        store.put(("big", ns), key, value)
        order.pop((ns, key), None)
        order[(ns, key)] = value
    for i in range(0, 300, 7):
        store.delete(("big", "ab"[i % 2]), f"k{i}")
        order.pop(("ab"[i % 2], f"k{i}"), None)
    newest = list(reversed(order.items()))
    for filt in ({"rare": True}, {"some": True}, {"rare": False}):
        want = [key for (_ns, key), v in newest if all(v[f] == x for f, x in filt.items())]
        for limit, offset in ((1, 0), (4, 0), (5, 3), (50, 7)):
            got = [item.key for item in store.search(("big",), filter=filt, limit=limit, offset=offset)]
            assert got == want[offset:offset + limit], (filt, limit, offset)


def test_store_expired_items_are_gone_before_any_sweep(db):
    store = AgentStateStore(db, ttl={"default_ttl": 1 / 60})
    store.put(("t",), "short", {"v": 1})
    store.put(("t",), "kept", {"v": 2}, ttl=None)
    assert store.get(("t",), "short") is not None
    time.sleep(1.3)
    assert store.get(("t",), "short") is None
    assert [i.key for i in store.search(("t",))] == ["kept"]
    assert store.sweep_ttl() == 1 and store.sweep_ttl() == 0
    scope = db.scope("app", "langgraph.store")
    assert not [k for k in scope.list("") if "short" in k]
    store.delete(("t",), "kept")
    assert scope.list("") == [] and store.list_namespaces() == []


def test_store_long_namespaces_and_keys(db):
    store = AgentStateStore(db)
    ns = tuple(f"label{i}-é" * 3 for i in range(12))
    key = "k" * 400
    store.put(ns, key, {"v": "long"})
    store.put(ns[:2], "short", {"v": "short"})
    assert store.get(ns, key).value == {"v": "long"}
    assert [i.key for i in store.search(ns[:1])] == ["short", key]
    assert store.list_namespaces(prefix=ns[:3]) == [ns]
    assert store.list_namespaces(suffix=ns[-1:], max_depth=2) == [ns[:2]]
    store.delete(ns, key)
    assert store.list_namespaces() == [ns[:2]]


def _store_worker(path: str, who: str, barrier: Any) -> None:
    with agentstate.open(path) as db:
        store = AgentStateStore(db)
        barrier.wait()
        for i in range(40):
            store.put(("shared",), f"{who}{i}", {"who": who, "i": i})
            store.put(("shared",), "both", {"who": who, "i": i})
            # a namespace emptied and made again by both processes, each on its own item
            store.put(("churn",), who, {"i": i})
            if i < 39:
                store.delete(("churn",), who)


def test_store_two_processes_one_namespace(any_db):
    """Two processes putting into one namespace (each store with its memory of what it
    wrote, which the other makes stale) and emptying another one and making it again:
    every put is there, one recency key per item, and the namespace has its entry."""
    path = target(any_db)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_store_worker, args=(path, w, barrier)) for w in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    store = AgentStateStore(any_db)
    found = store.search(("shared",), limit=1000)
    assert sorted(i.key for i in found) == sorted(["both"] + [f"{w}{i}" for w in "ab" for i in range(40)])
    assert store.get(("shared",), "both").value["i"] == 39
    churn = store.search(("churn",))
    assert sorted((i.key, i.value["i"]) for i in churn) == [("a", 39), ("b", 39)]
    assert ("churn",) in store.list_namespaces()
    recency = any_db.scope("app", "langgraph.store").list("u.")
    assert len(recency) == len(found) + len(churn)  # one index key per item: none lost, none stale


# -- key encodings -----------------------------------------------------------------------


@given(st.text())
def test_escaped_text_is_a_key_and_comes_back(text):
    e = esc(text)
    assert unesc(e) == text
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in e)


@given(st.binary(max_size=30), st.binary(max_size=30))
def test_descending_keys_reverse_the_order(a, b):
    x, y = a.decode("latin-1"), b.decode("latin-1")
    ax, bx = x.encode("utf-8"), y.encode("utf-8")
    if ax != bx:
        assert (ax < bx) == (descending(x) > descending(y))
