"""AgentStateSession beside openai-agents' own SQLiteSession (file-backed), one workload.

    python -m benchmarks.adapter_openai_agents            # the full run, writes ADAPTER-OPENAI-AGENTS.md
    python -m benchmarks.adapter_openai_agents --quick    # a smoke run (seconds), prints the table
    python -m benchmarks.adapter_openai_agents --repeats 30 --out PATH

Run from the repository root. For each history length (10, 1,000, 10,000
items) both sessions get a fresh file with that history, then, repetition by
repetition, in a fresh random order of the three, the timed calls: ``add_items``
of one turn (a user and an assistant message), ``pop_item`` (twice, giving the
turn back, so the history stays at its length), ``get_items(20)`` and
``get_items()`` (the whole history: what the Runner reads with no limit set).
Each figure is the median of the repetitions, per call; the ratio is the
median, over the repetitions, of SQLiteSession's time over AgentStateSession's
in the same repetition (above 1: AgentStateSession is faster). Both run at their defaults, which are the same durability: WAL with
synchronous=FULL (SQLiteSession 0.24 switches its file to WAL itself). A third
column shows AgentStateSession on a file with the change feed off
(``feed_retention`` 0, SPEC §10): what the feed's rows cost each write. Last,
the WAL frames (pages) one ``add_items`` writes, on fresh files: what each
commit's fsync has to flush.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import apsw
from agents import SQLiteSession

import agentstate
from agentstate.integrations.openai_agents import AgentStateSession

HERE = Path(__file__).resolve().parent
OPS = ["add_items (one turn)", "pop_item", "get_items(20)", "get_items() all"]
SYSTEMS = ["agentstate", "agentstate-nofeed", "sqlite"]


def turn(n: int) -> list[dict[str, Any]]:
    """A user message and an assistant answer, of the shape the Runner stores."""
    return [
        {"role": "user", "content": f"Question {n}: " + "what does the report say about it? " * 5},
        {"id": f"msg_{n:08d}", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "annotations": [],
                      "text": f"Answer {n}: " + "the report says it grew steadily. " * 18}]},
    ]


def open_session(system: str, folder: str) -> Any:
    path = os.path.join(folder, f"{system}.db")
    if system == "sqlite":
        return SQLiteSession("bench", path)
    if system == "agentstate-nofeed":
        with agentstate.open(path) as db:
            db.set_setting("feed_retention", 0)
    return AgentStateSession("bench", db_path=path)


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    await call()
    return time.perf_counter() - t


async def measure(history: int, repeats: int, folder: str) -> dict[str, dict[str, list[float]]]:
    sessions = {s: open_session(s, folder) for s in SYSTEMS}
    for s in sessions.values():
        for i in range(0, history, 500):
            await s.add_items([x for n in range(i // 2, min(i + 500, history) // 2) for x in turn(n)])
        assert len(await s.get_items()) == history // 2 * 2
    times: dict[str, dict[str, list[float]]] = {s: {op: [] for op in OPS} for s in SYSTEMS}
    order = list(SYSTEMS)
    for rep in range(repeats):
        random.shuffle(order)
        for name in order:
            s, t = sessions[name], times[name]
            t[OPS[0]].append(await timed(lambda: s.add_items(turn(10**6 + rep))))
            t[OPS[1]].append(await timed(s.pop_item))
            await s.pop_item()
            t[OPS[2]].append(await timed(lambda: s.get_items(20)))
            if rep < max(3, repeats // 3):  # the whole history: the slow one, fewer times
                t[OPS[3]].append(await timed(s.get_items))
    for s in sessions.values():
        s.close()
    return times


async def wal_frames(system: str, folder: str, adds: int = 50) -> float:
    """WAL frames written per add_items of one turn (fewer than a checkpoint's 1,000 pages)."""
    s = open_session(system, folder)
    await s.add_items([x for n in range(50) for x in turn(n)])
    wal = os.path.join(folder, f"{system}.db-wal")
    before = os.path.getsize(wal)
    for n in range(adds):
        await s.add_items(turn(n))
    frames = (os.path.getsize(wal) - before) / adds / (4096 + 24)  # both use 4 KiB pages
    s.close()  # the last connection to close removes the WAL
    return frames


def fmt(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def commit() -> str:
    """The repository's commit, when run from a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except OSError:
        return ""


def machine() -> list[str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return [
        f"- {cpu}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}",
        f"- agentstate's SQLite (apsw) {apsw.sqlite_lib_version()}; SQLiteSession's SQLite "
        f"(Python sqlite3) {sqlite3.sqlite_version}; openai-agents "
        f"{importlib.metadata.version('openai-agents')}; agentstate "
        f"{importlib.metadata.version('agentstate')} at commit {commit() or '?'}",
        "- load average at the start " + _load()
        + " (the machine is shared: the ratios, measured side by side, are the robust figures)",
    ]


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def table(results: dict[int, dict[str, dict[str, list[float]]]]) -> str:
    lines = [
        "| operation | history | AgentStateSession | SQLiteSession | SQLiteSession ÷ "
        "AgentStateSession | AgentStateSession, feed off |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for op in OPS:
        for history, times in results.items():
            ours, nofeed, theirs = (statistics.median(times[s][op]) for s in SYSTEMS)
            # paired: each repetition's ratio, the two calls made back to back
            ratio = statistics.median(
                b / a for a, b in zip(times["agentstate"][op], times["sqlite"][op]))
            lines.append(f"| {op} | {history:,} | {fmt(ours)} | {fmt(theirs)} | "
                         f"**{ratio:.2f}×** | {fmt(nofeed)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="histories 10 and 100, 3 repetitions")
    ap.add_argument("--repeats", type=int, default=None, help="repetitions per figure (default 30)")
    ap.add_argument("--out", default=None,
                    help="markdown file to write (default: benchmarks/ADAPTER-OPENAI-AGENTS.md; "
                         "--quick prints only)")
    args = ap.parse_args(argv)
    histories = [10, 100] if args.quick else [10, 1_000, 10_000]
    repeats = args.repeats or (3 if args.quick else 100)
    out = args.out or (None if args.quick else str(HERE / "ADAPTER-OPENAI-AGENTS.md"))
    started = time.time()
    head = machine()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for history in histories:
            folder = os.path.join(tmp, str(history))
            os.makedirs(folder)
            results[history] = asyncio.run(measure(history, repeats, folder))
        os.makedirs(os.path.join(tmp, "wal"))
        frames = {s: asyncio.run(wal_frames(s, os.path.join(tmp, "wal"))) for s in SYSTEMS}
    md = "\n".join([
        "# openai-agents: AgentStateSession beside SQLiteSession",
        "",
        f"Generated by `python -m benchmarks.adapter_openai_agents{' --quick' if args.quick else ''}` "
        f"on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC in "
        f"{time.time() - started:.0f} s. Per call, median of {repeats} repetitions "
        f"(get_items() all: of {max(3, repeats // 3)}); both sessions on files in one folder, "
        "called from one event loop, in a fresh random order at each repetition.",
        "",
        table(results),
        "",
        "Durability: both at their defaults, the same: WAL, synchronous=FULL, one fsync per "
        "commit. The feed-off column is agentstate with `feed_retention` 0 (SPEC §10).",
        "",
        "WAL frames (4 KiB pages) written per `add_items` of one turn: AgentStateSession "
        f"{frames['agentstate']:.1f}, with the feed off {frames['agentstate-nofeed']:.1f}, "
        f"SQLiteSession {frames['sqlite']:.1f}.",
        "",
        "## Machine",
        "",
        *head,
        f"- load average at the end {_load()}",
        "",
    ])
    print(md)
    if out:
        Path(out).write_text(md, encoding="utf-8")


if __name__ == "__main__":
    main()
