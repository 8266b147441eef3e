"""Repository of the change feed (SPEC §9) and the settings (SPEC §10) on PostgreSQL.

The writes record their changes themselves (``feed_add`` in
``schema_postgres.sql``, or a CTE of lean.py's statements), unnumbered and
without a lock every writer would share; a reader numbers the committed ones
(``feed_sequence``) in a transaction of its own right before its read, in the
same round trip, so the seqs it sees only ever grow and it sees its own
committed writes. Every 16th write of a store's process asks whether the feed
has work due (``feed_due``: expired keys, rows past the retention, changes
nobody numbered) and, if so, purges a few after its COMMIT (``feed_after``);
``admin.purge`` runs one such step on demand.
"""

from __future__ import annotations

from typing import Any

from ..base import SETTINGS, Filters, check_cursor
from ..grants import GrantSQL, Readable
from .statements import AUTO, READ, SEQUENCE, Conn

__all__ = ["head", "scan", "settings", "set_setting"]

COLUMNS = "seq, at, topic, op, kind, scope_id, key, version, start, count"


def head(c: Conn) -> int:
    """The newest seq, once the committed changes are numbered; 0 on a new store.

    Inside a write transaction nothing is numbered (that would hold the
    sequencers' lock until it ends): the newest seq numbered so far.
    """
    if c.mode is AUTO:
        c.begin()  # a read inside a write: what follows depends on it
    elif c.mode is READ:
        if not c.open:  # numbered and committed before the read's snapshot (as scan's)
            c.pending[:0] = SEQUENCE
            return c.execute("SELECT last FROM feed_head").fetchone()[0]
        return c.execute("SELECT feed_sequence()").fetchone()[0]
    return c.execute("SELECT last FROM feed_head").fetchone()[0]


def scan(c: Conn, since: int, limit: int, flt: Filters, readable: Readable | None = None,
         upto: int | None = None) -> tuple[list[tuple[Any, ...]], int]:
    """(change rows after since, head) in the caller's snapshot.

    The committed changes are numbered first (``SEQUENCE``, sent with the
    snapshot's BEGIN), unless this is a write transaction.

    :raises CursorExpired: some change after ``since`` is no longer kept.
    """
    if c.mode is READ and not c.open:
        c.pending[:0] = SEQUENCE
    top, retention, first = c.execute(
        "SELECT (SELECT last FROM feed_head), (SELECT value FROM setting WHERE name = 'feed_retention'), "
        "(SELECT min(seq) FROM change)").fetchone()
    if since < top:
        check_cursor(since, top, SETTINGS["feed_retention"] if retention is None else retention,
                     first)
    params: dict[str, Any] = {"since": since, "limit": limit, "upto": upto, **flt}
    where = "".join(f" AND {name} = %({name})s" for name in flt)
    if upto is not None:
        where += " AND seq <= %(upto)s"
    if readable is not None:
        where += " AND " + GRANTS.readable_sql(readable, params)
    rows = c.execute(
        f"SELECT {COLUMNS} FROM change WHERE seq > %(since)s{where} ORDER BY seq LIMIT %(limit)s",
        params).fetchall()
    return rows, top


class _GrantSQL(GrantSQL):
    def param(self, name: str) -> str:
        return f"%({name})s"

    def one_of(self, expr: str, name: str) -> str:
        return f"{expr} = ANY(%({name})s::text[])"

    def not_a_session(self, column: str) -> str:
        return f"{column} !~ '^s-[0-9a-f]{{32}}$'"


GRANTS = _GrantSQL()


def settings(c: Conn) -> dict[str, Any]:
    return {**SETTINGS, **dict(c.execute("SELECT name, value FROM setting").fetchall())}


def set_setting(c: Conn, name: str, value: Any) -> None:
    c.execute("INSERT INTO setting (name, value) VALUES (%s, %s) "
              "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value))
