"""Repository of the change feed (SPEC §9) and the settings (SPEC §10) on PostgreSQL.

The write functions record their changes themselves (``feed_add`` in
``schema_postgres.sql``), unnumbered and without a lock every writer would
share; a reader numbers the committed ones (``feed_sequence``) in a
transaction of its own right before its read, in the same round trip, so the
seqs it sees only ever grow and it sees its own committed writes. Every 16th
write of a connection also purges a few old rows and expired keys
(``feed_purge_step``); ``purge`` runs one such step on demand.
"""

from __future__ import annotations

import time
from typing import Any

from .._feed import DEFAULTS
from ..errors import CursorExpired
from .store import READ, SEQUENCE, Conn

__all__ = ["iso", "head", "scan", "settings", "set_setting", "purge"]

PURGE_BATCH = 64  # rows of each kind a purge step removes at most (as the writes' own steps)
COLUMNS = "seq, at, topic, op, kind, scope_id, key, version, start, count"


def iso(t: float) -> str:
    """A unix time as ISO-8601 UTC text (what the server reads as a timestamptz).

    Before 1970 (a prune's cutoff of up to 1e11 seconds ago, past the server's
    range) it is '-infinity': the store holds nothing older, as on SQLite.
    """
    if t < 0:
        return "-infinity"
    sec, us = divmod(int(t * 1_000_000), 1_000_000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(sec))}.{us:06d}Z"


def head(c: Conn) -> int:
    """The newest seq, once the committed changes are numbered; 0 on a new store.

    Inside a write transaction nothing is numbered (that would hold the
    sequencers' lock until it ends): the newest seq numbered so far.
    """
    if c.mode is READ:
        return c.execute("SELECT feed_sequence()").fetchone()[0]
    return c.execute("SELECT last FROM feed_head").fetchone()[0]


def scan(c: Conn, since: int, limit: int, flt: dict[str, Any]) -> tuple[list[tuple[Any, ...]], int]:
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
        if retention == 0:
            raise CursorExpired(f"the change feed is off (feed_retention 0): only since={top} "
                                "(last_change()) is valid")
        if first is None or first > since + 1:
            raise CursorExpired(
                f"changes after {since} are no longer kept (the oldest kept is "
                f"{first if first is not None else 'none'}): read the current state and go on "
                f"from last_change() = {top}")
    where = "".join(f" AND {name} = %({name})s" for name in flt)
    rows = c.execute(
        f"SELECT {COLUMNS} FROM change WHERE seq > %(since)s{where} ORDER BY seq LIMIT %(limit)s",
        {"since": since, "limit": limit, **flt}).fetchall()
    return rows, top


def settings(c: Conn) -> dict[str, Any]:
    return {**DEFAULTS, **dict(c.execute("SELECT name, value FROM setting").fetchall())}


def set_setting(c: Conn, name: str, value: Any) -> None:
    c.execute("INSERT INTO setting (name, value) VALUES (%s, %s) "
              "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value))


def purge(c: Conn, batch: int = PURGE_BATCH) -> int:
    """Remove up to ``batch`` feed rows past the retention and ``batch`` expired keys."""
    return c.execute("SELECT feed_purge(%s)", (batch,)).fetchone()[0]
