"""Google ADK sessions: AgentStateSessionService beside ADK's own SQLite services.

    python -m benchmarks.adapter_adk             # histories of 10, 1,000 and 10,000 events
    python -m benchmarks.adapter_adk --quick     # a smoke run: 10 and 100 events (seconds)
    python -m benchmarks.adapter_adk --repeats 7 --out DIR   # writes DIR/ADAPTER-ADK.md

Run from the repository root. Systems, each on its own file in one temporary
folder, each with its defaults (what a user gets by passing a path):

- agentstate: ``AgentStateSessionService(agentstate.open(path))`` (WAL,
  synchronous=FULL);
- ADK ``SqliteSessionService(path)`` (aiosqlite, a connection per call,
  SQLite's default rollback journal, synchronous=FULL);
- ADK ``DatabaseSessionService("sqlite+aiosqlite:///path")`` (SQLAlchemy; only
  with ``pip install 'google-adk[db]'``, else reported as not installed).

One session per system grows to each history length by ``append_event``
(untimed); then, in rounds that visit the systems in a fresh random order,
each round times, per system: ``append_event`` of a few events (each with a
state delta of a session key and a ``user:`` key), ``get_session`` of the
whole session, and ``get_session`` with ``num_recent_events=50`` (what a
``RunConfig`` with a history limit asks for). Figures are medians of all the
rounds (appends: of every single append), in milliseconds, with the ratio
ADK / agentstate (above 1: agentstate is faster).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from importlib import metadata
from typing import Any

from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types

import agentstate
from agentstate.integrations.adk import AgentStateSessionService

HERE = os.path.dirname(os.path.abspath(__file__))
APP, USER = "bench", "user-1"
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters per event
SYSTEMS = {
    "agentstate": "agentstate AgentStateSessionService",
    "adk_sqlite": "ADK SqliteSessionService",
    "adk_database": "ADK DatabaseSessionService (sqlite+aiosqlite)",
}


def make(name: str, folder: str) -> Any:
    path = os.path.join(folder, name + ".db")
    if name == "agentstate":
        return AgentStateSessionService(path)
    if name == "adk_sqlite":
        return SqliteSessionService(path)
    from google.adk.sessions.database_session_service import DatabaseSessionService
    return DatabaseSessionService(f"sqlite+aiosqlite:///{path}")


def missing(name: str) -> str | None:
    if name != "adk_database":
        return None
    try:
        import sqlalchemy  # noqa: F401  (DatabaseSessionService needs it)
    except ImportError:
        return "not installed (pip install 'google-adk[db]')"
    return None


def an_event(i: int) -> Event:
    return Event(
        invocation_id=f"inv-{i // 2}", author="user" if i % 2 == 0 else "assistant",
        content=types.Content(role="user" if i % 2 == 0 else "model",
                              parts=[types.Part(text=f"{i}: {TEXT}")]),
        actions=EventActions(state_delta={"turn": i, "user:last_turn": i}),
    )


async def settle() -> None:
    """Free the previous operation's garbage before timing the next one: the
    10,000 events of a whole session are otherwise freed during the next call
    (whichever system makes it), which then looks 30 ms slower."""
    await asyncio.sleep(0)
    gc.collect()


class Subject:
    """One system's service and its one session, grown as the run goes."""

    def __init__(self, name: str, folder: str) -> None:
        self.name = name
        self.service = make(name, folder)
        self.session: Any = None
        self.count = 0

    async def start(self) -> None:
        self.session = await self.service.create_session(app_name=APP, user_id=USER,
                                                         session_id="s")

    async def append(self) -> float:
        await settle()
        t = time.perf_counter()
        await self.service.append_event(self.session, an_event(self.count))
        self.count += 1
        return time.perf_counter() - t

    async def grow(self, to: int) -> None:
        while self.count < to:
            await self.service.append_event(self.session, an_event(self.count))
            self.count += 1
        # the in-memory copy grew too: drop it, as a server would between requests
        self.session = await self.service.get_session(
            app_name=APP, user_id=USER, session_id="s", config=GetSessionConfig(num_recent_events=0))

    async def get(self, config: GetSessionConfig | None = None) -> float:
        await settle()
        t = time.perf_counter()
        got = await self.service.get_session(app_name=APP, user_id=USER, session_id="s",
                                             config=config)
        elapsed = time.perf_counter() - t
        want = self.count if config is None else min(self.count, config.num_recent_events)
        assert len(got.events) == want, (self.name, len(got.events), want)
        return elapsed

    async def close(self) -> None:
        await self.service.close()


async def run(levels: list[int], repeats: int, appends: int, names: list[str],
              log: Any) -> dict[tuple[str, int, str], list[float]]:
    folder = tempfile.mkdtemp(prefix="adk-bench-")
    subjects = [Subject(n, folder) for n in names]
    times: dict[tuple[str, int, str], list[float]] = {}
    try:
        for s in subjects:
            await s.start()
        for level in levels:
            for s in subjects:
                t = time.perf_counter()
                await s.grow(level)
                log(f"{s.name}: grown to {level} events in {time.perf_counter() - t:.1f} s")
            rng = random.Random(level)
            for _ in range(repeats):
                order = subjects[:]
                rng.shuffle(order)
                for s in order:
                    at = (s.name, level)
                    times.setdefault((*at, "get_session"), []).append(await s.get())
                    times.setdefault((*at, "get_session, last 50"), []).append(
                        await s.get(GetSessionConfig(num_recent_events=50)))
                    for _ in range(appends):
                        times.setdefault((*at, "append_event"), []).append(await s.append())
    finally:
        for s in subjects:
            await s.close()
        shutil.rmtree(folder, ignore_errors=True)
    return times


def machine() -> list[str]:
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return [
        f"- {platform.platform()}, {os.cpu_count()} cores, load average at the start {load}",
        f"- Python {platform.python_version()}; SQLite {agentstate.__name__} (apsw) "
        f"{__import__('apsw').sqlite_lib_version()}, sqlite3 module {sqlite3.sqlite_version}",
        f"- google-adk {metadata.version('google-adk')}, agentstate {agentstate.__version__}, "
        f"SQLAlchemy {_version('sqlalchemy')}, aiosqlite {_version('aiosqlite')}",
        f"- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
    ]


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def report(times: dict[tuple[str, int, str], list[float]], levels: list[int], names: list[str],
           absent: dict[str, str], repeats: int, appends: int, quick: bool) -> str:
    ops = ["append_event", "get_session", "get_session, last 50"]
    head = ["operation", "events", "agentstate ms"]
    for n in names[1:]:
        head += [f"{SYSTEMS[n]} ms", "ratio"]
    lines = [
        "# Google ADK sessions: agentstate beside ADK's own SQLite services",
        "",
        "Written by `python -m benchmarks.adapter_adk"
        + (" --quick" if quick else "") + f" --repeats {repeats}`"
        + " (see its docstring for the method). Medians in milliseconds (min-max);"
        + " ratio = ADK / agentstate, above 1 means agentstate is faster."
        + f" `events` is the history when the round starts; each round adds {appends}"
        + " events per system.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for op in ops:
        for level in levels:
            ours = times[("agentstate", level, op)]
            row = [op, f"{level:,}", _cell(ours)]
            for n in names[1:]:
                if n in absent:
                    row += [absent[n], ""]
                    continue
                theirs = times[(n, level, op)]
                row += [_cell(theirs), f"**{statistics.median(theirs) / statistics.median(ours):.1f}×**"]
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "What stays the same from run to run:",
        "",
        "- `append_event` does not grow with the history here (one run entry and the"
        " session's head per event, in one transaction), and the two ADK services'"
        " appends open a connection (and the Database one an ORM session) per call.",
        "- `get_session` of a whole session is bound by ADK's own parsing of the"
        " events (its pydantic and google-genai validators: about 90% of the time,"
        " whichever store): every system is within a few tens of percent of the"
        " others there, and agentstate cannot be much ahead of ADK's SQLite service.",
        "- `get_session` of the last 50 reads only those 50 here, whatever the history.",
        "- Durability is not equal: agentstate commits with one fsync of its WAL, ADK's"
        " services with SQLite's default rollback journal (several fsyncs per commit).",
        "",
        "## Machine", "", *machine(), ""]
    return "\n".join(lines)


def _cell(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.2f} ({min(xs) * 1000:.2f}-{max(xs) * 1000:.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="histories of 10 and 100 events")
    p.add_argument("--repeats", type=int, default=None, help="rounds per history length")
    p.add_argument("--out", default=HERE, help="folder for ADAPTER-ADK.md")
    a = p.parse_args(argv)
    levels = [10, 100] if a.quick else [10, 1_000, 10_000]
    repeats = a.repeats or (2 if a.quick else 5)
    appends = 3 if a.quick else 5
    absent = {n: why for n in SYSTEMS if (why := missing(n))}
    names = list(SYSTEMS)
    live = [n for n in names if n not in absent]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    times = asyncio.run(run(levels, repeats, appends, live, log))
    md = report(times, levels, names, absent, repeats, appends, a.quick)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ADAPTER-ADK.md"), "w", encoding="utf-8") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
