"""Administration: the store's own invariants (check), info, online backup, vacuum.

``check`` is the one verifier shared by the command and the reliability tests.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import apsw

from ..._encoding import fs_path
from ..._sql import first_word, refused, several
from ...errors import AgentStateError, InvalidValue, StorageError, UsageError
from ..base import iso
from . import feed, history, kv
from .errors import translate
from .schema import SCHEMA_VERSION

if TYPE_CHECKING:
    from .store import Store

# Each invariant is one query returning (location, problem) rows; none means it holds.
INVARIANTS: list[tuple[str, str]] = [
    ("list length and size match the items", """
        SELECT 'kv ' || k.kind || ':' || k.scope_id || ' ' || k.key,
               'stored length ' || k.length || ' size ' || k.size || ', items give length '
               || count(i.idx) || ' size ' || (CASE WHEN count(i.idx) = 0 THEN 2
                  ELSE 1 + sum(length(CAST(i.item AS BLOB)) + 1) END)
               || ', indexes ' || coalesce(min(i.idx), '-') || '..' || coalesce(max(i.idx), '-')
        FROM kv k LEFT JOIN list_item i ON i.list_id = k.list_id
        WHERE k.type = 'list' AND k.list_id > 0  -- one made from another: below
        GROUP BY k.kind, k.scope_id, k.key
        HAVING count(i.idx) <> k.length
            OR (CASE WHEN count(i.idx) = 0 THEN 2 ELSE 1 + sum(length(CAST(i.item AS BLOB)) + 1) END) <> k.size
            OR coalesce(min(i.idx), 0) <> 0 OR coalesce(max(i.idx), -1) <> k.length - 1"""),
    ("list items belong to a list", """
        SELECT 'list_item list_id ' || list_id, 'items of no list'
        FROM (SELECT list_id FROM list_item UNION SELECT list_id FROM list_gone
              EXCEPT SELECT list_id FROM kv WHERE list_id IS NOT NULL
              EXCEPT SELECT list_id FROM kv_history WHERE list_id IS NOT NULL  -- as it was
              EXCEPT SELECT base_id FROM list_base  -- read by a list made from it
              EXCEPT SELECT list_id FROM list_dead)  -- left for the purge
        UNION ALL
        SELECT 'kv ' || kind || ':' || scope_id || ' ' || key, 'list ' || list_id || ' has no base'
        FROM kv WHERE list_id < 0 AND list_id NOT IN (SELECT list_id FROM list_base)
        UNION ALL
        SELECT 'list_seq', 'last ' || (SELECT last FROM list_seq) || ' is below list_id ' || max(list_id)
        FROM kv WHERE list_id IS NOT NULL HAVING max(list_id) > (SELECT last FROM list_seq)"""),
    ("values are valid JSON of the recorded size", """
        SELECT 'kv ' || kind || ':' || scope_id || ' ' || key,
               CASE WHEN NOT json_valid(value) THEN 'value is not JSON'
                    ELSE 'size ' || size || ' but the value has ' || length(CAST(value AS BLOB)) END
        FROM kv WHERE type = 'json' AND (NOT json_valid(value) OR length(CAST(value AS BLOB)) <> size)
        UNION ALL
        SELECT 'list_item list_id ' || list_id || ' idx ' || idx, 'item is not JSON'
        FROM list_item WHERE NOT json_valid(item)"""),
    ("versions never go back", """
        SELECT 'kv ' || k.kind || ':' || k.scope_id || ' ' || k.key,
               'version ' || k.version || ' is not above the deleted version ' || d.version
        FROM kv k JOIN kv_deleted d USING (kind, scope_id, key)
        WHERE k.version <= d.version"""),
    ("run histories are seq first_seq..next_seq-1, no gap", """
        SELECT 'run ' || r.id,
               'seqs ' || r.first_seq || '..' || (r.next_seq - 1) || ' recorded but ' || count(e.seq)
               || ' entries, seqs ' || coalesce(min(e.seq), '-') || '..' || coalesce(max(e.seq), '-')
        FROM run r LEFT JOIN run_entry e ON e.run_id = r.id
        GROUP BY r.id
        HAVING count(e.seq) <> r.next_seq - r.first_seq
            OR coalesce(min(e.seq), r.first_seq) <> r.first_seq
            OR coalesce(max(e.seq), r.next_seq - 1) <> r.next_seq - 1"""),
    ("the change feed: rows well formed", """
        SELECT 'change seq ' || seq, 'topic ' || topic || ' has no op ' || op
        FROM change
        WHERE NOT (topic = 'kv' AND op IN ('put', 'delete', 'append', 'pop', 'touch', 'expire')
                   AND kind IS NOT NULL AND scope_id IS NOT NULL AND key IS NOT NULL
                   AND version >= 1)
          AND NOT (topic = 'run' AND op IN ('create', 'write', 'delete', 'fork', 'trim', 'pin')
                   AND scope_id IS NOT NULL)
          AND NOT (topic = 'session' AND op IN ('create', 'delete', 'queued', 'running', 'held',
                   'decided', 'resuming', 'finished', 'failed', 'expired') AND scope_id IS NOT NULL)
        UNION ALL
        SELECT 'change seq ' || seq, 'start ' || start || ' count ' || count
        FROM change WHERE start < 0 OR count < 0 OR (start IS NULL) <> (count IS NULL)"""),
    ("no kv change is newer than its key", """
        SELECT 'change seq ' || ch.seq, 'version ' || ch.version || ' of ' || ch.kind || ':'
               || ch.scope_id || ' ' || ch.key || ' but the key has reached only '
               || coalesce(max(k.version, coalesce(d.version, 0)), d.version, k.version, 0)
        FROM change ch
        LEFT JOIN kv k ON k.kind = ch.kind AND k.scope_id = ch.scope_id AND k.key = ch.key
        LEFT JOIN kv_deleted d ON d.kind = ch.kind AND d.scope_id = ch.scope_id AND d.key = ch.key
        WHERE ch.topic = 'kv'
          AND ch.version > coalesce(max(k.version, coalesce(d.version, 0)), d.version, k.version, 0)"""),
    ("run entries are JSON objects carrying their seq", """
        SELECT 'run ' || run_id || ' seq ' || seq, 'entry is not an object with this seq'
        FROM run_entry
        WHERE NOT json_valid(entry) OR json_type(entry) <> 'object'
           OR json_extract(entry, '$.seq') IS NOT seq
        UNION ALL
        SELECT 'run ' || id, 'snapshot is not a JSON object'
        FROM run WHERE snapshot IS NOT NULL AND (NOT json_valid(snapshot) OR json_type(snapshot) <> 'object')"""),
    ("at most one active turn per session", """
        SELECT 'session ' || session_id, count(*) || ' queued or running turns'
        FROM turn WHERE status IN ('queued', 'running')
        GROUP BY session_id HAVING count(*) > 1"""),
]


PURGE_BATCH = 32  # rows of each kind a purge step removes at most


def purge(c: apsw.Connection, batch: int = PURGE_BATCH) -> int:
    """The bounded housekeeping a write transaction does before it commits (every
    few writes, ``Store.housekeeping``): up to ``batch`` feed rows past the retention
    and ``batch`` expired keys; how many rows went."""
    now = time.time()
    n = feed.purge_step(c, now, batch) + kv.purge_expired(c, now, batch)
    return n + history.purge_step(c, iso(max(0.0, now - feed.setting(c, "history_retention"))),
                                  batch)


def check(store: Store) -> list[str]:
    """Every problem found, as 'location: problem'; [] when the file is sound."""
    problems: list[str] = []
    with store.snapshot() as c:
        for (msg,) in c.execute("PRAGMA integrity_check"):
            if msg != "ok":
                problems.append(f"integrity_check: {msg}")
        for table, rowid, parent, _fk in c.execute("PRAGMA foreign_key_check"):
            problems.append(f"{table} rowid {rowid}: refers to a missing {parent} row")
        for name, sql in INVARIANTS:
            try:
                for where, what in c.execute(sql):
                    problems.append(f"{where}: {what} ({name})")
            except apsw.Error as e:
                problems.append(f"{name}: could not be checked: {e}")
    return problems


def store_id(store: Store) -> str:
    """The store's own id (the ``store`` table's one row), made with the store."""
    return str(store.query("SELECT id FROM store")[0][0])


def info(store: Store) -> dict[str, Any]:
    def size(p: str) -> int:
        try:
            return os.path.getsize(p)
        except OSError:
            return 0

    with store.snapshot() as c:
        counts = dict(zip(
            ("scopes", "keys", "list_items", "runs", "entries", "sessions", "turns", "changes"),
            c.execute("""SELECT (SELECT count(*) FROM (SELECT DISTINCT kind, scope_id FROM kv)),
                                (SELECT count(*) FROM kv), (SELECT count(*) FROM list_item),
                                (SELECT count(*) FROM run), (SELECT count(*) FROM run_entry),
                                (SELECT count(*) FROM session), (SELECT count(*) FROM turn),
                                (SELECT count(*) FROM change)""").get,
        ))
        version = c.pragma("user_version")
    return {
        "path": store.path,
        "size_bytes": size(store.path),
        "wal_bytes": size(store.path + "-wal"),
        "schema_version": version,
        "library_schema_version": SCHEMA_VERSION,
        "durability": store.durability,
        "counts": counts,
    }


def backup(store: Store, dest: str, progress: Callable[[int, int], None] | None = None) -> str:
    """Copy the database to ``dest`` (a new owner-only file) while others keep writing.

    Copies in steps with SQLite's backup API; a step restarts when another
    connection writes, so after a few restarts the rest is copied in one step
    (one read transaction: consistent, and it does not block WAL writers).
    """
    _not_in_transaction(store, "back up")
    dest = os.path.abspath(fs_path(dest))
    if os.path.exists(dest):
        raise StorageError(f"{dest} exists already; backup writes a new file")
    try:
        fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.fchmod(fd, 0o600)
        os.close(fd)
    except OSError as e:
        raise StorageError(f"cannot create {dest}: {e.strerror or e}") from None
    ok = False
    try:
        out = apsw.Connection(dest)
        try:
            src = store.conn()
            with out.backup("main", src, "main") as b:
                restarts, last = 0, None
                while not b.done:
                    b.step(-1 if restarts >= 3 else 256)
                    if last is not None and b.remaining > last:
                        restarts += 1
                    last = b.remaining
                    if progress:
                        progress(b.page_count - b.remaining, b.page_count)
            out.execute("PRAGMA journal_mode = WAL")
            out.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            out.close()
        ok = True
    except apsw.Error as e:
        raise translate(e) from None
    finally:
        if not ok:
            for p in (dest, dest + "-wal", dest + "-shm", dest + "-journal"):
                try:
                    os.unlink(p)
                except OSError:
                    pass
    return dest


def _not_in_transaction(store: Store, what: str) -> None:
    store.conn()  # Closed first
    if store.in_write():
        raise UsageError(
            f"cannot {what} inside transaction(): it needs the database outside any write "
            "transaction of this thread; call it after the block"
        )


def vacuum(store: Store) -> dict[str, int]:
    _not_in_transaction(store, "vacuum")
    before = os.path.getsize(store.path)
    while True:  # everything expired and every feed row past retention, in bounded steps
        with store.write() as c:
            if purge(c, 1000) == 0:
                break
    try:
        c = store.conn()
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        c.execute("PRAGMA temp_store = FILE")  # VACUUM builds its copy in the temp store: disk, not RAM
        try:
            c.execute("VACUUM")
        finally:
            c.execute("PRAGMA temp_store = MEMORY")
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    except apsw.Error as e:
        raise translate(e) from None
    return {"size_before": before, "size_after": os.path.getsize(store.path)}


__all__ = ["AgentStateError", "backup", "check", "info", "purge", "sql", "store_id", "vacuum"]

# -- db.sql() -------------------------------------------------------------------------------
# Read-only is enforced before anything runs: an authorizer that lets a statement only
# read tables and views and call functions (SQLite asks it while compiling the statement,
# so a refused one never starts), then SQLite's own verdict on the compiled statement
# (``sqlite3_stmt_readonly``: REINDEX passes the authorizer but not this), and one
# statement per call. The statement runs in a read transaction (``Store.snapshot``).

# What a statement that only reads asks for: reading columns, SELECT itself,
# calling a function, a recursive CTE.
_READS = frozenset({apsw.SQLITE_SELECT, apsw.SQLITE_READ, apsw.SQLITE_FUNCTION,
                    apsw.SQLITE_RECURSIVE})
# Pragmas that describe the schema whatever their argument (``PRAGMA table_info(kv)``,
# ``SELECT * FROM pragma_table_info('kv')``); every other pragma is refused.
_SCHEMA_PRAGMAS = frozenset({"table_info", "table_xinfo", "table_list", "index_list",
                             "index_info", "index_xinfo", "foreign_key_list"})


def sql(store: Store, query: str, params: tuple[Any, ...] | dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one read-only statement, on this thread's connection, in one snapshot."""
    with store.snapshot() as c:
        return _run(c, query, params)


def _authorize(op: int, a: str | None, b: str | None, db: str | None, trigger: str | None) -> int:
    if op in _READS or (op == apsw.SQLITE_PRAGMA and (a or "").lower() in _SCHEMA_PRAGMAS):
        return apsw.SQLITE_OK
    return apsw.SQLITE_DENY


class _Guard:
    """The cursor's execution tracer: called after each statement is compiled, before it
    runs; returning False stops it. Counts the statements and asks SQLite whether the
    compiled one writes."""

    __slots__ = ("statements", "why")

    def __init__(self) -> None:
        self.statements = 0
        self.why: str | None = None

    def __call__(self, cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        if _only_comments(sql):  # a comment after the last ';' compiles to nothing
            return True
        self.statements += 1
        if self.statements > 1:
            self.why = "several"
            return False
        if not cursor.is_readonly:
            self.why = "writes"
            return False
        return True


def _only_comments(sql: str) -> bool:
    return not first_word(sql)


def _run(c: apsw.Connection, query: str, params: Any) -> list[dict[str, Any]]:
    guard = _Guard()
    # Setting an authorizer expires every statement this connection has compiled: the
    # store's own recompile once, without it, when they next run.
    c.authorizer = _authorize
    cursor = c.cursor()
    cursor.exec_trace = guard
    try:
        names: list[str] | None = None
        rows = []
        for row in cursor.execute(query, params, can_cache=False):
            if names is None:
                names = [d[0] for d in cursor.get_description()]
            rows.append(dict(zip(names, row)))
        return rows
    except apsw.ExecTraceAbort:
        if guard.why == "several":
            raise several() from None
        raise refused(f"{_head(query)} writes") from None
    except apsw.AuthError as e:
        if guard.statements:  # refused while compiling the statement after the first
            raise several() from None
        raise refused(f"{_head(query)} was not authorized ({e}): only SELECT, and the schema "
                      "pragmas (table_info, index_list, ...)") from None
    except (apsw.SQLError, apsw.BindingsError, apsw.MismatchError, apsw.RangeError, apsw.TooBigError,
            KeyError, TypeError, ValueError, OverflowError) as e:
        raise InvalidValue(f"db.sql(): {type(e).__name__}: {e}") from None
    except apsw.Error as e:
        raise translate(e) from None
    finally:
        try:
            cursor.close(True)
            c.authorizer = None
        except apsw.Error:  # closed meanwhile (db.close() from another thread)
            pass


def _head(query: str) -> str:
    words = query.split()
    return repr(" ".join(words[:4]) + (" ..." if len(words) > 4 else ""))
