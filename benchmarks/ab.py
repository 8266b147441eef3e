"""A/B of agentstate's per-call write cost: two versions of the package in one process.

    python -m benchmarks.ab BASE [HEAD]      # git revisions; HEAD default: BASE with this
                                             # checkout's files of MINE (the hot path's
                                             # modules; only those files differ)
    python -m benchmarks.ab BASE --rounds 15 --calls 200 --ops put,update

Both versions are imported side by side in one process (as ``agentstate_base``
and ``agentstate_head``, each from its own copy of the tree), each opens its
own store at durability normal holding 20,000 writes (a feed past 1 MiB, as
any file in use), and their timed batches alternate, so both meet the same
machine weather: on a shared 2-core machine that is what makes a difference of
a microsecond or two measurable at all. Operations: put (a small JSON object,
100 keys overwritten in turn), update (one counter), append (one item to one
of 10 lists), history write (an entry and a snapshot on one run), get (one
of the 100 keys), list and items (``--ops``: up to 10 keys by prefix, without
and with their values; no stubbed twin); then the
same four with SQLite stubbed out (``_Stub``: every statement returns at
once), which leaves agentstate's Python alone. Figures: CPU microseconds per
call, the least over the rounds' batches (the batch other work disturbed
least), and the median of the per-batch ratios HEAD ÷ BASE. Raw apsw running
agentstate's SQL (``benchmarks.systems.ApswSameHandle``) is timed in the same
rounds for reference. Used for benchmarks/PYTHON-COST.md.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OPS = ("put", "update", "append", "history", "get")
MINE = ("_scope.py", "_encoding.py", "_thread.py", "backends/local.py", "backends/sqlite/kv.py",
        "backends/sqlite/store.py", "backends/sqlite/group_commit.py",
        "backends/sqlite/transactions.py", "backends/sqlite/feed.py")
VALUE = {"role": "user", "content": "hello world " * 5, "n": 1}


def _inc(n: int) -> int:
    return n + 1


class _Stub:
    """Stands in for the apsw connection: every statement returns at once, with a
    row of the shape its caller expects. What remains is agentstate's Python."""

    in_transaction = False
    _rows = (("SELECT type, value", ("json", "1", 1, None)),
             ("SELECT version, type", (1, "list", 1, 1, 10, None, None, "2026-01-01T00:00:00.000000Z")),
             ("SELECT next_seq", (0, 0)),
             ("", (1,)))

    def execute(self, sql: str, *args: object) -> _Stub:
        self.sql = sql
        return self

    def fetchone(self) -> tuple:
        s = self.sql.lstrip()
        return next(row for head, row in self._rows if s.startswith(head))

    def fetchall(self) -> list:
        return []

    def executemany(self, *args: object) -> None:
        pass

    def changes(self) -> int:
        return 0


def package(rev: str | None, base: str, dest: str, name: str) -> Any:
    """The package at ``rev`` (None: ``base`` with this checkout's files of MINE), imported as ``name``."""
    os.makedirs(dest)
    arch = subprocess.run(["git", "archive", rev or base], cwd=REPO, capture_output=True,
                          check=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=arch, check=True)
    if rev is None:
        for f in MINE:
            os.makedirs(os.path.dirname(os.path.join(dest, "agentstate", f)), exist_ok=True)
            shutil.copy(os.path.join(REPO, "agentstate", f), os.path.join(dest, "agentstate", f))
    os.rename(os.path.join(dest, "agentstate"), os.path.join(dest, name))  # schema.sql stays beside it
    sys.path.insert(0, dest)
    return importlib.import_module(name)


def operations(pkg: Any, root: str) -> dict[str, Callable[[int], Any]]:
    """The timed calls on a store of ``pkg``: real ones, and with SQLite stubbed out."""
    db = pkg.open(os.path.join(root, "real.db"), durability="normal")
    kv = db.scope("app", "bench")
    for _ in range(20):
        with db.transaction():
            for i in range(1000):
                kv.put(f"k{i % 100}", VALUE)
    for j in range(10):
        kv.put(f"l{j}", [VALUE])
    db.runs.write("h", [], None, create=True)
    seq = [0]

    def history(i: int) -> None:
        db.runs.write("h", [{"seq": seq[0], "m": VALUE}], {"last": seq[0]})
        seq[0] += 1

    stubbed = pkg.open(os.path.join(root, "stub.db"), durability="normal")
    store = stubbed._ops.store
    store.conn()
    stub = _Stub()
    store.conn = lambda: stub
    skv = stubbed.scope("app", "bench")
    return {
        "put": lambda i: kv.put(f"k{i % 100}", VALUE),
        "update": lambda i: kv.update("n", _inc, default=0),
        "append": lambda i: kv.append(f"l{i % 10}", [VALUE]),
        "history": history,
        "get": lambda i: kv.get(f"k{i % 100}"),
        "list": lambda i: kv.list(f"k{i % 10}", limit=10),
        "items": lambda i: kv.items(f"k{i % 10}", limit=10),
        "python get": lambda i: skv.get("k"),
        "python put": lambda i: skv.put("k", VALUE),
        "python update": lambda i: skv.update("n", _inc, default=0),
        "python append": lambda i: skv.append("l", [VALUE]),
        "python history": lambda i: stubbed.runs.write("h", [{"seq": 0, "m": VALUE}], {"last": 0}),
    }


def raw_operations(root: str) -> dict[str, Callable[[int], Any]]:
    from benchmarks.systems import ApswSameHandle

    raw = ApswSameHandle(root, "normal")
    for j in range(10):
        raw.set_list(f"l{j}", [VALUE])
    raw.run_create("h", [], None)
    seq = [0]

    def history(i: int) -> None:
        raw.run_write("h", {"seq": seq[0], "m": VALUE}, {"last": seq[0]})
        seq[0] += 1

    for i in range(100):
        raw.put(f"k{i}", VALUE)
    return {"put": lambda i: raw.put(f"k{i % 100}", VALUE), "update": lambda i: raw.incr("n"),
            "get": lambda i: raw.get(f"k{i % 100}"),
            "append": lambda i: raw.append(f"l{i % 10}", VALUE), "history": history}


def _batch(fn: Callable[[int], Any], start: int, calls: int) -> float:
    c0 = time.process_time()
    for i in range(start, start + calls):
        fn(i)
    return (time.process_time() - c0) / calls * 1e6


def compare(base: str, head: str | None, rounds: int, calls: int, ops: list[str]) -> str:
    with tempfile.TemporaryDirectory(prefix="agentstate-ab-") as tmp:
        pkgs = {"base": package(base, base, os.path.join(tmp, "base"), "agentstate_base"),
                "head": package(head, base, os.path.join(tmp, "head"), "agentstate_head")}
        fns = {}
        for side, pkg in pkgs.items():
            os.makedirs(os.path.join(tmp, "db-" + side))
            fns[side] = operations(pkg, os.path.join(tmp, "db-" + side))
        os.makedirs(os.path.join(tmp, "db-raw"))
        raw = raw_operations(os.path.join(tmp, "db-raw"))
        names = [n for op in ops for n in (op, "python " + op) if n in fns["base"]]
        for side in fns:  # warm up
            for n in names:
                for i in range(200):
                    fns[side][n](i)
        got: dict[tuple[str, str], list[float]] = {}
        for r in range(rounds):
            for n in names:
                for side in (("base", "head") if r % 2 == 0 else ("head", "base")):
                    got.setdefault((side, n), []).append(_batch(fns[side][n], r * calls, calls))
                if n in raw:
                    got.setdefault(("raw", n), []).append(_batch(raw[n], r * calls, calls))
    lines = [f"| operation | {base} CPU µs/call | {head or 'this checkout'} CPU µs/call | "
             "ratio (median of the batches' ratios, min–max) | raw apsw, same SQL |",
             "|---|---|---|---|---|"]
    for n in names:
        b, h = got[("base", n)], got[("head", n)]
        ratios = [y / x for x, y in zip(b, h)]
        rawv = got.get(("raw", n))
        label = n.replace("python ", "") + ", Python only (SQLite stubbed)" if n.startswith("python") else n
        lines.append(f"| {label} | {min(b):.2f} | {min(h):.2f} | {statistics.median(ratios):.2f}× "
                     f"({min(ratios):.2f}–{max(ratios):.2f}) | {f'{min(rawv):.2f}' if rawv else ''} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base")
    ap.add_argument("head", nargs="?", default=None)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--ops", default=",".join(OPS))
    a = ap.parse_args(argv)
    t0 = time.time()
    load = os.getloadavg()
    text = compare(a.base, a.head, a.rounds, a.calls, a.ops.split(","))
    print(text)
    print(f"\n{a.rounds} rounds of {a.calls} calls per batch, {(time.time() - t0) / 60:.1f} min; load "
          f"average {' '.join(f'{x:.2f}' for x in load)} at start, "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} at end")


if __name__ == "__main__":
    main()
