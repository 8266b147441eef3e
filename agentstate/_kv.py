"""Repository of scoped keys: one function per logical operation.

Each function runs inside the caller's write transaction (``Store.write``) or
is a single read statement, so it sees and changes one consistent state.
"""

from __future__ import annotations

from typing import Any

import apsw

from ._connection import now_iso
from ._encoding import MAX_VALUE, list_size
from .errors import NotAList, TooLarge, VersionConflict

Row = tuple[Any, ...]

_FIND = "SELECT id, version, type, length, size FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3"
_CREATE = """
INSERT INTO kv (kind, scope_id, key, version, type, value, length, size, updated_at)
VALUES (?1, ?2, ?3,
        1 + coalesce((SELECT version FROM kv_deleted WHERE kind = ?1 AND scope_id = ?2 AND key = ?3), 0),
        ?4, ?5, ?6, ?7, ?8)
RETURNING id, version"""
_REPLACE = """
UPDATE kv SET version = version + 1, type = ?2, value = ?3, length = ?4, size = ?5, updated_at = ?6
WHERE id = ?1"""
_ADD_ITEMS = "INSERT INTO list_item (key_id, idx, item) VALUES (?, ?, ?)"
_DROP_ITEMS = "DELETE FROM list_item WHERE key_id = ?"


def _conflict(what: str, expected: int, current: int) -> VersionConflict:
    return VersionConflict(
        f"{what}: expected version {expected}, the current version is {current}", current
    )


def get(c: apsw.Connection, kind: str, sid: str, key: str) -> Row | None:
    """(type, value, version, joined list items) in one statement, or None."""
    return c.execute(
        """SELECT type, value, version,
                  CASE type WHEN 'list' THEN
                    (SELECT group_concat(item, ',' ORDER BY idx) FROM list_item WHERE key_id = kv.id)
                  END
           FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3""",
        (kind, sid, key),
    ).fetchone()


def put(
    c: apsw.Connection,
    kind: str,
    sid: str,
    key: str,
    type_: str,
    value: Any,
    size: int,
    items: list[str] | None,
    if_version: int | None,
) -> int:
    """Write a value (``items`` for a list); return the new version."""
    row = c.execute(_FIND, (kind, sid, key)).fetchone()
    current = row[1] if row else 0
    if if_version is not None and if_version != current:
        raise _conflict(f"put {kind}:{sid} {key}", if_version, current)
    length = None if items is None else len(items)
    now = now_iso()
    if row is None:
        key_id, version = c.execute(
            _CREATE, (kind, sid, key, type_, value, length, size, now)
        ).fetchone()
    else:
        key_id, version = row[0], current + 1
        if row[2] == "list":
            c.execute(_DROP_ITEMS, (key_id,))
        c.execute(_REPLACE, (key_id, type_, value, length, size, now))
    if items:
        c.executemany(_ADD_ITEMS, [(key_id, i, t) for i, t in enumerate(items)])
    return version


def delete(c: apsw.Connection, kind: str, sid: str, key: str, if_version: int | None) -> bool:
    """Remove a key, remembering its version; return whether it existed."""
    row = c.execute(_FIND, (kind, sid, key)).fetchone()
    current = row[1] if row else 0
    if if_version is not None and if_version != current:
        raise _conflict(f"delete {kind}:{sid} {key}", if_version, current)
    if row is None:
        return False
    c.execute("DELETE FROM kv WHERE id = ?", (row[0],))  # list items go by ON DELETE CASCADE
    c.execute(
        """INSERT INTO kv_deleted (kind, scope_id, key, version) VALUES (?, ?, ?, ?)
           ON CONFLICT DO UPDATE SET version = excluded.version""",
        (kind, sid, key, current + 1),
    )
    return True


def append(
    c: apsw.Connection, kind: str, sid: str, key: str, items: list[str], items_size: int
) -> tuple[int, int]:
    """Add items at the end of a list (created if absent); return (length, version)."""
    row = c.execute(_FIND, (kind, sid, key)).fetchone()
    n = len(items)
    if row is None:
        length, size = 0, 2
    else:
        if row[2] != "list":
            raise NotAList(f"{kind}:{sid} {key} holds a {row[2]} value, not a list")
        length, size = row[3], row[4]
        if n == 0:
            return length, row[1]
    # items_size is the JSON of [items]; joining two lists drops one pair of
    # brackets and adds a comma when both are non-empty.
    new_size = size + items_size - 2 + (1 if length and n else 0)
    if new_size > MAX_VALUE:
        raise TooLarge(
            f"the list would be {new_size} bytes, over the limit of {MAX_VALUE}", new_size, MAX_VALUE
        )
    now = now_iso()
    if row is None:
        key_id, version = c.execute(
            _CREATE, (kind, sid, key, "list", None, n, new_size, now)
        ).fetchone()
    else:
        key_id, version = row[0], row[1] + 1
        c.execute(
            "UPDATE kv SET version = ?2, length = ?3, size = ?4, updated_at = ?5 WHERE id = ?1",
            (key_id, version, length + n, new_size, now),
        )
    if n:
        c.executemany(_ADD_ITEMS, [(key_id, length + i, t) for i, t in enumerate(items)])
    return length + n, version


def slice_items(
    c: apsw.Connection, kind: str, sid: str, key: str, start: int, stop: int | None
) -> list[str] | None:
    """Item texts of list[start:stop] in one statement; None when not a list."""
    rows = c.execute(
        """SELECT k.type, i.item FROM kv k
           LEFT JOIN list_item i ON i.key_id = k.id
             AND i.idx >= (CASE WHEN ?4 < 0 THEN k.length + ?4 ELSE ?4 END)
             AND i.idx < (CASE WHEN ?5 IS NULL THEN k.length
                               WHEN ?5 < 0 THEN k.length + ?5 ELSE ?5 END)
           WHERE k.kind = ?1 AND k.scope_id = ?2 AND k.key = ?3
           ORDER BY i.idx""",
        (kind, sid, key, start, stop),
    ).fetchall()
    if not rows:
        return []
    if rows[0][0] != "list":
        return None
    return [r[1] for r in rows if r[1] is not None]


def length(c: apsw.Connection, kind: str, sid: str, key: str) -> int | None:
    """Items in a list, 0 when absent, None when the value is not a list."""
    row = c.execute(
        "SELECT type, length FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3",
        (kind, sid, key),
    ).fetchone()
    if row is None:
        return 0
    return row[1] if row[0] == "list" else None


def keys(
    c: apsw.Connection, kind: str, sid: str, prefix: str, after: str | None, limit: int | None
) -> list[str]:
    """Keys starting with ``prefix`` (a range scan on the unique index), ascending."""
    lo = prefix if after is None or after < prefix else after
    # Keys are ASCII below DEL, so '\x7f' bounds them all; else the prefix's successor.
    hi = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\x7f"
    op = ">=" if after is None or after < prefix else ">"
    return [
        r[0]
        for r in c.execute(
            f"""SELECT key FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key {op} ?3 AND key < ?4
                ORDER BY key LIMIT ?5""",
            (kind, sid, lo, hi, -1 if limit is None else limit),
        )
    ]
