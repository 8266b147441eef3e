"""Repository of the change feed (SPEC §9) and the settings (SPEC §10) on PostgreSQL.

The write functions record their changes themselves (``feed_add`` in
``schema_postgres.sql``), unnumbered and without a lock every writer would
share; a reader numbers the committed ones (``feed_sequence``) in a
transaction of its own right before its read, in the same round trip, so the
seqs it sees only ever grow and it sees its own committed writes. Every 16th
write of a connection also purges a few old rows and expired keys
(``feed_purge_step``); ``admin.purge`` runs one such step on demand.
"""

from __future__ import annotations

from typing import Any

from ..._grants import RUNS, Rule
from ..base import SETTINGS, Filters, Readable, check_cursor
from .statements import READ, SEQUENCE, Conn

__all__ = ["head", "scan", "settings", "set_setting"]

COLUMNS = "seq, at, topic, op, kind, scope_id, key, version, start, count"


def head(c: Conn) -> int:
    """The newest seq, once the committed changes are numbered; 0 on a new store.

    Inside a write transaction nothing is numbered (that would hold the
    sequencers' lock until it ends): the newest seq numbered so far.
    """
    if c.mode is READ:
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
        where += " AND " + _readable(readable, params)
    rows = c.execute(
        f"SELECT {COLUMNS} FROM change WHERE seq > %(since)s{where} ORDER BY seq LIMIT %(limit)s",
        params).fetchall()
    return rows, top


def id_match(rule: Rule, column: str, params: dict[str, Any], name: str) -> str:
    """SQL that is true where ``column`` is an id ``rule`` covers."""
    if not rule.prefix:
        params[name] = rule.id
        return f"{column} = %({name})s"
    if not rule.id:
        return "true"
    params[name] = rule.id
    return f"starts_with({column}, %({name})s)"


def _readable(r: Readable, params: dict[str, Any]) -> str:
    """The changes a token with grants may read (base.Readable), as one condition."""
    params["owner"] = r.owner
    terms = ["(topic = 'session' OR (topic = 'kv' AND kind = 'session')) "
             "AND scope_id IN (SELECT id FROM session WHERE owner = %(owner)s)"]
    for i, rule in enumerate(r.rules):
        match = id_match(rule, "scope_id", params, f"g{i}")
        if rule.kind == RUNS:
            terms.append(f"topic = 'run' AND {match}")
        else:
            params[f"k{i}"] = rule.kind
            terms.append(f"topic = 'kv' AND kind = %(k{i})s AND {match}"
                         + (" AND scope_id !~ '^s-[0-9a-f]{32}$'" if rule.kind == "session" else ""))
    return "(" + " OR ".join(f"({t})" for t in terms) + ")"


def settings(c: Conn) -> dict[str, Any]:
    return {**SETTINGS, **dict(c.execute("SELECT name, value FROM setting").fetchall())}


def set_setting(c: Conn, name: str, value: Any) -> None:
    c.execute("INSERT INTO setting (name, value) VALUES (%s, %s) "
              "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value))
