"""Upgrades of older files: MIGRATIONS[n] takes a file from schema version n to n + 1.

Each runs inside the one transaction that opens the file (all or nothing: a
crash mid-upgrade leaves the older file as it was). New objects are created
from ``schema.sql`` itself, by name, so their definition exists once.
"""

from __future__ import annotations

from collections.abc import Callable

import apsw


def statements(sql: str) -> list[str]:
    """The complete statements of an SQL text (trigger bodies kept whole)."""
    out, buf = [], ""
    for line in sql.splitlines(keepends=True):
        buf += line
        if apsw.complete(buf) and buf.strip():
            out.append(buf.strip())
            buf = ""
    return out


def schema_object(schema: str, name: str) -> str:
    """The CREATE statement of one named table, index, trigger or view in ``schema``."""
    for stmt in statements(schema):
        body = "\n".join(ln for ln in stmt.splitlines() if not ln.lstrip().startswith("--"))
        words = body.split()
        if words[:1] == ["CREATE"]:
            i = 3 if words[1] == "UNIQUE" else 2
            if words[i] == name:
                return body
    raise LookupError(f"schema.sql has no object named {name}")


def _v1_to_v2(c: apsw.Connection, schema: str) -> None:
    """The change feed, expiry, settings and run trimming (SPEC §9, §10)."""
    c.execute("ALTER TABLE kv ADD COLUMN expires_at REAL")
    c.execute("ALTER TABLE run ADD COLUMN first_seq INTEGER NOT NULL DEFAULT 0 "
              "CHECK (first_seq >= 0 AND first_seq <= next_seq)")
    c.execute("DROP TRIGGER run_entry_contiguous; DROP VIEW state; DROP VIEW runs")
    for name in ("kv_expiry", "run_entry_contiguous", "change", "setting", "token", "token_by_name",
                 "state", "runs", "changes"):
        c.execute(schema_object(schema, name))


def _v2_to_v3(c: apsw.Connection, schema: str) -> None:
    """Indexes for paged lists of runs, sessions and turns by status (issue 16)."""
    for name in ("run_by_update", "session_by_time", "turn_by_status"):
        c.execute(schema_object(schema, name))


MIGRATIONS: dict[int, Callable[[apsw.Connection, str], None]] = {1: _v1_to_v2, 2: _v2_to_v3}
