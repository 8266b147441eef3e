"""AgentStateSession beside openai-agents' own sessions, on SQLite and on PostgreSQL.

    python -m benchmarks.adapter_openai_agents            # the full run, writes ADAPTER-OPENAI-AGENTS.md
    python -m benchmarks.adapter_openai_agents --quick    # a smoke run (seconds), prints the tables
    python -m benchmarks.adapter_openai_agents --repeats 30 --turns 100 --out PATH

Run from the repository root. Four sessions, each at its defaults:
AgentStateSession on a file beside ``SQLiteSession`` on a file (both WAL,
synchronous=FULL: one fsync per commit); AgentStateSession on a PostgreSQL store
beside ``SQLAlchemySession`` (``agents.extensions.memory``, SQLAlchemy's async
engine on psycopg 3) on the same server, a throwaway one started here with
its durable defaults (``adapter_pg.py``).

1. Operations. For each history length (10, 1,000, 10,000 items) each session
   gets that history, then, repetition by repetition, in a fresh random order of
   the four, the timed calls: ``add_items`` of one turn (a user and an
   assistant message), ``pop_item`` (twice, giving the turn back, so the history
   stays at its length), ``get_items(20)`` and ``get_items()`` (the whole
   history: what the Runner reads with no limit set). Figures are medians per
   call; the ratio is the median, over repetitions, of the framework session's
   time over AgentStateSession's in the same repetition (above 1: agentstate is
   faster).
2. What each piece bought, at 1,000 items: each call as shipped beside the same
   call made the way 0.2 made it (the reads and writes it took before layout
   2, the thread hop before inline reads, the task before ``shield``), through
   the same session, alternating.
3. A framework step end to end: ``Runner.run`` with a stub model (no network,
   a fixed answer) for ``--turns`` turns on one session per system, turns of the
   systems interleaved; the median wall time per turn, and the same loop with
   no session (the framework's own cost).
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
from agents import Agent, Runner, SQLiteSession, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import agentstate
from agentstate.integrations import openai_agents as oa
from agentstate.integrations.openai_agents import AgentStateSession

from .adapter_pg import Postgres, missing_sqlalchemy

HERE = Path(__file__).resolve().parent
OPS = ["add_items (one turn)", "pop_item", "get_items(20)", "get_items() all"]
SYSTEMS = {  # name -> (backend, label)
    "agentstate": ("SQLite", "AgentStateSession"),
    "sqlite": ("SQLite", "SQLiteSession"),
    "agentstate-pg": ("PostgreSQL", "AgentStateSession"),
    "sqlalchemy": ("PostgreSQL", "SQLAlchemySession"),
}


def turn(n: int) -> list[dict[str, Any]]:
    """A user message and an assistant answer, of the shape the Runner stores."""
    return [
        {"role": "user", "content": f"Question {n}: " + "what does the report say about it? " * 5},
        {"id": f"msg_{n:08d}", "type": "message", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "annotations": [],
                      "text": f"Answer {n}: " + "the report says it grew steadily. " * 18}]},
    ]


class Systems:
    """Opens each system's session: files in one folder, schemas on one server."""

    def __init__(self, folder: str, pg: Postgres | None) -> None:
        self.folder, self.pg, self.dbs = folder, pg, []

    def open(self, name: str, sid: str) -> Any:
        if name == "sqlite":
            return SQLiteSession(sid, os.path.join(self.folder, f"{sid}-sqlite.db"))
        if name == "agentstate":
            return AgentStateSession(sid, db_path=os.path.join(self.folder, f"{sid}-agentstate.db"))
        assert self.pg is not None
        if name == "agentstate-pg":
            db = agentstate.open(self.pg.url(self.pg.schema()))
            self.dbs.append(db)
            return AgentStateSession(sid, db)
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        return SQLAlchemySession.from_url(sid, url=self.pg.sqlalchemy_url(self.pg.schema()),
                                          create_tables=True)

    async def close(self, session: Any) -> None:
        if hasattr(session, "engine"):
            await session.engine.dispose()
        else:
            session.close()

    def close_all(self) -> None:
        for db in self.dbs:
            db.close()


async def timed(call: Callable[[], Awaitable[Any]]) -> float:
    t = time.perf_counter()
    await call()
    return time.perf_counter() - t


async def measure(systems: Systems, names: list[str], history: int,
                  repeats: int) -> dict[str, dict[str, list[float]]]:
    sessions = {s: systems.open(s, f"ops{history}") for s in names}
    for s in sessions.values():
        for i in range(0, history, 500):
            await s.add_items([x for n in range(i // 2, min(i + 500, history) // 2) for x in turn(n)])
        assert len(await s.get_items()) == history // 2 * 2
    times: dict[str, dict[str, list[float]]] = {s: {op: [] for op in OPS} for s in names}
    order = list(names)
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
        await systems.close(s)
    return times


# -- 2. what each piece bought ------------------------------------------------------------

async def _as_before(fn: Callable[..., Any], *args: Any) -> Any:
    """0.2's wrapper of a write: a task of asyncio.to_thread, awaited with asyncio.wait."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    while not task.done():
        await asyncio.wait({task})
    return task.result()


def _variants(s: AgentStateSession) -> dict[str, tuple[Callable[[], Awaitable[Any]], ...]]:
    """Per operation: (as shipped, as 0.2 did it, ...) through the session's own scope."""
    sc, db = s._scope, s.db

    def three_reads() -> Any:  # layout 1: meta, the last chunk, meta again (a sequence lock)
        sc.get_versioned("meta")
        out = sc.slice(oa.TAIL, -20)
        sc.get_versioned("meta")
        return out

    def every_chunk() -> Any:  # layout 1: meta, a slice per chunk, meta again
        meta = sc.get_versioned("meta").value
        out = [x for n in range(meta["last"] + 1) for x in sc.slice(oa._chunk(n))]
        out += sc.slice(oa.TAIL)
        sc.get_versioned("meta")
        return out

    def add_in_txn(items: list[Any]) -> None:  # layout 1: meta, then append, one transaction
        with db.transaction():
            sc.get("meta")
            sc.append(oa.TAIL, items)

    def pop_in_txn() -> Any:
        with db.transaction():
            sc.get("meta")
            return sc.pop(oa.TAIL)

    thread = (lambda: asyncio.to_thread(s._get, 20),)
    return {
        "get_items(20)": (lambda: s.get_items(20), *(thread if s._inline else ()),
                          lambda: asyncio.to_thread(three_reads)),
        "get_items() all": (s.get_items, lambda: asyncio.to_thread(every_chunk)),
        "add_items (one turn)": (lambda: s.add_items(turn(7)),
                                 lambda: _as_before(s._add, turn(7)),
                                 lambda: _as_before(add_in_txn, turn(7))),
        "pop_item": (s.pop_item, lambda: _as_before(s._pop), lambda: _as_before(pop_in_txn)),
    }


PIECES = {
    "get_items(20)": ["as shipped: one slice of c.tail{inline}", "the same in a worker thread "
                      "(asyncio.to_thread, as SQLiteSession reads)",
                      "0.2's reads: meta, the last chunk, meta again, in a worker thread"],
    "get_items() all": ["as shipped: one items(\"c.\"){inline}",
                        "0.2's reads: meta, a slice per chunk, meta again, in a worker thread"],
    "add_items (one turn)": ["as shipped: one append, awaited through shield",
                             "the same append awaited as 0.2 did (a task and asyncio.wait)",
                             "0.2's write: meta read, then append, in one transaction"],
    "pop_item": ["as shipped: one pop, awaited through shield",
                 "the same pop awaited as 0.2 did", "0.2's write: meta read, then pop, in one "
                 "transaction"],
}


async def pieces(systems: Systems, name: str, repeats: int) -> dict[str, list[list[float]]]:
    s = systems.open(name, "pieces")
    await s.add_items([x for n in range(500) for x in turn(n)])
    await s.get_items(1)  # the object now knows the layout: its adds are the fast ones
    variants = _variants(s)
    out = {op: [[] for _ in calls] for op, calls in variants.items()}
    for _ in range(repeats):
        for op, calls in variants.items():
            order = list(range(len(calls)))
            random.shuffle(order)
            for i in order:
                out[op][i].append(await timed(calls[i]))
                if op == "add_items (one turn)":
                    await s.pop_item()
                    await s.pop_item()
                elif op == "pop_item":
                    await s.add_items([turn(9)[0]])
    await systems.close(s)
    return out


# -- 3. the Runner, end to end ---------------------------------------------------------------

class StubModel(Model):
    """A model that answers at once with a fixed message: the framework's step without
    the network."""

    def __init__(self) -> None:
        self.n = 0

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any,
                           **kwargs: Any) -> ModelResponse:
        self.n += 1
        text = f"Answer {self.n}: " + "the report says it grew steadily. " * 18
        message = ResponseOutputMessage(
            id=f"msg_{self.n}", type="message", role="assistant", status="completed",
            content=[ResponseOutputText(text=text, type="output_text", annotations=[])])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


async def runner(systems: Systems, names: list[str], turns: int) -> dict[str, list[float]]:
    sessions: dict[str, Any] = {n: systems.open(n, "runner") for n in names}
    sessions["none"] = None
    agents = {n: Agent(name="bench", model=StubModel()) for n in sessions}
    times: dict[str, list[float]] = {n: [] for n in sessions}
    order = list(sessions)
    for i in range(turns):
        random.shuffle(order)
        for n in order:
            question = f"Question {i}: " + "what does the report say about it? " * 5
            times[n].append(await timed(lambda: Runner.run(agents[n], question,
                                                           session=sessions[n])))
    for n in names:
        assert len(await sessions[n].get_items()) == 2 * turns, n
        await systems.close(sessions[n])
    return times


# -- the report ------------------------------------------------------------------------------

async def wal_frames(system: str, folder: str, adds: int = 50) -> float:
    """WAL frames written per add_items of one turn (fewer than a checkpoint's 1,000 pages)."""
    s = Systems(folder, None).open(system, "wal")
    await s.add_items([x for n in range(50) for x in turn(n)])
    await s.get_items(1)
    wal = os.path.join(folder, f"wal-{system}.db-wal")
    before = os.path.getsize(wal)
    for n in range(adds):
        await s.add_items(turn(n))
    frames = (os.path.getsize(wal) - before) / adds / (4096 + 24)  # both use 4 KiB pages
    s.close()  # the last connection to close removes the WAL
    return frames


def fmt(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.0f} µs"


def ratio(ours: list[float], theirs: list[float]) -> str:
    """The median of the paired ratios: each repetition's two calls made back to back."""
    return f"**{statistics.median(b / a for a, b in zip(ours, theirs)):.2f}×**"


def ops_table(results: dict[int, dict[str, dict[str, list[float]]]], absent: str | None) -> str:
    lines = ["| operation | history | SQLite: AgentStateSession | SQLiteSession | ratio | "
             "PostgreSQL: AgentStateSession | SQLAlchemySession | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for op in OPS:
        for history, t in results.items():
            row = [op, f"{history:,}", fmt(statistics.median(t["agentstate"][op])),
                   fmt(statistics.median(t["sqlite"][op])),
                   ratio(t["agentstate"][op], t["sqlite"][op])]
            if absent:
                row += [fmt(statistics.median(t["agentstate-pg"][op])), absent, ""]
            else:
                row += [fmt(statistics.median(t["agentstate-pg"][op])),
                        fmt(statistics.median(t["sqlalchemy"][op])),
                        ratio(t["agentstate-pg"][op], t["sqlalchemy"][op])]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def pieces_table(got: dict[str, dict[str, list[list[float]]]]) -> str:
    lines = ["| operation | how | SQLite | PostgreSQL |", "|---|---|---:|---:|"]
    for op, labels in PIECES.items():
        sqlite_rows, pg_rows = got["agentstate"][op], got["agentstate-pg"][op]
        pg_labels = [lab for lab in labels if "worker thread (asyncio" not in lab]
        for label in labels:
            i = labels.index(label)
            a = fmt(statistics.median(sqlite_rows[i]))
            j = pg_labels.index(label) if label in pg_labels else None
            b = "" if j is None else fmt(statistics.median(pg_rows[j]))
            shown = label.format(inline=" (on a file: on the loop's thread; on PostgreSQL: in a "
                                 "worker thread)")
            lines.append(f"| {op} | {shown} | {a} | {b} |")
    return "\n".join(lines)


def runner_table(t: dict[str, list[float]], turns: int, absent: str | None) -> str:
    def ms(n: str) -> str:
        return f"{statistics.median(t[n]) * 1000:.2f} ms"

    pg = (f"| PostgreSQL | {ms('agentstate-pg')} | {absent} | |" if absent else
          f"| PostgreSQL | {ms('agentstate-pg')} | {ms('sqlalchemy')} (SQLAlchemySession) | "
          f"{ratio(t['agentstate-pg'], t['sqlalchemy'])} |")
    return "\n".join([
        "| backend | AgentStateSession, per turn | the framework's own, per turn | ratio |",
        "|---|---:|---:|---:|",
        f"| SQLite | {ms('agentstate')} | {ms('sqlite')} (SQLiteSession) | "
        f"{ratio(t['agentstate'], t['sqlite'])} |",
        pg,
        "",
        f"Medians over {turns} turns (the history grows to {2 * turns} items); the same loop "
        f"with no session: {ms('none')} per turn, the framework's own part of each figure.",
    ])


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return ""


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine(pg: Postgres) -> list[str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    sa = "not installed"
    try:
        sa = importlib.metadata.version("sqlalchemy")
    except importlib.metadata.PackageNotFoundError:
        pass
    return [
        f"- {cpu}, {os.cpu_count()} cores, {platform.platform()}, Python {platform.python_version()}",
        f"- agentstate's SQLite (apsw) {apsw.sqlite_lib_version()}; SQLiteSession's SQLite "
        f"(Python sqlite3) {sqlite3.sqlite_version}; PostgreSQL {pg.version()} (fsync on, "
        f"synchronous_commit on), psycopg {importlib.metadata.version('psycopg')}, SQLAlchemy {sa}",
        f"- openai-agents {importlib.metadata.version('openai-agents')}; agentstate "
        f"{importlib.metadata.version('agentstate-db')} at commit {commit() or '?'}",
        "- load average at the start " + _load()
        + " (the machine is shared: the ratios, measured side by side, are the robust figures)",
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="histories 10 and 100, 3 repetitions")
    ap.add_argument("--repeats", type=int, default=None, help="repetitions per figure (default 100)")
    ap.add_argument("--turns", type=int, default=None, help="Runner turns (default 200)")
    ap.add_argument("--out", default=None,
                    help="markdown file to write (default: benchmarks/ADAPTER-OPENAI-AGENTS.md; "
                         "--quick prints only)")
    args = ap.parse_args(argv)
    histories = [10, 100] if args.quick else [10, 1_000, 10_000]
    repeats = args.repeats or (3 if args.quick else 100)
    turns = args.turns or (4 if args.quick else 200)
    out = args.out or (None if args.quick else str(HERE / "ADAPTER-OPENAI-AGENTS.md"))
    set_tracing_disabled(True)  # no trace export: the same for every system
    absent = missing_sqlalchemy()
    names = [n for n in SYSTEMS if not (absent and n == "sqlalchemy")]
    started = time.time()
    with Postgres() as pg, tempfile.TemporaryDirectory() as tmp:
        head = machine(pg)
        systems = Systems(tmp, pg)
        try:
            results = {h: asyncio.run(measure(systems, names, h, repeats)) for h in histories}
            got = {n: asyncio.run(pieces(systems, n, repeats)) for n in ("agentstate",
                                                                          "agentstate-pg")}
            loop = asyncio.run(runner(systems, names, turns))
        finally:
            systems.close_all()
        frames = {s: asyncio.run(wal_frames(s, tmp)) for s in ("agentstate", "sqlite")}
    md = "\n".join([
        "# openai-agents: AgentStateSession beside the framework's own sessions",
        "",
        f"Generated by `python -m benchmarks.adapter_openai_agents{' --quick' if args.quick else ''}` "
        f"on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC in "
        f"{time.time() - started:.0f} s (see its docstring for the method). Per call, median of "
        f"{repeats} repetitions (get_items() all: of {max(3, repeats // 3)}); ratio = the "
        "framework's session ÷ AgentStateSession, above 1: agentstate is faster.",
        "",
        "## Operations",
        "",
        ops_table(results, absent),
        "",
        "Durability is the same on each side: on SQLite both run WAL with synchronous=FULL (one "
        "fsync per commit), on PostgreSQL both commit with synchronous_commit on. WAL frames "
        f"(4 KiB pages) written per `add_items` of one turn: AgentStateSession "
        f"{frames['agentstate']:.1f}, SQLiteSession {frames['sqlite']:.1f}.",
        "",
        "## What each piece bought",
        "",
        f"At 1,000 items, through one AgentStateSession per backend, medians of {repeats}:",
        "",
        pieces_table(got),
        "",
        "## A Runner step, end to end",
        "",
        runner_table(loop, turns, absent),
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
