"""Administration on PostgreSQL: the store's own invariants (check) and info.

``backup`` and ``vacuum`` work on a file; a server has its own tools
(pg_dump, VACUUM), so they refuse with UsageError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pgerr
from psycopg.types.string import TextLoader

from ..._sql import first_word, refused, several
from ...errors import InvalidValue, UsageError
from .errors import translate
from .schema import SCHEMA_VERSION
from .statements import quiet_rollback

if TYPE_CHECKING:
    from .store import Store

# Each invariant is one query returning (location, problem) rows; none means it holds.
_NOT_TOMBSTONE = "expires_at IS DISTINCT FROM '-infinity'"
INVARIANTS: list[tuple[str, str]] = [
    ("keys are well formed", f"""
        SELECT 'kv ' || kind || ':' || scope_id || ' ' || key, 'version ' || version || ', type ' || type
               || ', size ' || size || CASE WHEN value IS NULL THEN '' ELSE ', a JSON value' END
               || CASE WHEN data IS NULL THEN '' ELSE ', bytes' END
               || CASE WHEN list_id IS NULL THEN '' ELSE ', a list' END
               || CASE WHEN length IS NULL THEN '' ELSE ', a length' END
        FROM kv
        WHERE kind NOT IN ('thread', 'session', 'agent', 'user', 'app') OR size < 0
           OR ({_NOT_TOMBSTONE} AND NOT (
                  version >= 1
                  AND (type = 'json' AND value IS NOT NULL AND data IS NULL AND list_id IS NULL
                       AND length IS NULL
                    OR type = 'bytes' AND data IS NOT NULL AND value IS NULL AND list_id IS NULL
                       AND length IS NULL
                    OR type = 'list' AND list_id IS NOT NULL AND length >= 0 AND value IS NULL
                       AND data IS NULL)))
           OR (NOT {_NOT_TOMBSTONE} AND (version < 0 OR value IS NOT NULL OR data IS NOT NULL))"""),
    ("list length and size match the items", f"""
        SELECT 'kv ' || k.kind || ':' || k.scope_id || ' ' || k.key,
               'stored length ' || k.length || ' size ' || k.size || ', items give length '
               || count(i.idx) || ' size ' || (CASE WHEN count(i.idx) = 0 THEN 2
                  ELSE 1 + sum(octet_length(i.item::text) + 1) END)
               || ', indexes ' || coalesce(min(i.idx)::text, '-') || '..' || coalesce(max(i.idx)::text, '-')
        FROM kv k LEFT JOIN list_item i ON i.list_id = k.list_id
        WHERE k.type = 'list' AND k.{_NOT_TOMBSTONE} AND k.list_id > 0  -- one made from another: below
        GROUP BY k.kind, k.scope_id, k.key
        HAVING count(i.idx) <> k.length
            OR (CASE WHEN count(i.idx) = 0 THEN 2 ELSE 1 + sum(octet_length(i.item::text) + 1) END) <> k.size
            OR coalesce(min(i.idx), 0) <> 0 OR coalesce(max(i.idx), -1) <> k.length - 1"""),
    ("list items belong to a list", f"""
        SELECT 'list_item list_id ' || list_id, 'items of no list'
        FROM (SELECT list_id FROM list_item UNION SELECT list_id FROM list_gone
              EXCEPT SELECT list_id FROM kv WHERE type = 'list' AND {_NOT_TOMBSTONE}
              EXCEPT SELECT list_id FROM kv_history WHERE list_id IS NOT NULL  -- as it was
              EXCEPT SELECT base_id FROM list_base  -- read by a list made from it
              EXCEPT SELECT list_id FROM list_dead) orphans  -- left for the purge
        UNION ALL
        SELECT 'kv ' || kind || ':' || scope_id || ' ' || key, 'list ' || list_id || ' has no base'
        FROM kv WHERE list_id < 0 AND list_id NOT IN (SELECT list_id FROM list_base)
        UNION ALL
        SELECT 'kv ' || kind || ':' || scope_id || ' ' || key,
               'list ' || list_id || ' (made from another) reads ' || cardinality(list_read(list_id, 0, length))
               || ' of its ' || length || ' items'
        FROM kv WHERE list_id < 0 AND {_NOT_TOMBSTONE} AND cardinality(list_read(list_id, 0, length)) <> length
        UNION ALL
        SELECT 'list_seq', 'last ' || (SELECT last_value FROM list_seq) || ' is below list_id ' || max(list_id)
        FROM kv WHERE list_id IS NOT NULL HAVING max(list_id) > (SELECT last_value FROM list_seq)"""),
    ("values are of the recorded size", f"""
        SELECT 'kv ' || kind || ':' || scope_id || ' ' || key,
               'size ' || size || ' but the value has ' || coalesce(octet_length(value::text), octet_length(data))
        FROM kv WHERE type <> 'list' AND {_NOT_TOMBSTONE}
          AND coalesce(octet_length(value::text), octet_length(data)) <> size"""),
    ("run histories are seq first_seq..next_seq-1, no gap", """
        SELECT 'run ' || r.id,
               'seqs ' || r.first_seq || '..' || (r.next_seq - 1) || ' recorded but ' || count(e.seq)
               || ' entries, seqs ' || coalesce(min(e.seq)::text, '-') || '..' || coalesce(max(e.seq)::text, '-')
        FROM run r LEFT JOIN run_entry e ON e.run_id = r.id
        GROUP BY r.id
        HAVING count(e.seq) <> r.next_seq - r.first_seq
            OR coalesce(min(e.seq), r.first_seq) <> r.first_seq
            OR coalesce(max(e.seq), r.next_seq - 1) <> r.next_seq - 1"""),
    ("the change feed: rows well formed, seqs handed out by feed_head", """
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
        FROM change WHERE start < 0 OR count < 0 OR (start IS NULL) <> (count IS NULL)
        UNION ALL
        SELECT 'feed_head', 'last ' || (SELECT last FROM feed_head) || ' is below seq ' || max(seq)
        FROM change HAVING max(seq) > (SELECT last FROM feed_head)
        UNION ALL
        SELECT 'change_new', count(*) || ' changes of committed transactions have no ticket'
        FROM change_new WHERE ticket IS NULL HAVING count(*) > 0
        UNION ALL
        SELECT 'change_new ticket ' || ticket, 'topic ' || topic || ' op ' || op || ' is no change'
        FROM change_new WHERE topic NOT IN ('kv', 'run', 'session') OR ord < 1
        UNION ALL
        SELECT 'change_new ticket ' || ticket, 'a committed change of transaction ' || xid
               || ', below the fence ' || (SELECT fence FROM feed_head) || ', was never numbered'
        FROM change_new WHERE xid < (SELECT fence FROM feed_head)"""),
    ("no kv change is newer than its key", """
        SELECT 'change seq ' || ch.seq, 'version ' || ch.version || ' of ' || ch.kind || ':'
               || ch.scope_id || ' ' || ch.key || ' but the key has reached only ' || coalesce(k.version, 0)
        FROM change ch
        LEFT JOIN kv k ON k.kind = ch.kind AND k.scope_id = ch.scope_id AND k.key = ch.key
        WHERE ch.topic = 'kv' AND ch.version > coalesce(k.version, 0)"""),
    ("run entries are JSON objects carrying their seq", """
        SELECT 'run ' || run_id || ' seq ' || seq, 'entry is not an object with this seq'
        FROM run_entry
        WHERE json_typeof(entry) <> 'object'
           OR json_typeof(entry -> 'seq') IS DISTINCT FROM 'number'
           OR (entry ->> 'seq')::numeric <> seq
        UNION ALL
        SELECT 'run ' || id, 'snapshot is not a JSON object'
        FROM run WHERE snapshot IS NOT NULL AND json_typeof(snapshot) <> 'object'"""),
    ("at most one active turn per session", """
        SELECT 'session ' || session_id, count(*) || ' queued or running turns'
        FROM turn WHERE status IN ('queued', 'running')
        GROUP BY session_id HAVING count(*) > 1"""),
]


PURGE_BATCH = 64  # rows of each kind a purge step removes at most (as the writes' own steps)


def purge(c: Any, batch: int = PURGE_BATCH) -> int:
    """Remove up to ``batch`` feed rows past the retention and ``batch`` expired keys."""
    return c.execute("SELECT feed_purge(%s)", (batch,)).fetchone()[0]


def check(store: Store) -> list[str]:
    """Every problem found, as 'location: problem'; [] when the store is sound.

    The server keeps its own pages sound (and enforces the foreign keys);
    these are the store's invariants, one query each, in one snapshot.
    """
    problems: list[str] = []
    with store.snapshot() as c:
        for name, sql in INVARIANTS:
            try:
                c.execute("SAVEPOINT inv")
                for where, what in c.execute(sql).fetchall():
                    problems.append(f"{where}: {what} ({name})")
                c.execute("RELEASE SAVEPOINT inv")
            except psycopg.Error as e:
                c.execute("ROLLBACK TO SAVEPOINT inv")
                problems.append(f"{name}: could not be checked: {translate(e)}")
    return problems


def store_id(store: Store) -> str:
    """The store's own id (the ``store`` table's one row), made with the store."""
    return str(store.query("SELECT id FROM store")[0][0])


def info(store: Store) -> dict[str, Any]:
    with store.snapshot() as c:
        row = c.execute(
            f"""SELECT (SELECT count(*) FROM (SELECT DISTINCT kind, scope_id FROM kv
                                             WHERE {_NOT_TOMBSTONE}) s),
                      (SELECT count(*) FROM kv WHERE {_NOT_TOMBSTONE}), (SELECT count(*) FROM list_item),
                      (SELECT count(*) FROM run), (SELECT count(*) FROM run_entry),
                      (SELECT count(*) FROM session), (SELECT count(*) FROM turn),
                      (SELECT count(*) FROM change) + (SELECT count(*) FROM change_new),
                      (SELECT version FROM agentstate_version),
                      (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
                       FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace
                         AND c.relkind = 'r'),
                      current_schema(), current_setting('server_version')""").fetchone()
    counts = dict(zip(("scopes", "keys", "list_items", "runs", "entries", "sessions", "turns",
                       "changes"), row[:8]))
    return {
        "path": store.path,
        "size_bytes": row[9],
        "wal_bytes": 0,  # the server's WAL is shared by all its databases: not this store's
        "schema_version": row[8],
        "library_schema_version": SCHEMA_VERSION,
        "durability": store.durability,
        "counts": counts,
        "schema": row[10],
        "server_version": row[11],
    }


def backup(store: Store, dest: str, progress: Any = None) -> str:
    raise UsageError("backup copies an SQLite file; for a PostgreSQL store use the server's tools "
                     f"(pg_dump --schema={store.schema} ...)")


def vacuum(store: Store) -> dict[str, int]:
    raise UsageError("vacuum rebuilds an SQLite file; a PostgreSQL server vacuums its own tables "
                     "(autovacuum, or VACUUM in psql); expired keys are purged as writes happen")


__all__ = ["backup", "check", "info", "purge", "sql", "store_id", "vacuum"]


# What a statement that only reads starts with (a data-modifying WITH, SELECT INTO or
# EXPLAIN ANALYZE of a write is then refused by the READ ONLY transaction).
_QUERIES = frozenset({"SELECT", "WITH", "VALUES", "TABLE", "SHOW", "EXPLAIN"})
# The other statements PostgreSQL knows: refused as writes. A first word in neither
# set is not sent either: it is a syntax error (InvalidValue), as on a file.
_NOT_QUERIES = frozenset("""
    INSERT UPDATE DELETE MERGE TRUNCATE COPY CREATE ALTER DROP GRANT REVOKE COMMENT SECURITY
    REINDEX VACUUM ANALYZE ANALYSE CLUSTER CHECKPOINT REFRESH REASSIGN IMPORT LOAD SET RESET
    BEGIN START COMMIT END ROLLBACK ABORT SAVEPOINT RELEASE PREPARE EXECUTE DEALLOCATE LISTEN
    UNLISTEN NOTIFY DECLARE FETCH MOVE CLOSE DISCARD LOCK DO CALL""".split())


def sql(store: Store, query: str, params: tuple[Any, ...] | dict[str, Any]) -> list[dict[str, Any]]:
    """db.sql() on the server: one query in a READ ONLY transaction, then ROLLBACK.

    Only a statement that starts as a query is sent (SET, LISTEN, PREPARE, BEGIN ...
    would change the pooled connection or its transaction), with the extended protocol
    (``stream``), which takes one statement only: ``SELECT 1; COMMIT; DELETE ...``
    never reaches the server as three.
    """
    word = first_word(query)
    if word in _NOT_QUERIES:
        raise refused(f"{word} is not a query")
    if word not in _QUERIES:
        raise InvalidValue(f"db.sql(): {word or 'the query'!r} does not start a statement "
                           f"(a query starts with {', '.join(sorted(_QUERIES))})")
    raw = store._checkout()
    try:
        raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        cur = raw.cursor()
        for name in ("json", "jsonb"):  # JSON as its text, as the file gives it
            cur.adapters.register_loader(name, TextLoader)
        rows = list(cur.stream(query, params or None))
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.INTRANS:
            raise refused("the statement ended the transaction")
        names = [d.name for d in cur.description or ()]
        return [dict(zip(names, row)) for row in rows]
    except pgerr.ReadOnlySqlTransaction as e:
        raise refused(str(e).strip().split("\n", 1)[0]) from None
    except pgerr.InsufficientPrivilege as e:
        raise translate(e) from None
    except (pgerr.SyntaxError, pgerr.UndefinedTable, pgerr.UndefinedColumn, pgerr.UndefinedFunction,
            pgerr.UndefinedObject, psycopg.ProgrammingError, psycopg.DataError,
            KeyError, TypeError, ValueError) as e:
        if isinstance(e, pgerr.SyntaxError) and "multiple commands" in str(e):
            raise several() from None
        raise InvalidValue(f"db.sql(): {type(e).__name__}: {str(e).strip()}") from None
    except psycopg.Error as e:
        raise translate(e) from None
    finally:
        quiet_rollback(raw)  # it wrote nothing; this undoes a set_config() it made
        store._checkin(raw)
