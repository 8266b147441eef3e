"""Processes waiting for one file's write lock: SQLite's busy handler beside a fairer one.

    python -m benchmarks.busy              # the full run (~1.5 min), writes BUSY.md
    python -m benchmarks.busy --quick      # a smoke run (seconds), prints the table

Each of N processes puts a small value to a key of its own as fast as it can
for a fixed time, at durability full, with a short busy_timeout (1 s: a wait
that long is rare at the default 5 s, and this makes it countable). Figures:
all writes per second, the Busy errors (a write that waited its whole
busy_timeout), the fewest writes any one process made, and the longest wait.

- SQLite's handler (``set_busy_timeout``, agentstate's until 0.2): sleeps 1, 2,
  5, 10 ... then 100 ms between tries. A waiter that has waited a while tries
  ten times a second while a newcomer tries every millisecond, so a long waiter
  keeps losing: one process can starve until its busy_timeout.
- capped backoff (``agentstate.backends.sqlite.busy.Patience``, as shipped): sleeps a
  random 0.5-1x of min(5 ms, 0.5 ms x 2^tries), so every waiter keeps trying
  often.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time


import agentstate

from . import stamp


def _writer(path: str, handler: str, seconds: float, busy_timeout: float, start, out) -> None:
    db = agentstate.open(path, busy_timeout=busy_timeout)
    if handler == "sqlite":  # agentstate's own (Patience) replaced by SQLite's
        db._store.conn().set_busy_timeout(int(busy_timeout * 1000))
    s = db.scope("agent", f"w{os.getpid()}")
    start.wait()
    writes = busy = 0
    longest, t0 = 0.0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        began = time.perf_counter()
        try:
            s.put("x", {"n": writes, "pad": "x" * 100})
            writes += 1
        except agentstate.Busy:
            busy += 1
        longest = max(longest, time.perf_counter() - began)
    db.close()
    out.put((writes, busy, longest))


def run_once(handler: str, procs: int, seconds: float, busy_timeout: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "busy.db")
        agentstate.open(path).close()
        ctx = mp.get_context("spawn")
        start, out = ctx.Event(), ctx.Queue()
        ps = [ctx.Process(target=_writer, args=(path, handler, seconds, busy_timeout, start, out))
              for _ in range(procs)]
        for p in ps:
            p.start()
        time.sleep(1.0 + 0.1 * procs)  # every process imported and opened
        start.set()
        got = [out.get(timeout=seconds + 60) for _ in ps]
        for p in ps:
            p.join(30)
    return {"rate": sum(g[0] for g in got) / seconds, "busy": sum(g[1] for g in got),
            "fewest": min(g[0] for g in got), "longest": max(g[2] for g in got) * 1000}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 processes, 0.3 s, one round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--processes", type=int, default=8)
    ap.add_argument("--busy-timeout", type=float, default=1.0)
    ap.add_argument("--out", default=None, help="write BUSY.md into this folder")
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.seconds, a.processes = 1, 0.3, 2
    t0, load0 = time.time(), os.getloadavg()
    res: dict[str, list[dict[str, float]]] = {"sqlite": [], "capped": []}
    for _ in range(a.rounds):  # alternating, so both meet the same machine weather
        for handler in res:
            res[handler].append(run_once(handler, a.processes, a.seconds, a.busy_timeout))
    names = {"sqlite": "SQLite's handler", "capped": "capped backoff (shipped)"}
    med = {h: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for h, rs in res.items()}
    lines = ["| busy handler | writes/s (min–max) | Busy errors | fewest writes of one process | longest wait, ms |",
             "|---|---|---|---|---|"]
    for h, m in med.items():
        lo, hi = min(r["rate"] for r in res[h]), max(r["rate"] for r in res[h])
        lines.append(f"| {names[h]} | {m['rate']:,.0f} ({lo:,.0f}–{hi:,.0f}) | {m['busy']:g} | "
                     f"{m['fewest']:,.0f} | {m['longest']:,.0f} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        doc = f"""# Processes waiting for the write lock: SQLite's busy handler beside a fairer one

{stamp.generated('python -m benchmarks.busy', t0, load0)}

{a.processes} processes each put a small value to a key of their own as fast as they can for {a.seconds:g} s at durability full, busy_timeout {a.busy_timeout:g} s; medians of {a.rounds} rounds, the two handlers alternating.

{text}

{__doc__.split(chr(10) + chr(10), 2)[2].strip()}
"""
        with open(os.path.join(a.out, "BUSY.md"), "w", encoding="utf-8") as f:
            f.write(doc)


if __name__ == "__main__":
    sys.exit(main())
