"""Search by meaning (SPEC §19): AgentStateStore(index=...) beside LangGraph's SqliteStore
with the same index, over 10,000 items, on a file.

    python -m benchmarks.search [--items 10000] [--dims 384,1536] [--rounds 15]
                                [--postgres] [--out benchmarks/SEARCH.md]

Each store gets its own file: ``agentstate.open(path)`` (WAL, synchronous=FULL) and
``SqliteStore(sqlite3.connect(path))`` switched to WAL with synchronous=FULL, the
same ``index={"dims": N, "embed": fn, "fields": ["text"], "text_fields": ["text"]}``
(cosine; SqliteStore reads ``text_fields``). SqliteStore
loads sqlite-vec into its connection, which a Python built without loadable SQLite
extensions (pyenv's default) cannot: ``pysqlite3`` (``pip install
pysqlite3-binary``, SQLite bundled) is used for it when installed. ``fn`` looks
up vectors drawn beforehand (Gaussian, seeded), so the model costs nothing and both
stores get the same numbers; the items are ``{"text": ..., "kind": i % 10}`` in one
namespace, put in batches of 500 (untimed).

Timed, the operations alternating in each round so that each meets the same machine
weather: ``search(ns, query=q, limit=10)``; the same with ``filter={"kind": 3}``
(one item in ten passes); ``put`` of a new item with its vector. Figures are medians
of every call of all rounds, in milliseconds, and the ratio SqliteStore ÷ agentstate
(above 1: agentstate is faster).

A search reads every vector of the namespace. Past what the connection's page cache
holds (16 MiB: the vectors of 10,000 items take 15 MB at 384 dimensions, 60 MB at
1,536), each page it reads is a read() of the file from the OS's cache. The row
"agentstate, mmap" is the same store with its connection's ``mmap_size`` at 256 MiB
(SQLite reads the file's pages through a memory map instead), which agentstate does
not set by default. With ``--postgres``, agentstate on PostgreSQL is
timed too, at the first ``--dims`` (a throwaway server, as the tests start one): this
machine's server has no pgvector, so that is the exact search, and LangGraph's
PostgresStore, which needs pgvector, has no figure.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from langgraph.store.base import PutOp

import agentstate
from agentstate.integrations.langgraph import AgentStateStore

from . import stamp

NS = ("memories", "user-1")
BATCH = 500
QUERIES = 20
MMAP = 256 << 20  # "agentstate, mmap": the store's connection reads the file through mmap


class Vectors:
    """The pretend model: every text it will be asked for has a vector drawn beforehand."""

    def __init__(self, dims: int, texts: list[str]) -> None:
        rnd = random.Random(dims)
        self.table = {t: [rnd.gauss(0, 1) for _ in range(dims)] for t in texts}

    def __call__(self, texts: list[str]) -> list[list[float]]:
        return [self.table[t] for t in texts]


def texts(items: int, puts: int) -> tuple[list[str], list[str], list[str]]:
    return ([f"memory {i}" for i in range(items)], [f"query {i}" for i in range(QUERIES)],
            [f"new {i}" for i in range(puts)])


def load(store: Any, items: list[str]) -> None:
    for start in range(0, len(items), BATCH):
        store.batch([PutOp(NS, f"m{i}", {"text": items[i], "kind": i % 10})
                     for i in range(start, min(start + BATCH, len(items)))])


def operations(store: Any, queries: list[str], new: list[str]) -> dict[str, Callable[[int], Any]]:
    return {
        "search, 10 nearest": lambda i: store.search(NS, query=queries[i % len(queries)], limit=10),
        "search, 10 nearest of a filter (1 in 10)": lambda i: store.search(
            NS, query=queries[i % len(queries)], filter={"kind": 3}, limit=10),
        "put of a new item with its vector": lambda i: store.put(NS, new[i], {"text": new[i], "kind": 0}),
    }


def open_stores(folder: str, index: dict[str, Any], pg_url: str | None) -> dict[str, tuple[Any, Callable[[], None]]]:
    stores: dict[str, tuple[Any, Callable[[], None]]] = {}
    db = agentstate.open(os.path.join(folder, "agentstate.db"))
    stores["agentstate"] = (AgentStateStore(db, index=index), db.close)
    mapped = agentstate.open(os.path.join(folder, "mapped.db"))
    mapped._store.conn().pragma("mmap_size", MMAP)  # this thread's connection: the one timed
    stores["agentstate, mmap"] = (AgentStateStore(mapped, index=index), mapped.close)
    from langgraph.store.sqlite import SqliteStore

    try:
        from pysqlite3 import dbapi2 as sqlite3  # with extension loading, SQLite bundled
    except ImportError:
        import sqlite3
    conn = sqlite3.connect(os.path.join(folder, "langgraph.db"), check_same_thread=False,
                           isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    if hasattr(conn, "enable_load_extension"):  # else SqliteStore cannot load sqlite-vec
        lg = SqliteStore(conn, index=index)
        lg.setup()
        stores["SqliteStore"] = (lg, conn.close)
    else:
        conn.close()
    if pg_url:
        pg = agentstate.open(pg_url)
        stores["agentstate on PostgreSQL (exact, no pgvector)"] = (AgentStateStore(pg, index=index),
                                                                   pg.close)
    return stores


def measure(items: int, dims: int, rounds: int, pg_url: str | None) -> dict[str, dict[str, list[float]]]:
    calls = {"search": 5, "put": 10}
    docs, queries, new = texts(items, rounds * calls["put"] + 1)
    # fields as LangGraph's InMemoryStore and PostgresStore spell it, text_fields as SqliteStore does
    index = {"dims": dims, "embed": Vectors(dims, docs + queries + new), "fields": ["text"],
             "text_fields": ["text"]}
    out: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        stores = open_stores(folder, index, pg_url)
        try:
            ops = {}
            for name, (store, _close) in stores.items():
                load(store, docs)
                ops[name] = operations(store, queries, new)
                out[name] = {op: [] for op in ops[name]}
            n = 0
            for r in range(rounds):
                order = list(ops)
                random.Random(r).shuffle(order)
                for name in order:
                    for op, fn in ops[name].items():
                        k = calls["put"] if op.startswith("put") else calls["search"]
                        for i in range(k):
                            t0 = time.perf_counter()
                            fn(n + i if op.startswith("put") else r * k + i)
                            out[name][op].append((time.perf_counter() - t0) * 1000)
                n += calls["put"]
        finally:
            for _store, close in stores.values():
                close()
    return out


def table(dims: int, items: int, res: dict[str, dict[str, list[float]]]) -> str:
    systems = list(res)
    head = ["operation", *(f"{name} ms" for name in systems), "SqliteStore ÷ agentstate"]
    lines = [f"### {items:,} items, {dims} dimensions", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for op in res["agentstate"]:
        cells = []
        for name in systems:
            xs = res[name][op]
            cells.append(f"{statistics.median(xs):,.2f} ({min(xs):,.2f}–{max(xs):,.2f})")
        ratio = (f"**{statistics.median(res['SqliteStore'][op]) / statistics.median(res['agentstate'][op]):.2f}×**"
                 if "SqliteStore" in res else "n/a (SqliteStore cannot load sqlite-vec here)")
        lines.append(f"| {op} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=10_000)
    ap.add_argument("--dims", default="384,1536")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    server = pg_url = None
    if a.postgres:
        from tests import pgserver

        bindir = pgserver.bindir()
        if bindir:
            pgserver.sweep(bindir)
            server = pgserver.Server(bindir).start()
    t0, load0 = time.time(), os.getloadavg()
    sections = []
    try:
        for n, dims in enumerate(map(int, a.dims.split(","))):
            if server is not None and n == 0:
                pg_url = pgserver.schema_url(server.admin_url, pgserver.new_schema(server.admin_url))
            sections.append(table(dims, a.items, measure(a.items, dims, a.rounds,
                                                         pg_url if n == 0 else None)))
    finally:
        if server is not None:
            server.stop()
    command = (f"python -m benchmarks.search --items {a.items} --dims {a.dims} --rounds {a.rounds}"
               + (" --postgres" if a.postgres else ""))
    text = "\n".join([
        "# Search by meaning: AgentStateStore beside LangGraph's SqliteStore (SPEC §19)", "",
        stamp.generated(command, t0, load0), "",
        "Milliseconds per call: median (min–max) of every call of all rounds; the ratio is of "
        "the medians (above 1: agentstate is faster). Durability full on both files.", "",
        *[s + "\n" for s in sections]])
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
