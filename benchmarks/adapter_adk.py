"""Google ADK sessions: AgentStateSessionService beside ADK's own services, on SQLite
and on PostgreSQL.

    python -m benchmarks.adapter_adk             # histories of 10, 1,000 and 10,000 events
    python -m benchmarks.adapter_adk --quick     # a smoke run: 10 and 50 events (seconds)
    python -m benchmarks.adapter_adk --repeats 7 --turns 200 --out DIR   # writes DIR/ADAPTER-ADK.md

Run from the repository root. Systems, each with its defaults (what a user gets
by passing a path or a URL):

- on SQLite, each on its own file in one temporary folder: agentstate
  (``AgentStateSessionService(path)``: WAL, synchronous=FULL); ADK
  ``SqliteSessionService(path)`` (aiosqlite, a connection per call, SQLite's
  default rollback journal, synchronous=FULL); ADK
  ``DatabaseSessionService("sqlite+aiosqlite:///path")`` (SQLAlchemy);
- on PostgreSQL, each in its own schema of one throwaway server started here
  with its durable defaults (``adapter_pg.py``): agentstate on a
  ``postgresql://`` store; ADK ``DatabaseSessionService`` on
  ``postgresql+psycopg://`` (SQLAlchemy's async engine on psycopg 3).

SQLAlchemy comes with ``pip install 'agentstate-db[bench]'``; without it its
columns say not installed.

1. Operations. One session per system grows to each history length by
   ``append_event`` (untimed); then, in rounds that visit the systems in a
   fresh random order, each round times, per system: ``append_event`` of a few
   events (each with a state delta of a session key and a ``user:`` key),
   ``get_session`` of the whole session, and ``get_session`` with
   ``num_recent_events=50`` (what a ``RunConfig`` with a history limit asks
   for). Figures are medians of all the rounds (appends: of every single
   append), in milliseconds, with the ratio ADK / agentstate (above 1:
   agentstate is faster).
2. What each piece bought: ``get_session`` of 1,000 events as shipped, beside
   the same reads without ``db.snapshot()`` and beside 0.2's reads (entries
   decoded by ``json``, one ``Event.model_validate_json`` per event).
3. A framework step end to end: an ADK ``Runner`` with a stub model (it answers
   at once) for ``--turns`` turns on one session per system, turns of the
   systems interleaved: the median wall time per turn.
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

from google.adk.agents import LlmAgent
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types

import agentstate
from agentstate.integrations import adk
from agentstate.integrations.adk import AgentStateSessionService

from .adapter_pg import Postgres, missing_sqlalchemy

HERE = os.path.dirname(os.path.abspath(__file__))
APP, USER = "bench", "user-1"
TEXT = "The quick brown fox jumps over the lazy dog. " * 4  # ~180 characters per event
SYSTEMS = {  # name -> (backend, column title)
    "agentstate": ("SQLite", "SQLite: agentstate"),
    "adk_sqlite": ("SQLite", "SqliteSessionService"),
    "adk_database": ("SQLite", "DatabaseSessionService (sqlite+aiosqlite)"),
    "agentstate_pg": ("PostgreSQL", "PostgreSQL: agentstate"),
    "adk_database_pg": ("PostgreSQL", "DatabaseSessionService (postgresql+psycopg)"),
}
OURS = {"SQLite": "agentstate", "PostgreSQL": "agentstate_pg"}


class Maker:
    """Makes each system's service: files in one folder, schemas on one server."""

    def __init__(self, folder: str, pg: Postgres) -> None:
        self.folder, self.pg, self.n = folder, pg, 0

    def __call__(self, name: str) -> Any:
        self.n += 1
        path = os.path.join(self.folder, f"{name}-{self.n}.db")
        if name == "agentstate":
            return AgentStateSessionService(path)
        if name == "adk_sqlite":
            return SqliteSessionService(path)
        if name == "agentstate_pg":
            return AgentStateSessionService(agentstate.open(self.pg.url(self.pg.schema())))
        from google.adk.sessions.database_session_service import DatabaseSessionService
        if name == "adk_database":
            return DatabaseSessionService(f"sqlite+aiosqlite:///{path}")
        return DatabaseSessionService(self.pg.sqlalchemy_url(self.pg.schema()))


async def close(service: Any) -> None:
    await service.close()
    if isinstance(service, AgentStateSessionService) and not service._owns_db:
        service.db.close()


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

    def __init__(self, name: str, make: Maker) -> None:
        self.name = name
        self.service = make(name)
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


async def run(levels: list[int], repeats: int, appends: int, names: list[str], make: Maker,
              log: Any) -> dict[tuple[str, int, str], list[float]]:
    subjects = [Subject(n, make) for n in names]
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
            await close(s.service)
    return times


# -- 2. what each piece bought -----------------------------------------------------------------

def _get_without_snapshot(service: AgentStateSessionService, session_id: str) -> Any:
    """get_session's reads as separate statements (no db.snapshot()), parsed as shipped."""
    head, version = service._head(APP, USER, session_id)
    entries = service._entries(head, None)
    return adk._to_session(head, version, service._app(APP).get("state", {}),
                           service._user(APP, USER).get("state", {}), [e.event for e in entries])


def _get_as_before(service: AgentStateSessionService, session_id: str) -> Any:
    """0.2's get_session: separate reads, entries decoded by json, one
    Event.model_validate_json per event."""
    head, version = service._head(APP, USER, session_id)
    entries = service.db.runs.entries(head["run"], 0, head["events"])
    return adk._to_session(head, version, service._app(APP).get("state", {}),
                           service._user(APP, USER).get("state", {}),
                           [Event.model_validate_json(e["event"]) for e in entries])


PIECES = ["as shipped: one db.snapshot(), raw entries parsed in one pydantic call",
          "the same reads without db.snapshot()",
          "0.2's: no snapshot, entries decoded by json, Event.model_validate_json per event"]


async def pieces(make: Maker, name: str, events: int, repeats: int) -> list[list[float]]:
    service = make(name)
    s = await service.create_session(app_name=APP, user_id=USER, session_id="p")
    for i in range(events):
        await service.append_event(s, an_event(i))
    calls = [
        lambda: service.get_session(app_name=APP, user_id=USER, session_id="p"),
        lambda: asyncio.to_thread(_get_without_snapshot, service, "p"),
        lambda: asyncio.to_thread(_get_as_before, service, "p"),
    ]
    out: list[list[float]] = [[] for _ in calls]
    for _ in range(repeats):
        order = list(range(len(calls)))
        random.shuffle(order)
        for i in order:
            await settle()
            t = time.perf_counter()
            got = await calls[i]()
            out[i].append(time.perf_counter() - t)
            assert len(got.events) == events
    await close(service)
    return out


# -- 3. the Runner, end to end ---------------------------------------------------------------

class StubModel(BaseLlm):
    """A model that answers at once: the framework's step without the network."""

    async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
        yield LlmResponse(content=types.Content(role="model", parts=[
            types.Part(text=f"Answer {len(llm_request.contents)}: {TEXT}")]))


async def runner(make: Maker, names: list[str], turns: int) -> dict[str, list[float]]:
    agent = LlmAgent(name="bot", model=StubModel(model="stub"), instruction="answer")
    services = {n: make(n) for n in names}
    runners, ids = {}, {}
    for n, service in services.items():
        runners[n] = Runner(agent=agent, app_name=APP, session_service=service)
        ids[n] = (await service.create_session(app_name=APP, user_id=USER)).id
    times: dict[str, list[float]] = {n: [] for n in names}
    order = list(names)
    for i in range(turns):
        random.shuffle(order)
        for n in order:
            message = types.Content(role="user", parts=[types.Part(text=f"{i}: {TEXT}")])
            t = time.perf_counter()
            async for _ in runners[n].run_async(user_id=USER, session_id=ids[n],
                                                new_message=message):
                pass
            times[n].append(time.perf_counter() - t)
    for n, service in services.items():
        got = await service.get_session(app_name=APP, user_id=USER, session_id=ids[n])
        assert len(got.events) == 2 * turns, (n, len(got.events))
        await close(service)
    return times


# -- the report --------------------------------------------------------------------------------

def machine(pg: Postgres) -> list[str]:
    try:
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "?"
    return [
        f"- {platform.platform()}, {os.cpu_count()} cores, load average at the start {load}"
        " (the machine is shared with other work: the ratios, of systems measured side by"
        " side, are the robust figures)",
        f"- Python {platform.python_version()}; SQLite {agentstate.__name__} (apsw) "
        f"{__import__('apsw').sqlite_lib_version()}, sqlite3 module {sqlite3.sqlite_version}; "
        f"PostgreSQL {pg.version()} (fsync on, synchronous_commit on)",
        f"- google-adk {metadata.version('google-adk')}, agentstate {agentstate.__version__}, "
        f"SQLAlchemy {_version('sqlalchemy')}, aiosqlite {_version('aiosqlite')}, "
        f"psycopg {_version('psycopg')}",
        f"- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
    ]


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cell(xs: list[float]) -> str:
    return f"{statistics.median(xs) * 1000:.2f} ({min(xs) * 1000:.2f}-{max(xs) * 1000:.2f})"


def _ratio(ours: list[float], theirs: list[float]) -> str:
    return f"**{statistics.median(theirs) / statistics.median(ours):.1f}×**"


def report(times: dict[tuple[str, int, str], list[float]], levels: list[int],
           absent: str | None, got: dict[str, list[list[float]]], loop: dict[str, list[float]],
           args: Any, appends: int, head: list[str]) -> str:
    ops = ["append_event", "get_session", "get_session, last 50"]
    names = list(SYSTEMS)
    cols = ["operation", "events"]
    for n in names:
        cols.append(SYSTEMS[n][1] + (" ms" if n in OURS.values() else ""))
        if n not in OURS.values():
            cols.append("ratio")
    lines = [
        "# Google ADK sessions: agentstate beside ADK's own services",
        "",
        "Written by `python -m benchmarks.adapter_adk" + (" --quick" if args.quick else "")
        + f" --repeats {args.repeats} --turns {args.turns}` (see its docstring for the method)."
        " Medians in milliseconds (min-max); ratio = ADK / agentstate on the same backend,"
        " above 1 means agentstate is faster. `events` is the history when the round starts;"
        f" each round adds {appends} events per system.",
        "",
        "## Operations",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for op in ops:
        for level in levels:
            row = [op, f"{level:,}"]
            for n in names:
                backend = SYSTEMS[n][0]
                if absent and n.startswith("adk_database"):
                    row += [absent, ""]
                    continue
                xs = times[(n, level, op)]
                row.append(_cell(xs))
                if n not in OURS.values():
                    row.append(_ratio(times[(OURS[backend], level, op)], xs))
            lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "- `append_event` does not grow with the history here (one run entry and the"
        " session's head per event, in one transaction); ADK's SQLite services open a"
        " connection per call (and the Database one an ORM session).",
        "- `get_session` of a whole session is bound by ADK's own parsing of the events"
        " (its pydantic and google-genai validators: about 35 µs an event, whichever"
        " store), so no store is far ahead of another there. agentstate reads the"
        " entries' stored text and parses them all in one pydantic call; that costs the"
        " same as one `Event.model_validate_json` per event, as ADK's services do (see"
        " the pieces below).",
        "- `get_session` of the last 50 reads only those 50 here, whatever the history.",
        "- Durability: agentstate commits with one fsync of its WAL; ADK's SQLite services"
        " with SQLite's default rollback journal (several fsyncs per commit). On PostgreSQL"
        " both commit with synchronous_commit on.",
        "",
        "## What each piece bought",
        "",
        f"`get_session` of a session of {args.pieces_events:,} events, through one"
        f" AgentStateSessionService per backend, medians of {args.pieces_repeats}:",
        "",
        "| how | SQLite ms | PostgreSQL ms |",
        "|---|---:|---:|",
    ]
    for i, label in enumerate(PIECES):
        lines.append(f"| {label} | {_cell(got['agentstate'][i])} | "
                     f"{_cell(got['agentstate_pg'][i])} |")
    lines += ["", "## An ADK Runner turn, end to end", "",
              "| backend | agentstate per turn | ADK's own per turn | ratio |",
              "|---|---:|---:|---:|"]
    for backend, ours in OURS.items():
        for n in names:
            if SYSTEMS[n][0] != backend or n == ours:
                continue
            theirs = (f"{absent}" if absent and n.startswith("adk_database") else
                      f"{statistics.median(loop[n]) * 1000:.2f} ms ({SYSTEMS[n][1]})")
            r = "" if absent and n.startswith("adk_database") else _ratio(loop[ours], loop[n])
            lines.append(f"| {backend} | {statistics.median(loop[ours]) * 1000:.2f} ms | "
                         f"{theirs} | {r} |")
    lines += ["", f"Medians over {args.turns} turns (each turn gets the whole session and"
              " appends the user's and the model's events; the history grows to"
              f" {2 * args.turns} events).", "", "## Machine", "", *head, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="histories of 10 and 50 events")
    p.add_argument("--repeats", type=int, default=None, help="rounds per history length")
    p.add_argument("--turns", type=int, default=None, help="Runner turns (default 200)")
    p.add_argument("--out", default=HERE, help="folder for ADAPTER-ADK.md")
    a = p.parse_args(argv)
    levels = [10, 50] if a.quick else [10, 1_000, 10_000]
    a.repeats = a.repeats or (2 if a.quick else 5)
    a.turns = a.turns or (2 if a.quick else 200)
    a.pieces_events = 20 if a.quick else 1_000
    a.pieces_repeats = a.repeats if a.quick else max(a.repeats, 15)  # small differences
    appends = 3 if a.quick else 5
    absent = missing_sqlalchemy()
    names = [n for n in SYSTEMS if not (absent and n.startswith("adk_database"))]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    # what the imports made lives to the end: out of the collector's sight, settle()'s
    # collections look at the run's own objects only (0.4 s each otherwise)
    gc.collect()
    gc.freeze()
    folder = tempfile.mkdtemp(prefix="adk-bench-")
    try:
        with Postgres() as pg:
            head = machine(pg)
            make = Maker(folder, pg)
            times = asyncio.run(run(levels, a.repeats, appends, names, make, log))
            got = {n: asyncio.run(pieces(make, n, a.pieces_events, a.pieces_repeats))
                   for n in OURS.values()}
            log("pieces measured")
            loop = asyncio.run(runner(make, names, a.turns))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    md = report(times, levels, absent, got, loop, a, appends, head)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "ADAPTER-ADK.md"), "w", encoding="utf-8") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
