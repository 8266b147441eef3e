"""Benchmark agentstate against raw apsw (the floor) and peer stores: one command.

    python -m benchmarks.run                  # the full run (~10-15 min on 2 cores)
    python -m benchmarks.run --quick          # tiny sizes, a smoke run (seconds)
    python -m benchmarks.run --repeats 7      # runs per figure (default 5)
    python -m benchmarks.run --out DIR        # where RESULTS.md and ratios.png go (default benchmarks/)
    python -m benchmarks.run --only put,get --systems agentstate,apsw,diskcache

Run from the repository root. Peers are optional (``pip install -e '.[bench]'``
or ``pip install diskcache sqlitedict langgraph-checkpoint-sqlite openai-agents
matplotlib``): a peer that is not installed gets "not installed" and the run
goes on; without matplotlib the chart is skipped.

Systems: agentstate; raw apsw, the floor (the least SQL for the same
operation, one BEGIN IMMEDIATE ... COMMIT per write, WAL, same synchronous);
diskcache; sqlitedict; langgraph's SqliteStore and SqliteSaver; the
openai-agents SQLiteSession. Each runs once at synchronous=FULL and once at
NORMAL where it lets you set it.

Workloads: put, get, update, contention (processes started together on one
counter), append (to lists of 100 / 1,000 / 3,000 items), history (entry +
snapshot on runs of 100 ... 100,000 entries, then the last 20), list (prefix
among 100,000 keys), cold open (a fresh process opens a ~100 MB file; the
files are generated once into benchmarks/.cache/).

Systems alternate run by run in this one process tree, and within a round
chunk by chunk (a fresh random order at each step); every figure is the median of ``--repeats`` runs with its
min-max, and every figure is also given as a ratio to raw apsw measured in
the same round. Writes ``RESULTS.md`` and ``ratios.png``.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

from . import report, systems, workloads
from .systems import NA

HERE = os.path.dirname(os.path.abspath(__file__))
DURS = ("full", "normal")


def _err(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}".replace("\n", " ").replace("|", "/")
    return s if len(s) <= 160 else s[:157] + "..."


def probe_sync(names: list[str], missing: dict[str, str], root: str) -> dict[str, dict[str, str]]:
    """What synchronous each system really runs with, read back from its connection."""
    out: dict[str, dict[str, str]] = {}
    for name in names:
        out[name] = {}
        if name in missing:
            continue
        sysobj = systems.get(name)
        for dur in DURS:
            path = os.path.join(root, "probe", name, dur)
            os.makedirs(path, exist_ok=True)
            try:
                h = sysobj.open(path, dur)
                try:
                    out[name][dur] = h.sync_level()
                finally:
                    h.close()
            except Exception as e:
                out[name][dur] = f"? ({_err(e)})"
    shutil.rmtree(os.path.join(root, "probe"), ignore_errors=True)
    return out


def run_workload(wl: workloads.Workload, names: list[str], missing: dict[str, str],
                 repeats: int, log: Any) -> dict[str, Any]:
    durs = ("full",) if wl.name == "coldopen" else DURS
    cells: dict[str, dict[str, dict[str, Any]]] = {
        d: {n: {"status": "ok", "runs": [None] * repeats, "errors": []} for n in names} for d in durs}

    def mark(name: str, status: str, only: str | None = None) -> None:
        for d in durs:
            if only is None or d == only:
                cells[d][name]["status"] = status

    t_start = time.perf_counter()
    active = []
    for name in names:
        sysobj = systems.get(name)
        if name in missing:
            mark(name, "not installed")
            continue
        if wl.name not in sysobj.supports:
            mark(name, "n/a: " + sysobj.na_why.get(wl.name, "cannot express it"))
            continue
        try:
            wl.setup(name)
        except NA as e:
            mark(name, f"n/a: {e}")
            continue
        except Exception as e:
            mark(name, f"error in setup: {_err(e)}")
            log(f"[{wl.name}] setup {name}: {_err(e)}")
            continue
        active.append(name)
    pairs = []
    for name in active:
        for d in durs:
            if d == "normal" and not systems.get(name).settable:
                mark(name, f"cannot set (runs {systems.get(name).fixed} only)", only=d)
                continue
            pairs.append((name, d))
    main = wl.metric_names()[0]
    try:
        for r in range(repeats):
            # One round: every (system, durability) does one run. The runs are
            # generators cut into timed chunks, stepped in a fresh random order
            # each time, so all systems share the same moments of disk and CPU
            # and none always follows the same neighbour.
            rng = random.Random(f"{wl.name}-{r}")
            live = [(name, d, wl.measure(name, d, r)) for name, d in pairs
                    if cells[d][name]["status"] == "ok"]
            while live:
                order = live[:]
                rng.shuffle(order)
                for item in order:
                    name, d, gen = item
                    cell = cells[d][name]
                    try:
                        next(gen)
                        continue
                    except StopIteration as stop:
                        m = stop.value
                        cell["runs"][r] = m
                        log(f"[{wl.name}] r{r + 1}/{repeats} {name:<11} {d:<6} {main} = "
                            f"{m.get(main, float('nan')):.4g}")
                    except NA as e:
                        cell["status"] = f"n/a: {e}"
                    except Exception as e:
                        cell["errors"].append(_err(e))
                        log(f"[{wl.name}] r{r + 1} {name} {d}: ERROR {_err(e)}")
                    live.remove(item)
    finally:
        wl.teardown()
    for d in durs:
        for name in names:
            cell = cells[d][name]
            if cell["status"] == "ok" and cell["errors"]:
                ok = sum(x is not None for x in cell["runs"])
                cell["status"] = f"error ({len(cell['errors'])} of {repeats} runs): {cell['errors'][0]}"
                if ok:
                    cell["status_partial"] = True
    res = {"name": wl.name, "title": wl.title, "metrics": wl.metric_names(),
           "higher": wl.higher_is_better, "cells": cells, "how": wl.how,
           "seconds": time.perf_counter() - t_start}
    compute_stats(res)
    return res


def _summ(xs: list[float]) -> dict[str, float] | None:
    xs = [x for x in xs if isinstance(x, (int, float)) and not isinstance(x, bool) and x == x]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def compute_stats(res: dict[str, Any]) -> None:
    """Median/min/max of each metric and of its per-round ratio to raw apsw."""
    for row in res["cells"].values():
        base = row.get("apsw", {}).get("runs", [])
        for cell in row.values():
            cell["stats"], cell["ratio"] = {}, {}
            runs = cell["runs"]
            if not any(runs):
                continue
            keys = set().union(*(m.keys() for m in runs if m))
            for key in keys:
                cell["stats"][key] = _summ([m.get(key) if m else None for m in runs])
            for key in res["metrics"]:
                rs = []
                for r, m in enumerate(runs):
                    b = base[r] if r < len(base) else None
                    if m and b and m.get(key) and b.get(key):
                        rs.append(m[key] / b[key] if res["higher"] else b[key] / m[key])
                cell["ratio"][key] = _summ(rs)


def machine_info(names: list[str], missing: dict[str, str]) -> dict[str, str]:
    import importlib.metadata as md
    import sqlite3

    import apsw

    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "OS": platform.platform(),
        "Python": sys.version.split()[0],
        "SQLite (apsw)": apsw.sqlite_lib_version(),
        "SQLite (Python sqlite3: diskcache, sqlitedict, langgraph, openai-agents)": sqlite3.sqlite_version,
        "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    pkgs = ["agentstate", "apsw", "pydantic", "diskcache", "sqlitedict", "langgraph-checkpoint-sqlite",
            "langgraph-checkpoint", "openai-agents", "matplotlib"]
    for p in pkgs:
        try:
            info[p] = md.version(p)
        except md.PackageNotFoundError:
            info[p] = "not installed"
    return info


def fsync_cost(root: str) -> dict[str, float]:
    """Microseconds per empty-ish commit at FULL and NORMAL on this disk, for context."""
    import apsw

    out = {}
    for d in DURS:
        p = os.path.join(root, f"fsync-{d}.db")
        c = apsw.Connection(p)
        c.pragma("journal_mode", "wal")
        c.pragma("synchronous", systems.SYNC[d])
        c.execute("CREATE TABLE t (x)")
        t0 = time.perf_counter()
        for i in range(200):
            c.execute("BEGIN IMMEDIATE; INSERT INTO t VALUES (?); COMMIT", (i,))
        out[d] = (time.perf_counter() - t0) / 200 * 1e6
        c.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    ap.add_argument("--repeats", type=int, default=5, help="runs per figure (default 5)")
    ap.add_argument("--out", default=HERE, help="folder for RESULTS.md and ratios.png")
    ap.add_argument("--only", default="", help="comma-separated workloads (default: all)")
    ap.add_argument("--systems", default="", help="comma-separated systems (default: all; "
                    "agentstate and both raw apsw baselines are always run)")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--pretend-missing", default="", help=argparse.SUPPRESS)  # tests: "not installed"
    ap.add_argument("--render", default=None, metavar="PICKLE",
                    help="only write RESULTS.md again from a run's saved figures (e.g. after "
                         "editing ANALYSIS.md); every full-size run saves them as "
                         "benchmarks/.cache/last-run.pickle")
    args = ap.parse_args(argv)
    if args.render:
        import pickle

        with open(args.render, "rb") as f:
            results, meta = pickle.load(f)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "RESULTS.md"), "w", encoding="utf-8") as f:
            f.write(report.markdown(results, meta))
        return 0
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")

    wanted = [w for w in args.only.split(",") if w] or list(workloads.WORKLOADS)
    for w in wanted:
        if w not in workloads.WORKLOADS:
            ap.error(f"unknown workload {w!r}; one of {', '.join(workloads.WORKLOADS)}")
    names = list(systems.SYSTEMS)
    if args.systems:
        sel = set(args.systems.split(",")) | {"agentstate", *report.BASELINES}
        unknown = sel - set(names)
        if unknown:
            ap.error(f"unknown systems {sorted(unknown)}; of {', '.join(names)}")
        names = [n for n in names if n in sel]
    sizes = workloads.QUICK if args.quick else workloads.Sizes()
    os.makedirs(args.out, exist_ok=True)
    work = args.workdir or tempfile.mkdtemp(prefix="agentstate-bench-")
    os.makedirs(work, exist_ok=True)
    cache = os.path.join(work, "cache") if args.quick else os.path.join(HERE, ".cache")
    os.makedirs(cache, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    missing = {n: m for n in names if (m := systems.get(n).missing())}  # imports the peers
    gc.collect()
    gc.freeze()  # what is imported now is never scanned again: less GC noise in the timings
    for n in args.pretend_missing.split(","):
        if n in names and n not in ("agentstate", *report.BASELINES):
            missing[n] = "not installed (pretended)"
    for n, why in missing.items():
        log(f"{n}: {why}")
    t0 = time.perf_counter()
    started = datetime.datetime.now(datetime.timezone.utc)
    meta = {
        "command": "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "repeats": args.repeats,
        "quick": args.quick,
        "sizes": sizes,
        "machine": machine_info(names, missing),
        "fsync_us": fsync_cost(work),
        "sync": probe_sync(names, missing, work),
        "missing": missing,
        "names": names,
    }
    results = []
    try:
        for w in wanted:
            wl = workloads.make(w, sizes, work, cache)
            log(f"== {w}")
            res = run_workload(wl, names, missing, args.repeats, log)
            if w == "coldopen":
                res["sizes_mb"] = getattr(wl, "sizes_mb", {})
            results.append(res)
            print(report.workload_text(res, names), flush=True)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    meta["seconds"] = time.perf_counter() - t0
    meta["machine"]["load average at end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    md_path = os.path.join(args.out, "RESULTS.md")
    png_path = os.path.join(args.out, "ratios.png")
    chart = report.chart(results, names, png_path)
    meta["chart"] = chart
    if not args.quick:  # the figures, to render RESULTS.md again (--render)
        import pickle

        with open(os.path.join(cache, "last-run.pickle"), "wb") as f:
            pickle.dump((results, meta), f)
    with open(md_path, "w", encoding="utf-8") as f:
        f.write(report.markdown(results, meta))
    log(f"wrote {md_path}" + (f" and {png_path}" if chart is True else f" (chart: {chart})"))
    log(f"total {meta['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
