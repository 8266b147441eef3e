"""The file's schema: ``schema.sql`` (the one copy), its version, and upgrades of older files.

A new file gets the schema in one transaction; ``MIGRATIONS[n]`` takes a file
from schema version n to n + 1, inside the one transaction that opens it (all
or nothing: a crash mid-upgrade leaves the older file as it was). New objects
are created from ``schema.sql`` itself, by name, so their definition exists
once. The file is recognised by its ``application_id``; a newer one is
refused, untouched.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import apsw

from ...errors import Damaged, SchemaTooNew

APPLICATION_ID = 1634952052  # 'agst'


def schema_text() -> str:
    """The schema: shipped inside the wheel, or the repository's top-level file."""
    shipped = resources.files("agentstate").joinpath("schema.sql")
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parents[3] / "schema.sql").read_text(encoding="utf-8")


SCHEMA = schema_text()
SCHEMA_VERSION = int(re.findall(r"PRAGMA user_version = (\d+);", SCHEMA)[-1])


def check_header(c: apsw.Connection, path: str) -> int:
    """The file's schema version, once it is known to be ours (or empty)."""
    # One statement, so one snapshot: another process may commit the schema (and
    # user_version with it) between two separate reads.
    version, app, objects = c.execute(
        "SELECT user_version, application_id, (SELECT count(*) FROM sqlite_schema) "
        "FROM pragma_user_version, pragma_application_id").get  # one row, always
    if app not in (0, APPLICATION_ID):
        raise Damaged(f"{path} is an SQLite file of another application (id {app})")
    # Before anything is written (the WAL switch rewrites the header): a
    # file without our schema must be empty to become ours, and a file
    # with a schema version must carry our application id (the schema
    # sets both in one transaction), whatever its user_version.
    if version == 0 and objects:
        raise Damaged(f"{path} is an SQLite database but not an agentstate one")
    if version != 0 and app != APPLICATION_ID:
        raise Damaged(
            f"{path} is an SQLite database of another application (user_version "
            f"{version}, no agentstate application id)"
        )
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{path} has schema version {version}; this agentstate knows up to "
            f"{SCHEMA_VERSION}: upgrade agentstate"
        )
    return version


def ensure_schema(c: apsw.Connection, path: str) -> None:
    """A new file gets the schema, an older one its migrations, in one transaction."""
    c.execute("BEGIN IMMEDIATE")
    try:
        version = check_header(c, path)  # another process may have set it up meanwhile
        if version == 0:
            c.execute(SCHEMA)
        while version < SCHEMA_VERSION and version != 0:
            MIGRATIONS[version](c, SCHEMA)
            version += 1
            c.pragma("user_version", version)
        c.execute("COMMIT")
    except BaseException:
        c.execute("ROLLBACK")
        raise


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


def _v3_to_v4(c: apsw.Connection, schema: str) -> None:
    """0.3: the index of a run's tool calls by call id (SPEC §14), pinned runs (reads in
    one call), tokens' grants and expiry and the pages' sign-ins (SPEC §15)."""
    c.execute(schema_object(schema, "run_entry_call"))
    c.execute("ALTER TABLE run ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0 "
              "CHECK (pinned IN (0, 1))")
    c.execute("DROP VIEW runs")
    c.execute(schema_object(schema, "runs"))
    # SPEC §15: a token's grants and expiry; the pages' sign-ins, kept in the store
    # (a file from 0.1 got its token table from this schema already, in _v1_to_v2)
    have = {row[1] for row in c.execute("SELECT * FROM pragma_table_info('token')")}
    for column in ("grants TEXT", "expires_at REAL"):
        if column.split()[0] not in have:
            c.execute(f"ALTER TABLE token ADD COLUMN {column}")
    for name in ("signin", "signin_by_token", "signin_expiry"):
        c.execute(schema_object(schema, name))


def _v4_to_v5(c: apsw.Connection, schema: str) -> None:
    """0.4: the calls a trim took out of a run's history, the store's id (SPEC §16)."""
    c.execute(schema_object(schema, "run_call"))
    c.execute(schema_object(schema, "store"))
    c.execute("INSERT INTO store DEFAULT VALUES")


def _v5_to_v6(c: apsw.Connection, schema: str) -> None:
    """0.4: value history (SPEC §17). History starts now: nothing before is kept."""
    for name in ("kv_history", "kv_history_list", "change_by_key", "list_gone", "list_gone_seq",
                 "list_base", "list_base_of", "list_dead", "history_head"):
        c.execute(schema_object(schema, name))
    c.execute("INSERT INTO history_head SELECT coalesce(max(seq), 0) FROM change")


MIGRATIONS: dict[int, Callable[[apsw.Connection, str], None]] = {
    1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6}
