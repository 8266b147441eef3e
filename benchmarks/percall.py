"""Per-call cost of one write at NORMAL and FULL: what each optimisation bought.

    python -m benchmarks.percall            # writes benchmarks/PERCALL.md (~2 min)
    python -m benchmarks.percall --quick    # a smoke run, prints the table

One thread, one process; put (a small JSON object, 100 keys overwritten in
turn), append (one item to one of 10 lists) and history write (an entry and a
snapshot on one run). Each variant is switched on the same open store, and the
variants alternate within each round in a fresh random order, so all meet the
same machine weather. The file first holds 20,000 writes (a feed past 1 MiB, as any file in
use). Figures: microseconds per call, wall time and CPU time (CPU time is
less sensitive to other work on a shared machine), median of the rounds;
beside the raw apsw floor's put (one INSERT OR REPLACE in BEGIN IMMEDIATE
... COMMIT, json.dumps: less SQL than agentstate's, see RESULTS.md; raw apsw
running agentstate's own statements is in PYTHON-COST.md).

Variants, each one change from "as shipped":
- statement journals in files (``PRAGMA temp_store = FILE``, SQLite's default);
- one transaction per write (group commit off);
- no change feed row (``_feed.record`` a no-op: what the feed costs);
- no housekeeping (the bounded purge every 8th commit off).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time

import apsw

import agentstate
from agentstate.backends.sqlite import admin as _admin
from agentstate.backends.sqlite import feed as _feed

from . import stamp

HERE = os.path.dirname(os.path.abspath(__file__))
VALUE = {"role": "user", "content": "hello world " * 5, "n": 1}
VARIANTS = ("as shipped", "temp_store FILE", "group commit off", "no feed row", "no housekeeping")


class Bench:
    def __init__(self, root: str, dur: str) -> None:
        self.db = agentstate.open(os.path.join(root, f"a-{dur}.db"), durability=dur)
        self.store = self.db._ops.store  # the switches are private: this is a lab
        self.kv = self.db.scope("session", "bench")
        for _chunk in range(20):  # 20,000 writes, one transaction per 1,000
            with self.db.transaction():
                for i in range(1000):
                    self.kv.put(f"k{i % 100}", VALUE)
        self.db.runs.write("h", [], None, create=True)
        self.seq = 0
        self.raw = apsw.Connection(os.path.join(root, f"raw-{dur}.db"))
        self.raw.pragma("journal_mode", "wal")
        self.raw.pragma("synchronous", dur.upper())
        self.raw.execute("CREATE TABLE kv (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        self.record = _feed.record

    def variant(self, name: str) -> None:
        c = self.store.conn()
        c.pragma("temp_store", "FILE" if name == "temp_store FILE" else "MEMORY")
        self.store.group_commit = name != "group commit off"
        self.store.housekeeping = None if name == "no housekeeping" else _admin.purge
        _feed.record = (lambda *a, **k: None) if name == "no feed row" else self.record

    def put(self, i: int) -> None:
        self.kv.put(f"k{i % 100}", VALUE)

    def append(self, i: int) -> None:
        self.kv.append(f"l{i % 10}", [VALUE])

    def history(self, i: int) -> None:
        self.db.runs.write("h", [{"seq": self.seq, "m": VALUE}], {"last": self.seq})
        self.seq += 1

    def raw_put(self, i: int) -> None:
        c = self.raw
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (f"k{i % 100}", json.dumps(VALUE)))
        c.execute("COMMIT")

    def statements(self, op: str) -> int:
        """SQL statements one call runs (BEGIN and COMMIT included)."""
        n = [0]
        c = self.store.conn()
        keep, self.store.housekeeping = self.store.housekeeping, None  # the purge: every 8th only
        getattr(self, op)(1)  # once untraced: an append to a list that exists, as in the rounds
        c.exec_trace = lambda cur, sql, b: n.__setitem__(0, n[0] + 1) or True
        getattr(self, op)(1)
        c.exec_trace = None
        self.store.housekeeping = keep
        return n[0]

    def close(self) -> None:
        self.variant("as shipped")
        self.db.close()
        self.raw.close()


def measure(dur: str, rounds: int, calls: int) -> dict[tuple[str, str], list[tuple[float, float]]]:
    res: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="agentstate-percall-") as root:
        b = Bench(root, dur)
        try:
            stmts = {op: b.statements(op) for op in ("put", "append", "history")}
            for r in range(rounds):
                order = list(VARIANTS)
                random.Random(r).shuffle(order)  # no variant always first (or after the same one)
                for v in order:
                    b.variant(v)
                    ops = ("put", "append", "history") + (("raw_put",) if v == "as shipped" else ())
                    for op in ops:
                        fn = getattr(b, op)
                        t0, c0 = time.perf_counter(), time.process_time()
                        for i in range(calls):
                            fn(i)
                        wall = (time.perf_counter() - t0) / calls * 1e6
                        cpu = (time.process_time() - c0) / calls * 1e6
                        res.setdefault((op, v), []).append((wall, cpu))
        finally:
            b.close()
    res[("_statements", "")] = [(float(stmts["put"]), float(stmts["append"])),
                                (float(stmts["history"]), 0.0)]
    return res


def table(dur: str, res: dict) -> str:
    st = res[("_statements", "")]
    lines = [f"**durability {dur}** — statements per call: put {st[0][0]:.0f}, append {st[0][1]:.0f}, "
             f"history write {st[1][0]:.0f} (BEGIN and COMMIT included, the purge every 8th write not; "
             f"raw apsw's put: 3)", "",
             "| operation | variant | wall µs/call | CPU µs/call | CPU × as shipped |",
             "|---|---|---|---|---|"]
    for op in ("put", "append", "history", "raw_put"):
        base = res[(op, "as shipped")]
        for v in VARIANTS:
            xs = res.get((op, v))
            if not xs:
                continue
            wall = statistics.median(x[0] for x in xs)
            cpu = statistics.median(x[1] for x in xs)
            ratio = statistics.median(x[1] / y[1] for x, y in zip(xs, base))
            name = "raw apsw put" if op == "raw_put" else op
            lines.append(f"| {name} | {v if op != 'raw_put' else '(the floor)'} | {wall:.1f} | "
                         f"{cpu:.1f} | {'' if v == 'as shipped' else f'{ratio:.2f}×'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--out", default=None, help="write PERCALL.md into this folder")
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.calls = 1, 20
    t0 = time.time()
    load0 = os.getloadavg()
    parts = []
    for dur in ("normal", "full"):
        parts.append(table(dur, measure(dur, a.rounds, a.calls if dur == "normal" else a.calls // 5)))
    text = "\n\n".join(parts)
    print(text)
    if a.out:
        doc = f"""# Per-call cost of a write, and what each optimisation bought

{stamp.generated('python -m benchmarks.percall', t0, load0, shared='the machine is shared: CPU time is the steadier figure')}

One thread; {a.rounds} rounds of {a.calls} calls at NORMAL ({a.calls // 5} at FULL) per variant, the variants alternating on one open store whose file already holds 20,000 writes; medians; "× as shipped" is the CPU-time ratio round by round (above 1: the variant costs more, i.e. what the shipped choice saves).

{text}
"""
        with open(os.path.join(a.out, "PERCALL.md"), "w", encoding="utf-8") as f:
            f.write(doc)


if __name__ == "__main__":
    main()
