"""Group commit: many writers at once, threads of one process beside processes.

    python -m benchmarks.group_commit            # the full run (~3 min), writes GROUP-COMMIT.md
    python -m benchmarks.group_commit --quick    # a smoke run (seconds), prints the table

Each writer puts small values (100 keys of its own, overwritten in turn) as
fast as it can for a fixed time; the figure is all writers' writes per second,
median (min-max) of the repetitions. Systems and settings alternate within
each round, in a fresh random order.

- agentstate, group commit: ``Scope.put`` as shipped (writes of concurrent
  threads share one transaction and one COMMIT).
- agentstate, one transaction per write: the same with the store's
  ``group_commit`` switched off (each put its own BEGIN IMMEDIATE ... COMMIT).
- raw apsw: one connection per writer, BEGIN IMMEDIATE; INSERT OR REPLACE;
  COMMIT per write, json.dumps, WAL, the same synchronous, busy timeout 60 s.

Threads share one process (and can share a commit); processes cannot: SQLite
has one writer at a time per file and a commit is one process's transaction,
so each process's write pays its own fsync at durability full.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

import apsw

from . import stamp

HERE = os.path.dirname(os.path.abspath(__file__))
SYNC = {"full": "FULL", "normal": "NORMAL"}


class _Agentstate:
    def __init__(self, path: str, dur: str, group: bool) -> None:
        import agentstate

        self.db = agentstate.open(os.path.join(path, "a.db"), durability=dur, busy_timeout=60)
        self.db._ops.store.group_commit = group  # the comparison switch (private)
        self.scope = self.db.scope("session", "bench")

    def put(self, key: str, value: Any) -> None:
        self.scope.put(key, value)

    def close(self) -> None:
        self.db.close()


class _Apsw:
    """Raw apsw: a connection per thread (one writer each, as SQLite wants)."""

    def __init__(self, path: str, dur: str) -> None:
        self.path, self.dur = os.path.join(path, "raw.db"), dur
        self.local = threading.local()
        self.conns: list[apsw.Connection] = []
        c = self._conn()
        c.execute("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v TEXT NOT NULL)")

    def _conn(self) -> apsw.Connection:
        c = getattr(self.local, "c", None)
        if c is None:
            c = self.local.c = apsw.Connection(self.path)
            c.set_busy_timeout(60_000)
            c.pragma("journal_mode", "wal")
            c.pragma("synchronous", SYNC[self.dur])
            self.conns.append(c)
        return c

    def put(self, key: str, value: Any) -> None:
        c = self._conn()
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (key, json.dumps(value)))
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def close(self) -> None:
        for c in self.conns:
            c.close()


def open_system(system: str, path: str, dur: str) -> Any:
    if system == "apsw":
        return _Apsw(path, dur)
    return _Agentstate(path, dur, group=system == "agentstate")


def _writer(h: Any, w: int, start: float, stop: float, counts: list[int]) -> None:
    value = {"writer": w, "text": "x" * 100}
    n = 0
    while time.perf_counter() < start:
        time.sleep(0.0005)
    while time.perf_counter() < stop:
        h.put(f"w{w}-{n % 100}", value)
        n += 1
    counts[w] = n


COST: dict[tuple, list[tuple[float, float, float]]] = {}  # cfg -> (user µs, sys µs, switches) a write


def run_threads(system: str, path: str, dur: str, writers: int, seconds: float) -> float:
    h = open_system(system, path, dur)
    try:
        h.put("warm", 0)
        counts = [0] * writers
        start = time.perf_counter() + 0.05 + 0.01 * writers
        ts = [threading.Thread(target=_writer, args=(h, w, start, start + seconds, counts))
              for w in range(writers)]
        for t in ts:
            t.start()
        time.sleep(max(0.0, start - time.perf_counter()))
        r0 = resource.getrusage(resource.RUSAGE_SELF)  # the whole process: every thread
        for t in ts:
            t.join()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        n = max(1, sum(counts))
        COST.setdefault((system, dur, "threads", writers), []).append((
            (r1.ru_utime - r0.ru_utime) / n * 1e6, (r1.ru_stime - r0.ru_stime) / n * 1e6,
            (r1.ru_nvcsw + r1.ru_nivcsw - r0.ru_nvcsw - r0.ru_nivcsw) / n))
        return sum(counts) / seconds
    finally:
        h.close()


def _proc_main(system: str, path: str, dur: str, w: int, ready: Any, go: Any, out: Any,
               seconds: float) -> None:
    h = open_system(system, path, dur)
    h.put(f"warm{w}", 0)
    counts = [0] * (w + 1)
    ready.release()
    go.wait()
    start = time.perf_counter()
    _writer(h, w, start, start + seconds, counts)
    out.put(counts[w])
    h.close()


def run_processes(system: str, path: str, dur: str, writers: int, seconds: float) -> float:
    open_system(system, path, dur).close()  # the schema, before the race
    ctx = mp.get_context("spawn")
    ready, go, out = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    ps = [ctx.Process(target=_proc_main, args=(system, path, dur, w, ready, go, out, seconds))
          for w in range(writers)]
    for p in ps:
        p.start()
    for _ in ps:
        if not ready.acquire(timeout=300):
            raise RuntimeError("a writer process did not start")
    go.set()
    total = sum(out.get(timeout=300) for _ in ps)
    for p in ps:
        p.join(timeout=60)
    return total / seconds


LABEL = {"agentstate": "agentstate, group commit", "onetxn": "agentstate, one transaction per write",
         "apsw": "raw apsw, one transaction per write"}


def configs(writers: int) -> list[tuple[str, str, str, int]]:
    """(system, durability, how, writers)."""
    out = []
    for dur in ("full", "normal"):
        for n in (1, writers):
            for system in ("agentstate", "onetxn", "apsw"):
                out.append((system, dur, "threads", n))
    for system in ("agentstate", "apsw"):
        out.append((system, "full", "processes", writers))
    return out


def measure(repeats: int, seconds: float, writers: int) -> dict[tuple, list[float]]:
    res: dict[tuple, list[float]] = {cfg: [] for cfg in configs(writers)}
    with tempfile.TemporaryDirectory(prefix="agentstate-gc-") as root:
        for r in range(repeats):
            order = list(res)
            random.Random(r).shuffle(order)
            for cfg in order:
                system, dur, how, n = cfg
                path = os.path.join(root, f"{system}-{dur}-{how}-{n}-{r}")
                os.makedirs(path)
                run = run_threads if how == "threads" else run_processes
                res[cfg].append(run(system, path, dur, n, seconds))
                print(f"  {cfg}: {res[cfg][-1]:,.0f} writes/s", file=sys.stderr)
    return res


def _fig(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.0f} ({min(xs):,.0f}–{max(xs):,.0f})"


def _ratio(xs: list[float], base: list[float]) -> str:
    rs = [a / b for a, b in zip(xs, base)]  # per round: the same disk and CPU weather
    return f"{statistics.median(rs):.2f}× ({min(rs):.2f}–{max(rs):.2f})"


def table(res: dict[tuple, list[float]], writers: int) -> str:
    lines = ["| writers | durability | system | writes/s | × one transaction per write | × raw apsw |",
             "|---|---|---|---|---|---|"]
    for cfg, xs in res.items():
        system, dur, how, n = cfg
        one = res.get(("onetxn", dur, how, n))
        raw = res.get(("apsw", dur, how, n))
        vs_one = _ratio(xs, one) if one and system == "agentstate" else ""
        vs_raw = _ratio(xs, raw) if raw and system != "apsw" else ""
        who = f"{n} {'thread' if how == 'threads' else 'process'}{'' if n == 1 else ('s' if how == 'threads' else 'es')}"
        lines.append(f"| {who} | {dur} | {LABEL[system]} | {_fig(xs)} | {vs_one} | {vs_raw} |")
    return "\n".join(lines)


def cost_table(res: dict[tuple, list[float]], writers: int) -> str:
    """Where a write's time goes, threads at durability full: the process's CPU (all
    threads, user and kernel) and context switches per write, medians of the rounds."""
    lines = ["| writers | system | writes/s | wall µs a write | user CPU µs | kernel CPU µs | context switches |",
             "|---|---|---|---|---|---|---|"]
    for n in (1, writers):
        for system in ("agentstate", "onetxn", "apsw"):
            cfg = (system, "full", "threads", n)
            if cfg not in COST:
                continue
            u, k, x = (statistics.median(v[i] for v in COST[cfg]) for i in range(3))
            rate = statistics.median(res[cfg])
            who = f"{n} thread{'' if n == 1 else 's'}"
            lines.append(f"| {who} | {LABEL[system]} | {rate:,.0f} | {1e6 / rate:.0f} | {u:.0f} | {k:.0f} | {x:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 0.2 s per figure, one round")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--writers", type=int, default=16)
    ap.add_argument("--out", default=None, help="write GROUP-COMMIT.md into this folder")
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.seconds, a.writers = 1, 0.2, 4
    t0 = time.time()
    load0 = os.getloadavg()
    res = measure(a.repeats, a.seconds, a.writers)
    text = table(res, a.writers)
    cost = cost_table(res, a.writers)
    normal = _ratio(res[("agentstate", "normal", "threads", a.writers)], res[("onetxn", "normal", "threads", a.writers)])
    print(text)
    print(cost)
    if a.out:
        doc = f"""# Group commit: {a.writers} writers at once

{stamp.generated('python -m benchmarks.group_commit', t0, load0, system=True)}

Each writer puts a small value (~120 bytes of JSON) to 100 keys of its own, in turn, as fast as it can for {a.seconds:g} s; the figure is all writers' writes per second, median (min–max) of {a.repeats} rounds; the ratios are taken round by round. Every put is acknowledged only after the COMMIT that covers it.

{text}

Threads of one process share a commit: while one group's COMMIT waits for its fsync, the writes that arrive queue up and the next group commits them all with one more. Processes cannot: a SQLite commit is one connection's transaction, so {a.writers} processes at durability full pay one fsync per write, like raw apsw (group commit does not reach across processes; an HTTP server in front of the file does, for its clients).

At durability normal a COMMIT does not wait for a fsync, so there is little to share and the hand-offs between threads to pay: grouped, {a.writers} threads writing flat out ran at {normal} of one transaction per write. agentstate groups at normal all the same: there a waiting writer queues in Python and is woken when its group commits, where one transaction per write waits in SQLite's busy handler, which sleeps and retries; in an HTTP server at 64 clients that doubles PUTs (SERVER-GROUP-COMMIT.md).

## Where a write's time goes (durability full)

The same runs, read from the process's own counters (`getrusage`: every thread's CPU in user space and in the kernel, and its context switches, voluntary or not, a fsync's wait included), divided by the writes, medians of the rounds:

{cost}

How to read it: one transaction per write is paced by the disk (a fsync a write: the wall time a write far above its CPU). Group commit shares the fsync, so the CPU becomes the limit: each grouped write puts its thread to sleep until the leader's COMMIT and wakes it after, and the woken threads then queue again for the one interpreter lock, so a grouped write costs several context switches and more CPU than a lone one, in the kernel and in Python. On 2 cores with CPython's lock, that CPU and the hand-offs between threads — not the fsync — cap the writes per second of {a.writers} threads (compare the wall time a write with its CPU); the ratio to one transaction per write therefore grows with the disk's fsync time and shrinks with a faster disk.
"""
        with open(os.path.join(a.out, "GROUP-COMMIT.md"), "w", encoding="utf-8") as f:
            f.write(doc)


if __name__ == "__main__":
    main()
