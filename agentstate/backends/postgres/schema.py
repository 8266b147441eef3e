"""The store's schema: ``schema_postgres.sql`` (the one copy), its version, and upgrades.

A new store gets the schema in one transaction, under an advisory lock on the
schema's name, so two clients opening a fresh store at once create it once;
``MIGRATIONS[n]`` takes a store from version n to n + 1 in that transaction,
from the schema's own definitions (``schema_function``, ``schema_object``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import psycopg

from ...errors import Damaged, SchemaTooNew, StorageError
from .errors import translate
from .statements import first, quiet_rollback

OUR_TABLES = ("kv", "list_item", "run", "run_entry", "run_call", "session", "turn", "change",
              "feed_head", "change_new", "setting", "store", "token", "signin", "kv_history",
              "list_gone", "list_base", "list_dead", "history_head")


def schema_text() -> str:
    """The schema: shipped inside the wheel, or the repository's top-level file."""
    shipped = resources.files("agentstate").joinpath("schema_postgres.sql")
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parents[3] / "schema_postgres.sql").read_text(encoding="utf-8")


SCHEMA = schema_text()
SCHEMA_VERSION = int(re.findall(r"INSERT INTO agentstate_version \(version\) VALUES \((\d+)\);",
                                SCHEMA)[-1])


def schema_function(name: str) -> str:
    """The CREATE OR REPLACE statement of one function of the schema, for a migration
    (so that its definition exists once: in the schema)."""
    m = re.search(rf"^CREATE FUNCTION {name}\(.*?\$\$;$", SCHEMA, re.S | re.M)
    if m is None:
        raise LookupError(f"schema_postgres.sql has no function {name}")
    return "CREATE OR REPLACE" + m.group(0)[len("CREATE"):]


def schema_object(name: str) -> str:
    """The CREATE statement of one table, index or view of the schema, for a migration."""
    m = re.search(rf"^CREATE (?:UNIQUE )?(?:TABLE|INDEX|VIEW) {name} .*?;$", SCHEMA, re.S | re.M)
    if m is None:
        raise LookupError(f"schema_postgres.sql has no table, index or view {name}")
    return m.group(0)


def _functions(c: psycopg.Connection, names: tuple[str, ...]) -> None:
    """The schema's functions of these names, made or replaced; a name the schema no
    longer has is left for the later migration that drops it."""
    for name in names:
        try:
            c.execute(schema_function(name))
        except LookupError:
            continue


def _v1_to_v2(c: psycopg.Connection) -> None:
    """Issue 26: key locks (versions never reused, reads of absent keys in a transaction
    lock them), times of the write itself, a feed purged by prefix, fork(upto) overflow."""
    _functions(c, ("kv_next_version", "kv_key_lock", "kv_read_lock", "kv_put", "kv_delete", "kv_touch",
                   "kv_append", "kv_pop", "kv_drop_scope", "kv_purge_expired", "feed_purge_step",
                   "feed_number", "feed_notify", "run_fork"))


def _v2_to_v3(c: psycopg.Connection) -> None:
    """0.3: the index of a run's tool calls by call id (SPEC §14), pinned runs, tokens'
    grants and expiry and the pages' sign-ins (SPEC §15)."""
    c.execute(schema_object("run_entry_call"))
    c.execute("ALTER TABLE run ADD COLUMN pinned boolean NOT NULL DEFAULT false")
    _functions(c, ("run_prune", "kv_clear", "run_pin", "turn_fence"))
    c.execute("DROP VIEW runs")
    c.execute(schema_object("runs"))
    # SPEC §15: a token's grants and expiry; the pages' sign-ins, kept in the store
    c.execute("ALTER TABLE token ADD COLUMN grants text, ADD COLUMN expires_at timestamptz")
    for name in ("signin", "signin_by_token", "signin_expiry"):
        c.execute(schema_object(name))


def _v3_to_v4(c: psycopg.Connection) -> None:
    """0.4: the calls a trim took out of a run's history, the store's id (SPEC §16)."""
    c.execute(schema_object("run_call"))
    c.execute(schema_object("store"))
    c.execute(schema_object("store_one"))
    c.execute("INSERT INTO store DEFAULT VALUES")
    for name in ("run_trim", "run_fork"):
        c.execute(schema_function(name))


def _v4_to_v5(c: psycopg.Connection) -> None:
    """Issue 38: writes as single prepared statements. A deleted key's version lives in
    its row (a tombstone) instead of kv_deleted, a read in a transaction locks a row
    (a tombstone of version 0 for a key that has none) instead of an advisory lock, kv
    has no CHECK constraints, a block's changes wait in change_new (no ticket yet)
    instead of change_pending, and the wake-up and the purge are sent only when someone
    watches (watch_lease) or something is due (feed_due)."""
    for (name,) in c.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'kv'::regclass "
                             "AND contype = 'c'").fetchall():
        c.execute(psycopg.sql.SQL("ALTER TABLE kv DROP CONSTRAINT {}").format(psycopg.sql.Identifier(name)))
    c.execute("INSERT INTO kv (kind, scope_id, key, version, type, size, updated_at, expires_at) "
              "SELECT kind, scope_id, key, version, 'json', 0, clock_timestamp(), '-infinity' FROM kv_deleted "
              "ON CONFLICT (kind, scope_id, key) DO NOTHING")  # a live row is above its deleted version
    c.execute("DROP TABLE kv_deleted, change_pending")  # change_pending: empty outside a transaction
    c.execute("DROP FUNCTION IF EXISTS kv_next_version(text, text, text), kv_key_lock(text, text, text), "
              "feed_flush(), feed_append(change_row[], boolean), feed_notify()")
    c.execute("DROP INDEX kv_expiry")
    c.execute(schema_object("kv_expiry"))
    c.execute("DROP VIEW changes")  # it reads ord
    c.execute("ALTER TABLE change_new ALTER COLUMN ticket DROP NOT NULL, ALTER COLUMN ord TYPE bigint")
    c.execute(schema_object("changes"))
    c.execute("CREATE SEQUENCE watch_lease")
    for name in ("feed_add", "feed_close", "feed_pending", "kv_remove", "kv_read_lock", "kv_put",
                 "kv_delete", "kv_append", "kv_pop", "kv_drop_scope", "kv_purge_expired"):
        c.execute(schema_function(name))
    c.execute(schema_object("feed_watched"))  # (feed_due: in _v5_to_v6, it reads history's tables)
    for name in ("feed_after", "feed_notify", "feed_watch"):
        c.execute(schema_function(name))


def _v5_to_v6(c: psycopg.Connection) -> None:
    """Issue 39: value history (SPEC §17). Changes get ids (change_row too: every
    function that makes one is replaced), before-images, popped items, lists made from
    lists; the past is known from the newest change on. A tombstone no longer names a
    list (its items are gone), a new list value always gets a new list."""
    c.execute("ALTER TYPE change_row ADD ATTRIBUTE id bigint")
    c.execute("ALTER TABLE change ADD COLUMN id bigint")
    c.execute("ALTER TABLE change_new ADD COLUMN id bigint")
    c.execute("CREATE SEQUENCE change_id")
    for name in ("change_by_key", "change_by_id", "kv_history", "kv_history_list", "list_gone",
                 "list_gone_change", "list_base", "list_base_by_base", "list_dead", "history_head",
                 "history_head_one"):
        c.execute(schema_object(name))
    c.execute("INSERT INTO history_head (floor, done) SELECT last, last FROM feed_head")
    c.execute("UPDATE kv SET list_id = NULL WHERE expires_at = '-infinity' AND list_id IS NOT NULL")
    c.execute("DROP FUNCTION kv_put(text, text, text, text, json, bytea, bigint, text[], bigint, "
              "double precision, boolean)")
    c.execute("DROP VIEW IF EXISTS feed_due, state")
    _functions(c, tuple(re.findall(r"^CREATE FUNCTION (\w+)\(", SCHEMA, re.M)))
    for name in ("feed_due", "state"):
        c.execute(schema_object(name))


def _v6_to_v7(c: psycopg.Connection) -> None:
    """A list's items read by each list's own primary-key range (list_rows joined the
    chain of lists to list_item whole, and the planner scanned every list's items for a
    pop of one); kv_pop reads a list of its own directly."""
    _functions(c, ("list_rows", "kv_pop"))


# MIGRATIONS[n](conn) takes a store from schema version n to n + 1, inside the
# one transaction (under the advisory lock) that opens it.
MIGRATIONS: dict[int, Callable[[psycopg.Connection], None]] = {
    1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4, 4: _v4_to_v5, 5: _v5_to_v6, 6: _v6_to_v7}


def ensure_schema(c: psycopg.Connection, where: str) -> str:
    """Create or migrate the store in the connection's current schema; its name.

    In one transaction under an advisory lock on the schema's name, so two
    clients opening a fresh store at once create it once.

    :raises SchemaTooNew: the store was written by a newer agentstate.
    :raises Damaged: the schema holds tables of the same names that are not a store.
    :raises StorageError: the search_path names no existing schema.
    """
    try:
        schema = first(c.execute("SELECT current_schema()"))
        if schema is None:
            raise StorageError(
                f"{where}: the search_path names no existing schema: create it (CREATE SCHEMA) "
                "or name another one in options=-csearch_path%3D...")
        version = _version(c, schema)
        if version == SCHEMA_VERSION:
            return schema
        _refuse_newer(version, schema, where)
        c.execute("BEGIN")
        try:
            c.execute("SELECT pg_advisory_xact_lock(hashtext('agentstate:' || current_schema()))")
            version = _version(c, schema)  # another client may have set it up meanwhile
            _refuse_newer(version, schema, where)
            if version == 0:
                clash = first(c.execute(
                    "SELECT string_agg(tablename, ', ') FROM pg_tables "
                    "WHERE schemaname = current_schema() AND tablename = ANY(%s)",
                    (list(OUR_TABLES),)))
                if clash:
                    raise Damaged(f"{where}: schema {schema!r} has tables named {clash} but is not "
                                  "an agentstate store: use another schema")
                c.execute(SCHEMA)
                version = SCHEMA_VERSION
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](c)
                version += 1
                c.execute("UPDATE agentstate_version SET version = %s", (version,))
            c.execute("COMMIT")
        except BaseException:
            quiet_rollback(c)
            raise
    except psycopg.Error as e:
        raise translate(e) from None
    return schema


def _version(c: psycopg.Connection, schema: str) -> int:
    # A query of the catalog, not to_regclass(): its cache may still say "no such table"
    # after another client created it while this one waited for the lock.
    exists = first(c.execute("SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = "
                             "current_schema() AND tablename = 'agentstate_version')"))
    if not exists:
        return 0
    row = c.execute(psycopg.sql.SQL("SELECT version FROM {}.agentstate_version").format(
        psycopg.sql.Identifier(schema))).fetchone()
    return 0 if row is None else row[0]


def _refuse_newer(version: int, schema: str, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"{where}: schema {schema!r} has agentstate schema version {version}; "
                           f"this agentstate knows up to {SCHEMA_VERSION}: upgrade agentstate")
