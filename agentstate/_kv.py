"""Repository of scoped keys: one function per logical operation.

Each function runs inside the caller's write transaction (``Store.write``) or
is a single read statement, so it sees and changes one consistent state.
"""

from __future__ import annotations

from typing import Any

import apsw

from ._connection import now_iso
from ._encoding import MAX_VALUE
from .errors import NotAList, TooLarge, VersionConflict

Row = tuple[Any, ...]

_FIND = """SELECT version, type, list_id, length, size FROM kv
           WHERE kind = ?1 AND scope_id = ?2 AND key = ?3"""
_NEXT_VERSION = "1 + coalesce((SELECT version FROM kv_deleted WHERE kind = ?1 AND scope_id = ?2 AND key = ?3), 0)"
# The common put in one statement: create, or replace a value that is not a
# list (a list's items need deleting first: that, lists and CAS take the slow path).
_UPSERT = f"""
INSERT INTO kv (kind, scope_id, key, version, type, value, list_id, length, size, updated_at)
VALUES (?1, ?2, ?3, {_NEXT_VERSION}, ?4, ?5, NULL, NULL, ?6, ?7)
ON CONFLICT (kind, scope_id, key) DO UPDATE
SET version = kv.version + 1, type = excluded.type, value = excluded.value, size = excluded.size,
    updated_at = excluded.updated_at
WHERE kv.type <> 'list'
RETURNING version"""
# Compare-and-set in one statement each: create only if absent, replace only
# at the expected version (and not over a list, whose items need deleting).
_CREATE_IF_ABSENT = f"""
INSERT INTO kv (kind, scope_id, key, version, type, value, list_id, length, size, updated_at)
VALUES (?1, ?2, ?3, {_NEXT_VERSION}, ?4, ?5, NULL, NULL, ?6, ?7)
ON CONFLICT (kind, scope_id, key) DO NOTHING
RETURNING version"""
_REPLACE_AT = """
UPDATE kv SET version = version + 1, type = ?4, value = ?5, size = ?6, updated_at = ?7
WHERE kind = ?1 AND scope_id = ?2 AND key = ?3 AND version = ?8 AND type <> 'list'
RETURNING version"""
_CREATE = f"""
INSERT INTO kv (kind, scope_id, key, version, type, value, list_id, length, size, updated_at)
VALUES (?1, ?2, ?3, {_NEXT_VERSION}, ?4, ?5, ?6, ?7, ?8, ?9)
RETURNING version"""
_REPLACE = """
UPDATE kv SET version = version + 1, type = ?4, value = ?5, list_id = ?6, length = ?7, size = ?8,
              updated_at = ?9
WHERE kind = ?1 AND scope_id = ?2 AND key = ?3"""
_NEW_LIST = "UPDATE list_seq SET last = last + 1 RETURNING last"
_ADD_ITEMS = "INSERT INTO list_item (list_id, idx, item) VALUES (?, ?, ?)"
_DROP_ITEMS = "DELETE FROM list_item WHERE list_id = ?"


def _conflict(what: str, expected: int, current: int) -> VersionConflict:
    return VersionConflict(
        f"{what}: expected version {expected}, the current version is {current}", current
    )


def get(c: apsw.Connection, kind: str, sid: str, key: str) -> Row | None:
    """(type, value, version, joined list items) in one statement, or None."""
    return c.execute(
        """SELECT type, value, version,
                  CASE type WHEN 'list' THEN
                    (SELECT group_concat(item, ',' ORDER BY idx) FROM list_item
                     WHERE list_id = kv.list_id)
                  END
           FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3""",
        (kind, sid, key),
    ).fetchone()


def _add_items(c: apsw.Connection, list_id: int, start: int, items: list[str]) -> None:
    if items:
        c.executemany(_ADD_ITEMS, [(list_id, start + i, t) for i, t in enumerate(items)])


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
    now = now_iso()
    if items is None:  # one statement, unless a list must be replaced or CAS failed
        args = (kind, sid, key, type_, value, size, now)
        if if_version is None:
            done = c.execute(_UPSERT, args).fetchone()
        elif if_version == 0:
            done = c.execute(_CREATE_IF_ABSENT, args).fetchone()
        else:
            done = c.execute(_REPLACE_AT, (*args, if_version)).fetchone()
        if done is not None:
            return done[0]
    row = c.execute(_FIND, (kind, sid, key)).fetchone()
    current = row[0] if row else 0
    if if_version is not None and if_version != current:
        raise _conflict(f"put {kind}:{sid} {key}", if_version, current)
    list_id = row[2] if row else None
    if list_id is not None:
        c.execute(_DROP_ITEMS, (list_id,))
    if items is None:
        list_id = length = None
    else:
        length = len(items)
        if list_id is None:
            list_id = c.execute(_NEW_LIST).fetchone()[0]
        _add_items(c, list_id, 0, items)
    args = (kind, sid, key, type_, value, list_id, length, size, now)
    if row is None:
        return c.execute(_CREATE, args).fetchone()[0]
    c.execute(_REPLACE, args)
    return current + 1


def delete(c: apsw.Connection, kind: str, sid: str, key: str, if_version: int | None) -> bool:
    """Remove a key (and a list's items), remembering its version; whether it existed."""
    row = c.execute(_FIND, (kind, sid, key)).fetchone()
    current = row[0] if row else 0
    if if_version is not None and if_version != current:
        raise _conflict(f"delete {kind}:{sid} {key}", if_version, current)
    if row is None:
        return False
    if row[2] is not None:
        c.execute(_DROP_ITEMS, (row[2],))
    c.execute("DELETE FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3", (kind, sid, key))
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
        if row[1] != "list":
            raise NotAList(f"{kind}:{sid} {key} holds a {row[1]} value, not a list")
        length, size = row[3], row[4]
        if n == 0:
            return length, row[0]
    # items_size is the JSON of [items]; joining two lists drops one pair of
    # brackets and adds a comma when both are non-empty.
    new_size = size + items_size - 2 + (1 if length and n else 0)
    if new_size > MAX_VALUE:
        raise TooLarge(
            f"the list would be {new_size} bytes, over the limit of {MAX_VALUE}", new_size, MAX_VALUE
        )
    now = now_iso()
    if row is None:
        list_id = c.execute(_NEW_LIST).fetchone()[0]
        version = c.execute(_CREATE, (kind, sid, key, "list", None, list_id, n, new_size, now)).fetchone()[0]
    else:
        list_id, version = row[2], row[0] + 1
        c.execute(
            """UPDATE kv SET version = ?4, length = ?5, size = ?6, updated_at = ?7
               WHERE kind = ?1 AND scope_id = ?2 AND key = ?3""",
            (kind, sid, key, version, length + n, new_size, now),
        )
    _add_items(c, list_id, length, items)
    return length + n, version


def pop(c: apsw.Connection, kind: str, sid: str, key: str, n: int) -> tuple[list[str], int]:
    """Remove the last ``n`` items of a list; return their texts in list order and the version."""
    row = c.execute(_FIND, (kind, sid, key)).fetchone()
    if row is None:
        return [], 0
    version, type_, list_id, length, size = row
    if type_ != "list":
        raise NotAList(f"{kind}:{sid} {key} holds a {type_} value, not a list")
    k = min(n, length)
    if k == 0:
        return [], version
    rows = c.execute(
        "DELETE FROM list_item WHERE list_id = ? AND idx >= ? RETURNING idx, item",
        (list_id, length - k),
    ).fetchall()
    rows.sort()
    removed = [r[1] for r in rows]
    left = length - k
    # The JSON of the list loses the items' bytes and one comma each (SPEC §2 size).
    new_size = 2 if left == 0 else size - sum(len(t.encode("utf-8")) for t in removed) - k
    c.execute(
        """UPDATE kv SET version = ?4, length = ?5, size = ?6, updated_at = ?7
           WHERE kind = ?1 AND scope_id = ?2 AND key = ?3""",
        (kind, sid, key, version + 1, left, new_size, now_iso()),
    )
    return removed, version + 1


def slice_items(
    c: apsw.Connection, kind: str, sid: str, key: str, start: int, stop: int | None
) -> list[str] | None:
    """Item texts of list[start:stop] in one statement; None when not a list."""
    rows = c.execute(
        """SELECT k.type, i.item FROM kv k
           LEFT JOIN list_item i ON i.list_id = k.list_id
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
    """Keys starting with ``prefix`` (a range scan of the primary key), ascending."""
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


def drop_scope(c: apsw.Connection, kind: str, sid: str) -> None:
    """Delete every key of a scope (and list items), remembering versions."""
    c.execute(
        """DELETE FROM list_item WHERE list_id IN
           (SELECT list_id FROM kv WHERE kind = ?1 AND scope_id = ?2 AND list_id IS NOT NULL)""",
        (kind, sid),
    )
    c.execute(
        """INSERT INTO kv_deleted (kind, scope_id, key, version)
           SELECT kind, scope_id, key, version + 1 FROM kv WHERE kind = ?1 AND scope_id = ?2
           ON CONFLICT DO UPDATE SET version = excluded.version""",
        (kind, sid),
    )
    c.execute("DELETE FROM kv WHERE kind = ?1 AND scope_id = ?2", (kind, sid))
