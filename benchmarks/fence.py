"""What SPEC §14 costs: a fenced write beside the same write unfenced, and once()'s lookup
of a call id at 100 and 100,000 entries, on SQLite and PostgreSQL.

    python -m benchmarks.fence [--rounds 9] [--calls 200] [--out benchmarks/FENCE.md]

Each round times a batch of each operation, the operations alternating, so every one
meets the same machine weather; the figures are medians over the rounds of the µs per
call (wall time), durability full. PostgreSQL runs on a throwaway server started here (the
tests' tests/pgserver.py: fsync off, so its figures are the round trips and the CPU, not
a disk).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import agentstate

from . import stamp

VALUE = {"role": "assistant", "content": "hello world " * 5}


def operations(db: agentstate.Database) -> dict[str, Callable[[int], Any]]:
    """The timed calls: each plain write and the same one fenced by a live turn."""
    p = agentstate.Principal("bench")
    s = db.sessions.create(p)
    turn = db.sessions.start_turn(s.id, p, lease=3600)
    kv = db.scope("session", s.id)
    fenced = db.scope("session", s.id, fence=turn)
    db.runs.write("plain", [], None, create=True)
    db.runs.write("fenced", [], None, create=True)
    seq = {"plain": 0, "fenced": 0}

    def run_write(run: str, scope_fence: Any) -> Callable[[int], Any]:
        def write(i: int) -> None:
            db.runs.write(run, [{"seq": seq[run], "m": VALUE}], None, fence=scope_fence)
            seq[run] += 1
        return write

    for n in (100, 100_000):
        rid = f"calls{n}"
        db.runs.write(rid, [{"seq": i, "type": "tool_call" if i % 2 else "message",
                             "call_id": f"x{i}"} for i in range(n)], None, create=True)
        db.runs.once(rid, "done", lambda: "ok")
    return {
        "put": lambda i: kv.put(f"k{i % 100}", VALUE),
        "put, fenced": lambda i: fenced.put(f"k{i % 100}", VALUE),
        "append": lambda i: kv.append("log", [VALUE]),
        "append, fenced": lambda i: fenced.append("flog", [VALUE]),
        "run write": run_write("plain", None),
        "run write, fenced": run_write("fenced", turn),
        "once() of a done call, run of 100 entries":
            lambda i: db.runs.once("calls100", "done", lambda: "ok"),
        "once() of a done call, run of 100,000 entries":
            lambda i: db.runs.once("calls100000", "done", lambda: "ok"),
    }


def measure(db: agentstate.Database, rounds: int, calls: int) -> dict[str, list[float]]:
    ops = operations(db)
    out: dict[str, list[float]] = {name: [] for name in ops}
    for _ in range(rounds):
        for name, fn in ops.items():
            t0 = time.perf_counter()
            for i in range(calls):
                fn(i)
            out[name].append((time.perf_counter() - t0) / calls * 1e6)
    return out


def table(results: dict[str, dict[str, list[float]]]) -> str:
    backends = list(results)
    lines = ["| operation | " + " | ".join(f"{b} µs (median, min–max)" for b in backends) + " |",
             "|---|" + "---:|" * len(backends)]
    for name in next(iter(results.values())):
        cells = []
        for b in backends:
            xs = results[b][name]
            cells.append(f"{statistics.median(xs):,.0f} ({min(xs):,.0f}–{max(xs):,.0f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def ratios(results: dict[str, dict[str, list[float]]]) -> str:
    lines = []
    for b, r in results.items():
        for op in ("put", "append", "run write"):
            lines.append(f"- {b}, {op}: fenced ÷ plain = "
                         f"{statistics.median(r[op + ', fenced']) / statistics.median(r[op]):.2f}x")
        small = statistics.median(r["once() of a done call, run of 100 entries"])
        big = statistics.median(r["once() of a done call, run of 100,000 entries"])
        lines.append(f"- {b}, once() lookup: 100,000 ÷ 100 entries = {big / small:.2f}x")
    return "\n".join(lines)


def run(rounds: int, calls: int, pg_url: str | None) -> dict[str, dict[str, list[float]]]:
    results = {}
    with tempfile.TemporaryDirectory() as d:
        with agentstate.open(os.path.join(d, "bench.db")) as db:
            results["SQLite"] = measure(db, rounds, calls)
    if pg_url:
        with agentstate.open(pg_url) as db:
            results["PostgreSQL"] = measure(db, rounds, calls)
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    server = None
    pg_url = None
    if not a.no_postgres:
        from tests import pgserver

        bindir = pgserver.bindir()
        if bindir:
            pgserver.sweep(bindir)
            server = pgserver.Server(bindir).start()
            pg_url = pgserver.schema_url(server.admin_url, pgserver.new_schema(server.admin_url))
    t0, load0 = time.time(), os.getloadavg()
    try:
        results = run(a.rounds, a.calls, pg_url)
    finally:
        if server is not None:
            server.stop()
    command = f"python -m benchmarks.fence --rounds {a.rounds} --calls {a.calls}"
    text = "\n".join([
        "# Fenced writes and once(): what they cost (SPEC §14)", "",
        stamp.generated(command, t0, load0), "",
        "Durability full. The PostgreSQL server is the tests' throwaway one (fsync off: its "
        "figures are round trips and CPU, not a disk).", "",
        table(results), "", ratios(results), ""])
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
