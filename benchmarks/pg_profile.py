"""Where a PostgreSQL write's server time goes: each write of benchmarks/pg_writes.py,
statement by statement, beside the single statements it is made of.

    python -m benchmarks.pg_profile          # writes benchmarks/PG-PROFILE.md
    python -m benchmarks.pg_profile --quick  # a smoke run

A throwaway server (tests/pgserver.py) with fsync off, pg_stat_statements
(``track = all``: the statements inside functions too; ``track_planning``) and
auto_explain (``log_nested_statements``, ``log_analyze``, ``log_buffers``) loaded.
For each write: the backend's own CPU time per write (``/proc/PID/schedstat`` of
the one backend that served it, around N writes), what pg_stat_statements
counted per write (each statement's calls, execution and planning time, WAL
records and bytes: the rows the write had to write), and the plan of one write
with its actual times (auto_explain, nested statements included). The building
blocks are single prepared statements on the same server, measured the same way:
the bare INSERT of the row a put writes (pg_writes.py's floor), the same INSERT
with ``ON CONFLICT DO UPDATE`` on an existing row, one change row into
change_new, one list item, and a row lock (``SELECT ... FOR UPDATE``). The
timings of the second and third columns are pg_stat_statements' (instrumented);
the first column is not.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

import psycopg  # noqa: E402
from psycopg.types.numeric import Int8Dumper  # noqa: E402

import agentstate  # noqa: E402
from benchmarks.pg_writes import VALUE, Chain, agentstate_writes  # noqa: E402
from tests import pgserver  # noqa: E402

SETTINGS = (pgserver.DURABLE + " -c fsync=off -c full_page_writes=off"
            " -c shared_preload_libraries=pg_stat_statements,auto_explain"
            " -c pg_stat_statements.track=all -c pg_stat_statements.track_planning=on"
            " -c auto_explain.log_nested_statements=on -c auto_explain.log_analyze=on"
            " -c auto_explain.log_buffers=on -c auto_explain.log_min_duration=-1"
            " -c log_line_prefix='%p '")
TEXT = json.dumps(VALUE, separators=(",", ":"))


def backend_cpu_ns(pid: int) -> int:
    """A backend process's CPU time so far, in ns (/proc/PID/schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


class Writes:
    """The writes, each a callable; the backend serving them; the building blocks."""

    def __init__(self, url: str) -> None:
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        self.db = agentstate.open(url)
        self.writes = agentstate_writes(self.db, "p", "t")
        self.pid = next(iter(self.db._store._conns)).info.backend_pid  # a pool of one, unless threads
        self.raw = psycopg.connect(url, autocommit=True, prepare_threshold=0)
        self.raw.adapters.register_dumper(int, Int8Dumper)
        r = self.raw
        r.execute("CREATE TABLE floor (kind text COLLATE \"C\", scope_id text COLLATE \"C\", key text "
                  "COLLATE \"C\", version bigint, type text, value json, data bytea, list_id bigint, "
                  "length bigint, size integer, updated_at timestamptz, expires_at timestamptz, "
                  "PRIMARY KEY (kind, scope_id, key))")
        r.execute("INSERT INTO floor (kind, scope_id, key, version, type, value, size, updated_at) "
                  "VALUES ('app', 'p', 'e', 1, 'json', %s, 1, now())", (TEXT,))
        lg_conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        lg, lg_chain = PostgresSaver(lg_conn), Chain("t")
        lg.setup()
        self.lg_pid = lg_conn.info.backend_pid
        b = {"n": 0}

        def ins(sql: str, *args: Any) -> Any:
            def go() -> None:
                b["n"] += 1
                r.execute(sql, tuple(a(b["n"]) if callable(a) else a for a in args), prepare=True)
            return go

        self.blocks = {
            "the floor: INSERT of the row a put writes": ins(
                "INSERT INTO floor (kind, scope_id, key, version, type, value, size, updated_at) "
                "VALUES (%s, %s, %s, 1, 'json', %s, %s, clock_timestamp())",
                "app", "p", lambda n: f"k{n}", TEXT, len(TEXT)),
            "the same, ON CONFLICT DO UPDATE of an existing row": ins(
                "INSERT INTO floor AS t (kind, scope_id, key, version, type, value, size, updated_at) "
                "VALUES (%s, %s, %s, 1, 'json', %s, %s, clock_timestamp()) ON CONFLICT (kind, scope_id, key) "
                "DO UPDATE SET version = t.version + 1, value = excluded.value, updated_at = excluded.updated_at",
                "app", "p", "e", TEXT, len(TEXT)),
            "one change row (INSERT INTO change_new)": ins(
                "INSERT INTO change_new (xid, ticket, ord, at, topic, op, kind, scope_id, key, version) "
                "VALUES (pg_current_xact_id(), nextval('change_ticket'), 1, clock_timestamp(), 'kv', 'put', "
                "%s, %s, %s, 1)", "app", "x", lambda n: f"k{n}"),
            "one list item (INSERT INTO list_item)": ins(
                "INSERT INTO list_item (list_id, idx, item) VALUES (-1, %s, %s)", lambda n: n, TEXT),
            "a row lock (SELECT ... FOR UPDATE)": ins(
                "SELECT 1 FROM floor WHERE kind = %s AND scope_id = %s AND key = %s FOR UPDATE", "app", "p", "e"),
            "SELECT 1 (a statement's round trip)": ins("SELECT 1"),
        }
        self.lg = lambda: lg_chain.put(lg)


def cpu_per_call(jobs: dict[str, tuple[Any, int]], n: int, rounds: int) -> dict[str, float]:
    """Backend CPU µs per call of each job (fn, backend pid): the median over ``rounds``
    rounds that visit the jobs in a fresh random order, n calls each."""
    for fn, _pid in jobs.values():
        for _ in range(max(20, n // 5)):
            fn()
    got: dict[str, list[float]] = {name: [] for name in jobs}
    for _ in range(rounds):
        for name in random.sample(list(jobs), len(jobs)):
            fn, pid = jobs[name]
            c0 = backend_cpu_ns(pid)
            for _ in range(n):
                fn()
            got[name].append((backend_cpu_ns(pid) - c0) / n / 1e3)
    return {name: statistics.median(v) for name, v in got.items()}


def statements(admin: psycopg.Connection, fn: Any, n: int) -> list[tuple[Any, ...]]:
    """What pg_stat_statements counted per call of ``fn`` (n calls)."""
    admin.execute("SELECT pg_stat_statements_reset()")
    for _ in range(n):
        fn()
    return admin.execute(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls::float8 / %s, total_exec_time * 1000 / %s, "
        "total_plan_time * 1000 / %s, wal_records::float8 / %s, wal_bytes::float8 / %s, toplevel "
        "FROM pg_stat_statements WHERE calls > 0 AND query NOT LIKE '%%pg_stat_statements%%' "
        "ORDER BY total_exec_time DESC", (n,) * 5).fetchall()


def explain(server: Any, conn: psycopg.Connection, fn: Any) -> str:
    """The plans auto_explain logged for the second of two calls (nested statements
    included), ``conn`` being the connection that runs them."""
    fn()
    with open(server.log, encoding="utf-8", errors="replace") as f:
        f.seek(0, 2)
        start = f.tell()
    conn.execute("SET auto_explain.log_min_duration = 0")
    fn()
    conn.execute("SET auto_explain.log_min_duration = -1")
    time.sleep(0.3)
    with open(server.log, encoding="utf-8", errors="replace") as f:
        f.seek(start)
        log = f.read()
    pid = str(conn.info.backend_pid)
    out, keep, text = [], False, False  # the plans, without their query's text
    for ln in log.splitlines():
        if ln.startswith(pid + " "):
            keep = "duration:" in ln and "SET auto_explain" not in ln
            if keep:
                out.append(ln[len(pid) + 1:])
        elif keep and ln.startswith("\t"):
            line = ln[1:]
            if line.startswith("Query Text:"):
                text = True
            if text and "(cost=" in line:
                text = False
            if not text:
                out.append(line)
    return "\n".join(out)


def short(q: str, width: int = 90) -> str:
    q = q.strip()
    return q if len(q) <= width else q[:width - 1] + "…"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    n, rounds = (30, 3) if args.quick else (100, 15)
    bin_dir = pgserver.bindir()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL binaries (apt-get install postgresql)")
    pgserver.sweep(bin_dir)
    server = pgserver.Server(bin_dir, settings=SETTINGS).start()
    lines: list[str] = []
    try:
        admin = psycopg.connect(server.admin_url, autocommit=True)
        admin.execute("CREATE EXTENSION pg_stat_statements")
        url = pgserver.schema_url(server.admin_url, pgserver.new_schema(server.admin_url))
        w = Writes(url)
        w.writes["PostgresSaver.put (LangGraph)"] = w.lg
        jobs = {**{name: (fn, w.raw.info.backend_pid) for name, fn in w.blocks.items()},
                **{name: (fn, w.lg_pid if name.startswith("PostgresSaver") else w.pid)
                   for name, fn in w.writes.items()}}
        cpu = cpu_per_call(jobs, n, rounds)
        blocks = {name: {"cpu": cpu[name], "rows": statements(admin, fn, n)} for name, fn in w.blocks.items()}
        writes = {name: {"cpu": cpu[name], "rows": statements(admin, fn, n)} for name, fn in w.writes.items()}
        floor = blocks["the floor: INSERT of the row a put writes"]["cpu"]
        lines += ["# Where a PostgreSQL write's server time goes", "",
                  f"`python -m benchmarks.pg_profile{' --quick' if args.quick else ''}`, "
                  f"{datetime.date.today().isoformat()}, PostgreSQL "
                  f"{admin.execute('SHOW server_version').fetchone()[0]}, fsync off. See the module "
                  "docstring for the method; benchmarks/PG-WRITES.md has the same writes with every "
                  "process of the cluster counted, side by side with the code before issue 38.", "",
                  "## The building blocks: single prepared statements", "",
                  "| statement | backend CPU µs | × the floor | exec µs | WAL records |",
                  "|---|---:|---:|---:|---:|"]
        for name, m in blocks.items():
            top = m["rows"][0] if m["rows"] else ("", 0, 0, 0, 0, 0, True)
            lines.append(f"| {name} | {m['cpu']:,.1f} | {m['cpu'] / floor:.2f}× | {top[2]:,.1f} | "
                         f"{top[4]:.1f} |")
        lines += ["", "## The writes", "",
                  "Backend CPU per write (not instrumented), then what pg_stat_statements counted per "
                  "write: every statement it ran (top level and nested), with the calls, execution and "
                  "planning time and WAL records per write.", ""]
        for name, m in writes.items():
            lines += [f"### {name}: {m['cpu']:,.1f} µs, {m['cpu'] / floor:.2f}× the floor", "",
                      "| statement | calls | exec µs | plan µs | WAL records | WAL bytes |",
                      "|---|---:|---:|---:|---:|---:|"]
            for q, calls, ex, pl, wr, wb, top in m["rows"][:12]:
                if calls < 0.01:
                    continue
                shown = short(q).replace("|", "\\|")
                lines.append(f"| {'' if top else '↳ '}`{shown}` | {calls:.2f} | "
                             f"{ex:,.1f} | {pl:,.1f} | {wr:.2f} | {wb:,.0f} |")
            lines.append("")
        lines += ["## Plans of one write, with actual times (auto_explain)", ""]
        pool = next(iter(w.db._store._conns))
        for name, fn in w.writes.items():
            if not name.startswith("PostgresSaver"):
                lines += [f"### {name}", "", "```", explain(server, pool, fn), "```", ""]
        w.db.close()
    finally:
        server.stop()
    path = os.path.join(args.out, "PG-PROFILE.md")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:60]))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
