"""LangGraph: AgentStateSaver and AgentStateStore beside LangGraph's own savers and stores,
on SQLite and on PostgreSQL, and a graph's turn end to end.

    python -m benchmarks.adapter_langgraph             # histories of 10 and 2,000 checkpoints
    python -m benchmarks.adapter_langgraph --quick     # a smoke run: 10 and 50 (seconds)
    python -m benchmarks.adapter_langgraph --repeats 7 --out DIR   # writes DIR/ADAPTER-LANGGRAPH.md
    python -m benchmarks.adapter_langgraph --no-postgres           # SQLite only

Run from the repository root. The systems (``adapter_langgraph_systems.py``), each
on its own file (SQLite) or schema (PostgreSQL), with the same durability:

- SQLite: ``AgentStateSaver``/``AgentStateStore`` on ``agentstate.open(path)`` (WAL,
  synchronous=FULL) beside ``SqliteSaver(sqlite3.connect(path))``, ``AsyncSqliteSaver``
  (aiosqlite) and ``SqliteStore``, all three in WAL mode with synchronous=FULL;
- PostgreSQL: a throwaway server started here as tests/pgserver.py does, with
  PostgreSQL's default durability (fsync on, synchronous_commit on), or
  ``$DATABASE_URL``: agentstate on it beside ``PostgresSaver``, ``AsyncPostgresSaver``
  and ``PostgresStore`` (langgraph-checkpoint-postgres).

Checkpoints (``put``, ``get_tuple`` of the newest, ``list`` of the newest 10, and the
async twins): one thread per system grows to each history length by ``put``
(untimed), each checkpoint as LangGraph writes it: a step counter and a 200-byte
message that change every step, and a 5 KB context that never changes after the
first. The timed puts extend that thread.

Growing history: a thread whose message list grows by one 200-byte message per
checkpoint (a chat); ``put`` and ``get_tuple`` at two lengths, and (SQLite) the bytes
on disk afterwards (LangGraph's SQLite saver stores the whole list each time).

Store: one namespace per system with 10 and N items (``put``, untimed); timed:
``put`` of a new item, ``get``, ``search`` of the newest 10, and ``search`` with a
filter that one item in ten matches.

A graph's turn: a three-node graph (listen, remember: a store put and a search of 5,
reply) compiled with the saver and the store; one turn is one ``invoke`` (or
``ainvoke``) with a new human message on one thread whose history grows.

Rounds visit the systems in a fresh random order; figures are medians of every timed
call of all rounds, in microseconds, with the ratio LangGraph / agentstate (above 1:
agentstate is faster).
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import apsw  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402

from benchmarks.adapter_langgraph_systems import (  # noqa: E402
    MESSAGE, Chat, Pair, PostgresPair, SqlitePair, graph)

CONTEXT = "C" * 5000


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


def bench_checkpoints(s: Pair, histories: list[int], repeats: int, rows: list) -> None:
    names = list(s.sync)
    for h in histories:
        chains = {name: Chain(f"h{h}") for name in names}
        for name in names:
            for _ in range(h):
                chains[name].put(s.sync[name])
        s.settle()
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


def bench_growth(s: Pair, lengths: list[int], repeats: int, rows: list) -> int:
    """put into a chat whose message list grows by one message per checkpoint; returns
    the number of checkpoints put."""
    names = list(s.sync)
    chats = {name: Chain("chat") for name in names}
    for n in lengths:
        for name in names:
            while chats[name].step < n:
                chats[name].put(s.sync[name], chat=True)
        s.settle()
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
    return chats["agentstate"].step


def bench_store(s: Pair, counts: list[int], repeats: int, rows: list) -> None:
    stores = s.stores
    made = 0
    for n in counts:
        ns = ("users", "u1", f"memories{n}")
        for store in stores.values():
            for i in range(n):
                store.put(ns, f"m{i}", {"text": MESSAGE, "kind": "fact" if i % 10 == 0 else "chat", "i": i})
        s.settle()
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


def bench_graph(s: Pair, turns: int, repeats: int, rows: list) -> None:
    """Turns of a three-node chat graph (``invoke`` and ``ainvoke``), wall time each."""
    names = list(s.sync)
    chats = {name: Chat(graph(s.sync[name], s.stores[name])) for name in names}
    achats = {name: Chat(graph(s.aio[name], s.stores[name])) for name in names}
    samples: dict[tuple[str, str], list[float]] = {}
    for name in names:  # the first turns open connections and threads: not timed
        chats[name].turn()
        achats[name].aturn(s.loop)
    for _ in range(repeats):
        for name in random.sample(names, len(names)):
            get = samples.setdefault
            get(("invoke, one turn (3 node steps)", name), []).extend(
                chats[name].turn() for _ in range(turns))
            get(("ainvoke, one turn (3 node steps)", name), []).extend(
                achats[name].aturn(s.loop) for _ in range(turns))
    done = chats["agentstate"].n
    for op in dict.fromkeys(k[0] for k in samples):
        rows.append((op, f"{done:,} turns", samples[(op, "agentstate")], samples[(op, "langgraph")]))


def machine(pg_version: str | None) -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in (
        "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint-postgres", "psycopg"))
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{cpu}, {os.cpu_count()} cores, shared (load average {load} at the end; every "
            f"figure is noisy: compare within a table, run by run), "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"SQLite {apsw.sqlite_lib_version()} (agentstate, apsw) and {sqlite3.sqlite_version} "
            f"(LangGraph, sqlite3), {pg_version or 'no PostgreSQL'}, {versions}")


def table(rows: list, theirs: str) -> list[str]:
    out = [f"| operation | size | agentstate µs | {theirs} µs | LangGraph / agentstate |",
           "|---|---|---:|---:|---:|"]
    for op, size, ours, other in rows:
        a, b = statistics.median(ours) * 1e6, statistics.median(other) * 1e6
        out.append(f"| {op} | {size} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x |")
    return out


def file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def run_backend(make: Callable[[str], Pair], sizes: dict[str, Any], repeats: int
                ) -> tuple[str, dict[str, list]]:
    """Every workload on one backend: (the other system's name, rows by section)."""
    rows: dict[str, list] = {"checkpoints": [], "growth": [], "store": [], "graph": []}
    main = make("c")
    try:
        bench_checkpoints(main, sizes["histories"], repeats, rows["checkpoints"])
        bench_store(main, sizes["counts"], repeats, rows["store"])
        bench_graph(main, sizes["turns"], repeats, rows["graph"])
    finally:
        main.close()
    chat = make("g")
    try:
        rows["messages"] = [bench_growth(chat, sizes["lengths"], repeats, rows["growth"])]
    finally:
        chat.close()
    return main.theirs, rows


def postgres_backend() -> tuple[Callable[[str], Pair], str, Callable[[], None]]:
    """A pair factory on PostgreSQL ($DATABASE_URL, else a throwaway server with the
    default durability: adapter_pg.Postgres), the server's version, and what stops it."""
    from .adapter_pg import Postgres

    pg = Postgres().__enter__()

    def fresh() -> str:
        return pg.url(pg.schema())

    version = f"PostgreSQL {pg.version()} (fsync on, synchronous_commit on)"
    return (lambda _part: PostgresPair(fresh)), version, lambda: pg.__exit__(None, None, None)


def section(title: str, rows: dict[str, list], theirs: str, chat_bytes: str = "") -> list[str]:
    return [f"## {title}", "",
            "### Checkpoints (a fixed-size state: step, a 200-byte message, a 5 KB context)", "",
            *table(rows["checkpoints"], theirs), "",
            "### A growing chat (the message list gains one 200-byte message per checkpoint)", "",
            *table(rows["growth"], theirs), "", *([chat_bytes, ""] if chat_bytes else []),
            "### Store (one namespace; the filter matches one item in ten)", "",
            *table(rows["store"], theirs), "",
            "### A graph's turn end to end (three nodes, four checkpoints, a store put and search)",
            "", *table(rows["graph"], theirs), ""]


READING = """## Reading the figures

- Sizes are modest (histories of 2,000, not 10,000) and the machine's two cores are
  shared: a figure moves by 1.5x between runs, puts (one fsync each) most. Compare a
  row's two systems, which took turns in one run.
- What the adapters do per LangGraph call: `get_tuple` is one range read of the store
  (`scope.items`: the record with its pending writes, one row or two); `list` reads
  pages of them; `put_writes` is one append; `put` is one `db.batch()` (a `check`
  that the parent is still the one read, the record, a new run's index), or one
  transaction when it has new channel bytes to store. The store's `get` is one read,
  its `put` one batch held by checks to what the store last wrote of the item and
  namespace (a read first when it knows neither), and a search one index page and
  one `get_many` per round of candidates.
- SQLite reads: LangGraph's `get_tuple` is one indexed SELECT in about 20 µs; ours
  is one call too, a range read of the store (`scope.items`). That read was
  prepared again by SQLite on every call (apsw's SQLite has STAT4, and a statement
  whose plan could depend on a bound LIMIT or range is re-planned when the value
  changes); with the planner's stability guarantee on, each store connection plans
  it once (benchmarks/PYTHON-COST.md, round 5), which took `get_tuple` from ~0.3x
  to ~0.65x here and the store's search of 10 items from ~0.4x to ~0.75x. What is
  left: the layers above the read (~10 µs), and the record is JSON where
  LangGraph's row is msgpack (decoding a checkpoint's record, ~800 bytes of JSON,
  takes ~5 µs of ours). On a file `aget_tuple` reads on the loop's own thread (in
  WAL mode a read never waits for a writer, and it costs less than the hop to a
  worker thread, ~130 µs here), where AsyncSqliteSaver goes through aiosqlite's
  queue; `alist` reads its pages in a worker thread.
- SQLite writes: one fsync each on both sides, and about as many bytes written
  (strace: 615 fdatasyncs and ~6,100 pwrites for 600 checkpoint puts of ours, 616
  and ~6,600 of LangGraph's). The difference is CPU: ~160 µs of the calling
  thread per checkpoint put against ~85 µs (on a file in /dev/shm, without the
  disk: ~75 µs against ~25 µs). A store write validates its value by the
  contract's rules (~5 µs for a checkpoint record), encodes it (~6 µs), keeps its
  version and records its change in the feed (a second row), where LangGraph's
  saver inserts one msgpack row.
- PostgreSQL writes: a checkpoint put and a store put are one round trip each, one
  prepared statement (benchmarks/PG-WRITES.md: the saver's put costs the server
  ~130 µs of CPU where PostgresSaver.put costs ~72). What is left is rows: with
  value history on (the default) a put writes the key's row, its change row and the
  value it replaces (benchmarks/PG-HISTORY-COST.md), where LangGraph's saver
  upserts one row. Under a graph's threads each round trip also waits for the GIL
  when it returns.
- The store's filtered search decodes each candidate item in Python where LangGraph's
  stores filter with json_extract / jsonb in SQL; a filter that lets few items through
  reads many.
- The chat's file is 24x smaller than LangGraph's SQLite saver's, whose every
  checkpoint holds the whole message list.
- A graph's turn: three node steps, four checkpoints and their writes, a store put
  and a search. With `invoke`, LangGraph writes a step's checkpoint on a background
  thread while the next node runs, so the node's store put and the checkpoint's put
  are two write transactions of one process on one file: the second waits for the
  first's COMMIT. It used to wait in the busy handler's sleeps (~9 ms a turn); now
  the end of a transaction of the process wakes it (`busy.Releases`), ~5 ms a
  turn, most of it the first one's fsync, where LangGraph's saver and store, two
  files here, never wait for each other.
""".splitlines()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run with small sizes")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 5; quick: 2)")
    parser.add_argument("--no-postgres", action="store_true", help="SQLite only")
    parser.add_argument("--out", default=HERE, help="folder for ADAPTER-LANGGRAPH.md")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 5)
    sizes: dict[str, Any] = {
        "histories": [10, 50] if args.quick else [10, 2_000],
        "lengths": [20, 50] if args.quick else [100, 1_000],
        "counts": [10, 50] if args.quick else [10, 2_000],
        "turns": 2 if args.quick else 40,
    }
    folder = tempfile.mkdtemp(prefix="bench-langgraph-")
    started = time.time()
    stop: Callable[[], None] = lambda: None  # noqa: E731
    pg_version = None
    try:
        for part in ("c", "g"):
            os.makedirs(os.path.join(folder, part))
        theirs, lite = run_backend(lambda part: SqlitePair(os.path.join(folder, part)), sizes, repeats)
        ours, other = (file_bytes(os.path.join(folder, "g", f)) for f in ("agentstate.db", "langgraph.db"))
        pg = None
        if not args.no_postgres:
            make, pg_version, stop = postgres_backend()
            pg = run_backend(make, sizes, repeats)
    finally:
        stop()
        shutil.rmtree(folder, ignore_errors=True)
    chat = (f"Bytes on disk after {lite['messages'][0]:,} checkpoints of the chat: agentstate "
            f"{ours:,}, LangGraph SQLite {other:,} ({other / ours:.1f}x).")
    lines = [
        "# LangGraph adapters beside LangGraph's own savers and stores",
        "",
        f"`python -m benchmarks.adapter_langgraph{' --quick' if args.quick else ''}`, "
        f"{datetime.date.today().isoformat()}, {repeats} rounds, {time.time() - started:.0f} s. "
        "Medians in microseconds; the last column is LangGraph / agentstate (above 1: "
        "agentstate is faster). Same durability on both sides: SQLite in WAL mode with "
        "synchronous=FULL for every system (LangGraph's SqliteStore too, which defaults to "
        "the rollback journal), PostgreSQL with its defaults (fsync, synchronous_commit on).",
        "",
        f"Machine: {machine(pg_version)}.",
        "",
        *section("SQLite", lite, theirs, chat),
        *(section("PostgreSQL", pg[1], pg[0]) if pg else []),
        *READING,
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
