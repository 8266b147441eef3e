"""Repository of the change feed (SPEC §9) and of the settings (SPEC §10).

``record`` is called by every write, inside the write's own transaction, so a
change row exists exactly when its write does. ``purge_step`` removes a few
rows past the retention (the bounded housekeeping of ``admin.purge``).
"""

from __future__ import annotations

import json
from typing import Any

from ..base import SETTINGS, Conn, Filters, check_cursor, iso, now_iso
from ..grants import GrantSQL, Readable

__all__ = ["record", "head", "scan", "settings", "set_setting", "purge_step"]

# One statement: no row while the feed is off (feed_retention = 0).
_RECORD = """
INSERT INTO change (at, topic, op, kind, scope_id, key, version, start, count)
SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9
WHERE NOT EXISTS (SELECT 1 FROM setting WHERE name = 'feed_retention' AND value = 0)
RETURNING seq"""

COLUMNS = "seq, at, topic, op, kind, scope_id, key, version, start, count"

# Of the ?1 oldest rows, those before the first one newer than ?2: the feed
# kept is always every seq from its first one on (seqs follow commit order,
# and nothing makes `at` follow them: a clock stepped back, a time stamped
# before a wait), so scan's "oldest kept" check holds. Never
# the newest row (its seq must not be handed out again): the ?1 + 1 oldest
# rows are read, and the last of them is kept. A range on seq, not `seq IN
# (subquery)`: no temporary table (benchmarks/PERCALL.md).
_PURGE = """
DELETE FROM change WHERE seq < (
    SELECT coalesce(min(seq) FILTER (WHERE at >= ?2), max(seq))  -- the first row kept
    FROM (SELECT seq, at FROM change ORDER BY seq LIMIT ?1 + 1))"""


def record(c: Conn, topic: str, op: str, kind: str | None = None,
           sid: str | None = None, key: str | None = None, version: int | None = None,
           start: int | None = None, count: int | None = None, at: str | None = None) -> int | None:
    """The change row of a write, and its seq (None: the feed is off); ``at``: the write's
    own now_iso() stamp, when it has one."""
    row = c.execute(_RECORD, (at or now_iso(), topic, op, kind, sid, key, version, start,
                              count)).fetchone()
    return None if row is None else row[0]


def head(c: Conn) -> int:
    """The newest seq handed out (the purge always keeps its row); 0 on a new file."""
    return c.execute("SELECT coalesce(max(seq), 0) FROM change").fetchone()[0]


def oldest(c: Conn) -> int | None:
    row = c.execute("SELECT min(seq) FROM change").fetchone()
    return row[0]


def changes(c: Conn, since: int, limit: int, filters: Filters, readable: Readable | None = None,
            upto: int | None = None) -> list[tuple[Any, ...]]:
    params: dict[str, Any] = {"since": since, "limit": limit, "upto": upto, **filters}
    where = "".join(f" AND {name} = :{name}" for name in filters)
    if upto is not None:
        where += " AND seq <= :upto"
    if readable is not None:
        where += " AND " + GRANTS.readable_sql(readable, params)
    return c.execute(
        f"SELECT {COLUMNS} FROM change WHERE seq > :since{where} ORDER BY seq LIMIT :limit",
        params).fetchall()


SESSION_FORM = "s-" + "[0-9a-f]" * 32  # grants.SESSION_ID as a GLOB


class _GrantSQL(GrantSQL):
    true = "1"

    def param(self, name: str) -> str:
        return f":{name}"

    def texts(self, values: list[str]) -> str:
        return json.dumps(values)

    def one_of(self, expr: str, name: str) -> str:
        # a JSON array bound once; IN builds an index of it once per statement
        return f"{expr} IN (SELECT value FROM json_each(:{name}))"

    def not_a_session(self, column: str) -> str:
        return f"{column} NOT GLOB '{SESSION_FORM}'"


GRANTS = _GrantSQL()


def scan(c: Conn, since: int, limit: int, flt: Filters, readable: Readable | None = None,
         upto: int | None = None) -> tuple[list[tuple[Any, ...]], int]:
    """(change rows after since, head) in the caller's read transaction.

    :raises CursorExpired: some change after ``since`` is no longer kept.
    """
    top = head(c)
    if since < top:
        check_cursor(since, top, setting(c, "feed_retention"), oldest(c))
    return changes(c, since, limit, flt, readable, upto), top


def setting(c: Conn, name: str) -> Any:
    row = c.execute("SELECT value FROM setting WHERE name = ?", (name,)).fetchone()
    return SETTINGS[name] if row is None else row[0]


def settings(c: Conn) -> dict[str, Any]:
    return {**SETTINGS, **dict(c.execute("SELECT name, value FROM setting").fetchall())}


def set_setting(c: Conn, name: str, value: Any) -> None:
    c.execute("INSERT INTO setting (name, value) VALUES (?, ?) "
              "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value))


def purge_step(c: Conn, now: float, batch: int) -> int:
    """Remove up to ``batch`` feed rows past the retention; how many."""
    c.execute(_PURGE, (batch, iso(max(0.0, now - setting(c, "feed_retention")))))
    return c.changes()
