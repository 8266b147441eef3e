"""LangGraph: AgentStateSaver and AgentStateStore beside LangGraph's own SQLite ones.

    python -m benchmarks.adapter_langgraph             # histories of 10 and 10,000 checkpoints
    python -m benchmarks.adapter_langgraph --quick     # a smoke run: 10 and 200 (seconds)
    python -m benchmarks.adapter_langgraph --repeats 7 --out DIR   # writes DIR/ADAPTER-LANGGRAPH.md

Run from the repository root. Systems, each on its own file in one temporary
folder, each with its defaults (what a user gets by passing a path):

- agentstate: ``AgentStateSaver(agentstate.open(path))`` and
  ``AgentStateStore(...)`` (WAL, synchronous=FULL); the async calls are the
  same objects' ``aput``, ``aget_tuple``, ``alist``;
- LangGraph ``SqliteSaver(sqlite3.connect(path))`` and ``AsyncSqliteSaver``
  (aiosqlite) on the same file (WAL, synchronous=FULL), and
  ``SqliteStore.from_conn_string(path)`` (SQLite's default rollback journal:
  the store does not switch to WAL; synchronous=FULL).

Checkpoints (``put``, ``get_tuple`` of the newest, ``list`` of the newest 10):
one thread per system grows to each history length by ``put`` (untimed), each
checkpoint as LangGraph writes it: a step counter and a 200-byte message that
change every step, and a 5 KB context that never changes after the first.
The timed puts extend that thread (so "10" ends near 10 + rounds x puts).

Growing history: a thread whose message list grows by one 200-byte message
per checkpoint (a chat); ``put`` and ``get_tuple`` at two lengths, and the
bytes on disk afterwards (LangGraph's SQLite saver stores the whole list each
time).

Store: one namespace per system with 10 and 10,000 items (``put``, untimed);
timed: ``put`` of a new item, ``get``, ``search`` of the newest 10, and
``search`` with a filter that one item in ten matches.

Rounds visit the systems in a fresh random order; figures are medians of every
timed call of all rounds, in microseconds, with the ratio LangGraph /
agentstate (above 1: agentstate is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

import apsw
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.store.sqlite import SqliteStore

import agentstate
from agentstate.integrations.langgraph import AgentStateSaver, AgentStateStore

HERE = os.path.dirname(os.path.abspath(__file__))
MESSAGE = "The quick brown fox jumps over the lazy dog. " * 4 + "1234567890ab"  # 200 characters
CONTEXT = "C" * 5000


class Savers:
    """The two savers of one comparison, each on its own file, and their async twins."""

    def __init__(self, folder: str) -> None:
        self.db = agentstate.open(os.path.join(folder, "agentstate.db"))
        self.conn = sqlite3.connect(os.path.join(folder, "langgraph.db"), check_same_thread=False)
        self.sync = {"agentstate": AgentStateSaver(self.db), "langgraph": SqliteSaver(self.conn)}
        self.loop = asyncio.new_event_loop()
        self.aio_cm = AsyncSqliteSaver.from_conn_string(os.path.join(folder, "langgraph.db"))
        self.aio = {"agentstate": self.sync["agentstate"],
                    "langgraph": self.loop.run_until_complete(self.aio_cm.__aenter__())}

    def close(self) -> None:
        self.loop.run_until_complete(self.aio_cm.__aexit__(None, None, None))
        self.loop.close()
        self.conn.close()
        self.db.close()


class Chain:
    """One thread, extended one checkpoint at a time as LangGraph's loop extends it
    (the sync and the async saver of a system share it: they share the file)."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id, self.parent, self.step = thread_id, None, 0
        self.messages: list[str] = []

    def _args(self, chat: bool) -> tuple[Any, ...]:
        self.step += 1
        cp = empty_checkpoint()
        if chat:  # the list channel grows by one message
            self.messages = self.messages + [MESSAGE]
            cp["channel_values"] = {"messages": self.messages}
            cp["channel_versions"] = {"messages": self.step}
            new = {"messages": self.step}
        else:
            cp["channel_values"] = {"step": self.step, "last": MESSAGE, "context": CONTEXT}
            cp["channel_versions"] = {"step": self.step, "last": self.step, "context": 1}
            new = {"step": self.step, "last": self.step} if self.parent else dict(cp["channel_versions"])
        conf: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        if self.parent:
            conf["checkpoint_id"] = self.parent
        return {"configurable": conf}, cp, {"source": "loop", "step": self.step, "parents": {}}, new

    def put(self, saver: Any, chat: bool = False) -> None:
        self.parent = saver.put(*self._args(chat))["configurable"]["checkpoint_id"]

    async def aput(self, saver: Any) -> None:
        self.parent = (await saver.aput(*self._args(False)))["configurable"]["checkpoint_id"]


def timed(fn: Callable[[], Any], n: int, out: list[float]) -> None:
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)


def atimed(loop: asyncio.AbstractEventLoop, make: Callable[[], Any], n: int, out: list[float]) -> None:
    async def run() -> None:
        for _ in range(n):
            t = time.perf_counter()
            await make()
            out.append(time.perf_counter() - t)

    loop.run_until_complete(run())


async def alist10(saver: Any, cfg: dict) -> None:
    async for _ in saver.alist(cfg, limit=10):
        pass


def bench_checkpoints(folder: str, histories: list[int], repeats: int, rows: list) -> None:
    s = Savers(folder)
    names = list(s.sync)
    for h in histories:
        chains = {name: Chain(f"h{h}") for name in names}
        for name in names:
            for _ in range(h):
                chains[name].put(s.sync[name])
        cfg = {"configurable": {"thread_id": f"h{h}", "checkpoint_ns": ""}}
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(repeats):
            for name in random.sample(names, len(names)):
                sv, av, chain = s.sync[name], s.aio[name], chains[name]
                get = samples.setdefault
                timed(lambda: chain.put(sv), 5, get(("put", name), []))
                timed(lambda: sv.get_tuple(cfg), 20, get(("get_tuple (newest)", name), []))
                timed(lambda: list(sv.list(cfg, limit=10)), 5, get(("list (newest 10)", name), []))
                atimed(s.loop, lambda: chain.aput(av), 5, get(("aput", name), []))
                atimed(s.loop, lambda: av.aget_tuple(cfg), 20, get(("aget_tuple (newest)", name), []))
                atimed(s.loop, lambda: alist10(av, cfg), 5, get(("alist (newest 10)", name), []))
        for op in dict.fromkeys(k[0] for k in samples):
            rows.append((op, f"{h:,} checkpoints", samples[(op, "agentstate")], samples[(op, "langgraph")]))
    s.close()


def bench_growth(folder: str, lengths: list[int], repeats: int, rows: list, sizes: dict) -> None:
    """put into a chat whose message list grows by one message per checkpoint."""
    s = Savers(folder)
    names = list(s.sync)
    chats = {name: Chain("chat") for name in names}
    for n in lengths:
        for name in names:
            while chats[name].step < n:
                chats[name].put(s.sync[name], chat=True)
        cfg = {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}}
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(repeats):
            for name in random.sample(names, len(names)):
                get = samples.setdefault
                timed(lambda: chats[name].put(s.sync[name], chat=True), 3,
                      get(("put, one more message", name), []))
                timed(lambda: s.sync[name].get_tuple(cfg), 5, get(("get_tuple (newest)", name), []))
        for op in dict.fromkeys(k[0] for k in samples):
            rows.append((op, f"{n:,} messages", samples[(op, "agentstate")], samples[(op, "langgraph")]))
    s.close()
    for name, base in (("agentstate", "agentstate.db"), ("langgraph", "langgraph.db")):
        path = os.path.join(folder, base)
        sizes[name] = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
    sizes["messages"] = chats["agentstate"].step


def bench_store(folder: str, counts: list[int], repeats: int, rows: list) -> None:
    db = agentstate.open(os.path.join(folder, "store-agentstate.db"))
    theirs_cm = SqliteStore.from_conn_string(os.path.join(folder, "store-langgraph.db"))
    theirs = theirs_cm.__enter__()
    theirs.setup()
    stores = {"agentstate": AgentStateStore(db), "langgraph": theirs}
    made = 0
    for n in counts:
        ns = ("users", "u1", f"memories{n}")
        for store in stores.values():
            for i in range(n):
                store.put(ns, f"m{i}", {"text": MESSAGE, "kind": "fact" if i % 10 == 0 else "chat", "i": i})
        samples: dict[tuple[str, str], list[float]] = {}
        for _ in range(repeats):
            for name in random.sample(list(stores), len(stores)):
                store = stores[name]
                get = samples.setdefault
                keys = iter(range(made, made + 10))
                timed(lambda: store.put(ns, f"new{next(keys)}", {"text": MESSAGE, "kind": "chat"}), 5,
                      get(("store put", name), []))
                timed(lambda: store.get(ns, f"m{random.randrange(n)}"), 20, get(("store get", name), []))
                timed(lambda: store.search(ns, limit=10), 5, get(("store search (newest 10)", name), []))
                timed(lambda: store.search(ns, filter={"kind": "fact"}, limit=10), 5,
                      get(("store search, filter 1 in 10", name), []))
            made += 10
        for op in dict.fromkeys(k[0] for k in samples):
            rows.append((op, f"{n:,} items", samples[(op, "agentstate")], samples[(op, "langgraph")]))
    db.close()
    theirs_cm.__exit__(None, None, None)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu}, {os.cpu_count()} cores (shared with other work while it ran), "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"SQLite {apsw.sqlite_lib_version()} (agentstate, apsw) and {sqlite3.sqlite_version} "
            f"(LangGraph, sqlite3), langgraph-checkpoint {metadata.version('langgraph-checkpoint')}, "
            f"langgraph-checkpoint-sqlite {metadata.version('langgraph-checkpoint-sqlite')}")


def table(rows: list) -> list[str]:
    out = ["| operation | size | agentstate µs | LangGraph SQLite µs | LangGraph / agentstate |",
           "|---|---|---:|---:|---:|"]
    for op, size, ours, theirs in rows:
        a, b = statistics.median(ours) * 1e6, statistics.median(theirs) * 1e6
        out.append(f"| {op} | {size} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run with small sizes")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 5; quick: 2)")
    parser.add_argument("--out", default=HERE, help="folder for ADAPTER-LANGGRAPH.md")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    histories = [10, 200] if args.quick else [10, 10_000]
    lengths = [20, 100] if args.quick else [100, 1_000]
    counts = [10, 200] if args.quick else [10, 10_000]
    folder = tempfile.mkdtemp(prefix="bench-langgraph-")
    rows: list = []
    growth: list = []
    store: list = []
    sizes: dict[str, int] = {}
    started = time.time()
    try:
        os.makedirs(os.path.join(folder, "c"))
        os.makedirs(os.path.join(folder, "g"))
        os.makedirs(os.path.join(folder, "s"))
        bench_checkpoints(os.path.join(folder, "c"), histories, repeats, rows)
        bench_growth(os.path.join(folder, "g"), lengths, repeats, growth, sizes)
        bench_store(os.path.join(folder, "s"), counts, repeats, store)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines = [
        "# LangGraph adapters beside LangGraph's SQLite saver and store",
        "",
        f"`python -m benchmarks.adapter_langgraph{' --quick' if args.quick else ''}`, "
        f"{datetime.date.today().isoformat()}, {repeats} rounds, {time.time() - started:.0f} s. "
        "Medians in microseconds; the last column is LangGraph / agentstate (above 1: "
        "agentstate is faster). Every system writes with synchronous=FULL; all but "
        "SqliteStore (SQLite's rollback journal, its default) in WAL mode.",
        "",
        f"Machine: {machine()}.",
        "",
        "## Checkpoints (a fixed-size state: step, a 200-byte message, a 5 KB context)",
        "",
        *table(rows),
        "",
        "## A growing chat (the message list gains one 200-byte message per checkpoint)",
        "",
        *table(growth),
        "",
        f"Bytes on disk after {sizes['messages']:,} checkpoints of the chat: agentstate "
        f"{sizes['agentstate']:,}, LangGraph SQLite {sizes['langgraph']:,} "
        f"({sizes['langgraph'] / sizes['agentstate']:.1f}x).",
        "",
        "## Store (one namespace; the filter matches one item in ten)",
        "",
        *table(store),
        "",
        "## Reading the figures",
        "",
        "- A put writes more than LangGraph's saver does (the record, plus the change-feed "
        "row agentstate keeps for every write) and pays for the store's validation of the "
        "record; each pays one fsync. What it no longer writes shows in the chat: an "
        "unchanged channel is not copied and a grown message list is stored as its new "
        "messages, so the chat's file is a small fraction of LangGraph's and its put no "
        "longer grows with the history.",
        "- A read is two calls of agentstate's public API (a range scan for the newest "
        "record and its pending writes, then the record) where LangGraph's saver runs one "
        "SELECT; each call costs several microseconds of Python around SQLite. Both then "
        "deserialize the same state, which dominates as the state grows.",
        "- The async methods run the same code in a worker thread; AsyncSqliteSaver goes "
        "through aiosqlite's thread and queue.",
        "- The store's search walks a recency index and reads the items it returns (and "
        "those a filter turns down), one call each; SqliteStore scans and sorts the "
        "namespace in one query, which is quicker for a handful of items and slower as "
        "the namespace grows.",
        "",
        "See the module docstring of `benchmarks/adapter_langgraph.py` for the workloads.",
    ]
    path = os.path.join(args.out, "ADAPTER-LANGGRAPH.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
