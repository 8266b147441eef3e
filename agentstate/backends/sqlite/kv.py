"""Repository of scoped keys: one function per logical operation.

Each function runs inside the caller's write transaction (``Store.write``) or
is a single read statement, so it sees and changes one consistent state.
Every write records its change (``feed.record``) in the same transaction.

Expiry: a row whose ``expires_at`` has passed is absent to every reader (each
read statement says so in its WHERE clause) and to every writer: a write that
meets one first expires it (``_settle``: the row goes, its version is kept in
kv_deleted, an 'expire' change is recorded), then goes on as for an absent key.
"""

from __future__ import annotations

import json
import math
import struct
import time
from collections.abc import Callable
from typing import Any

import apsw

from ..._encoding import MAX_VALUE
from ...errors import NotAList, TooLarge
from ..base import Conn, KEEP, checked, conflict, now_iso
from . import feed, history

Row = tuple[Any, ...]
_LIVE = "(expires_at IS NULL OR expires_at > :now)"

# A key's row as the writes read it (history.State: its last two for a before-image).
_FIND = """SELECT version, type, list_id, length, size, expires_at, value, updated_at FROM kv
           WHERE kind = ?1 AND scope_id = ?2 AND key = ?3"""
# The same, only when history is kept (the fast paths read it for their before-image).
_FIND_KEPT = _FIND + " AND " + history._ON
_NEXT_VERSION = ("1 + coalesce((SELECT version FROM kv_deleted WHERE kind = :kind AND scope_id = :sid "
                 "AND key = :key), 0)")
# The common put in one statement: create, or replace a live value that is not
# a list (a list's items need deleting first: that, expired rows, lists and a
# failed CAS take the slow path).
_UPSERT = f"""
INSERT INTO kv (kind, scope_id, key, version, type, value, list_id, length, size, updated_at, expires_at)
VALUES (:kind, :sid, :key, {_NEXT_VERSION}, :type, :value, NULL, NULL, :size, :stamp, :expires)
ON CONFLICT (kind, scope_id, key) DO UPDATE
SET version = kv.version + 1, type = excluded.type, value = excluded.value, size = excluded.size,
    updated_at = excluded.updated_at, expires_at = excluded.expires_at
WHERE kv.type <> 'list' AND (kv.expires_at IS NULL OR kv.expires_at > :now)
RETURNING version"""
# Compare-and-set in one statement each: create only if absent, replace only
# at the expected version (and not over a list, whose items need deleting).
_CREATE_IF_ABSENT = f"""
INSERT INTO kv (kind, scope_id, key, version, type, value, list_id, length, size, updated_at, expires_at)
VALUES (:kind, :sid, :key, {_NEXT_VERSION}, :type, :value, NULL, NULL, :size, :stamp, :expires)
ON CONFLICT (kind, scope_id, key) DO NOTHING
RETURNING version"""
_REPLACE_AT = f"""
UPDATE kv SET version = version + 1, type = :type, value = :value, size = :size, updated_at = :stamp,
              expires_at = iif(:keep, expires_at, :expires)
WHERE kind = :kind AND scope_id = :sid AND key = :key AND version = :if_version AND type <> 'list'
  AND {_LIVE}
RETURNING version"""
_CREATE = f"""
INSERT INTO kv (kind, scope_id, key, version, type, value, list_id, length, size, updated_at, expires_at)
VALUES (:kind, :sid, :key, {_NEXT_VERSION}, :type, :value, :list_id, :length, :size, :stamp, :expires)
RETURNING version"""
_REPLACE = """
UPDATE kv SET version = version + 1, type = :type, value = :value, list_id = :list_id,
              length = :length, size = :size, updated_at = :stamp,
              expires_at = iif(:keep, expires_at, :expires)
WHERE kind = :kind AND scope_id = :sid AND key = :key"""
_EXTEND = """UPDATE kv SET version = ?4, length = ?5, size = ?6, updated_at = ?7,
                             expires_at = iif(?8, expires_at, ?9)
              WHERE kind = ?1 AND scope_id = ?2 AND key = ?3"""
_NEW_LIST = "UPDATE list_seq SET last = last + 1 RETURNING last"
_ADD_ITEMS = "INSERT INTO list_item (list_id, idx, item) VALUES (?, ?, ?)"
_FORGET = """INSERT INTO kv_deleted (kind, scope_id, key, version) VALUES (?, ?, ?, ?)
             ON CONFLICT DO UPDATE SET version = excluded.version"""


def _remove(c: Conn, kind: str, sid: str, key: str, row: Row, op: str) -> None:
    """Delete a key's row (``row``: as _FIND reads it), remembering its version; record
    ``op``, keeping the row as what it removed (a list's items stay for it: SPEC §17)."""
    version, list_id = row[0], row[2]
    kept = history.on(c)
    if list_id is not None:
        history.release_list(c, list_id, kept)
    c.execute("DELETE FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3", (kind, sid, key))
    c.execute(_FORGET, (kind, sid, key, version + 1))
    seq = feed.record(c, "kv", op, kind, sid, key, version)
    if kept:
        history.keep(c, seq, row)


def _settle(c: Conn, kind: str, sid: str, key: str, now: float) -> Row | None:
    """The key's live row (version, type, list_id, length, size, expires_at, value,
    updated_at), or None; an expired row met here is expired for good first."""
    row = c.execute(_FIND, (kind, sid, key)).fetchone()
    if row is not None and row[5] is not None and row[5] <= now:
        _remove(c, kind, sid, key, row, "expire")
        return None
    return row


# Positional parameters: binding a tuple is ~0.3 µs cheaper than a dict of names
# (benchmarks/PYTHON-COST.md), and get is the hottest read.
# A list made from another (a negative list_id: history.based_list) reads its items
# through its base; every other list, here.
_GET = """SELECT type, value, version,
                 CASE type WHEN 'list' THEN
                   iif(list_id > 0, (SELECT group_concat(item, ',' ORDER BY idx) FROM list_item
                                     WHERE list_id = kv.list_id), -list_id)
                 END
          FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3
                    AND (expires_at IS NULL OR expires_at > ?4)"""


def _based(c: Conn, row: Row, at: int = 3) -> Row:
    """A row whose list is made from another (its items column holds -list_id) with its
    items read through the base."""
    if type(row[at]) is not int:
        return row
    list_id = -row[at]
    length = c.execute("SELECT length FROM kv WHERE list_id = ?", (list_id,)).fetchone()[0]
    return (*row[:at], ",".join(history.list_items(c, list_id, 0, length, None)), *row[at + 1:])


def get(c: Conn, kind: str, sid: str, key: str) -> Row | None:
    """(type, value, version, joined list items) in one statement, or None."""
    row = c.execute(_GET, (kind, sid, key, time.time())).fetchone()
    return row if row is None or row[0] != "list" else _based(c, row)


_MANY = """SELECT key, type, value, version,
                  CASE type WHEN 'list' THEN
                    iif(list_id > 0, (SELECT group_concat(item, ',' ORDER BY idx) FROM list_item
                                      WHERE list_id = kv.list_id), -list_id)
                  END
           FROM kv WHERE kind = ?1 AND scope_id = ?2 AND {where}
                     AND (expires_at IS NULL OR expires_at > ?4)
           ORDER BY key {limit}"""
# The same page with no list items: a page's correlated subquery costs ~6 µs even when no
# row is a list (benchmarks/ADAPTER-LANGGRAPH.md), and most pages have none.
_PAGE = """SELECT key, type, value, version, NULL
           FROM kv WHERE kind = ?1 AND scope_id = ?2 AND {where}
                     AND (expires_at IS NULL OR expires_at > ?4)
           ORDER BY key {limit}"""


def _both(where: str, limit: str = "") -> tuple[str, str]:
    return _PAGE.format(where=where, limit=limit), _MANY.format(where=where, limit=limit)


_BY_KEYS = _both("key IN (SELECT value FROM json_each(?3))")
_BY_RANGE = {op: _both(f"key {op} ?3 AND key < ?5", "LIMIT ?6") for op in (">=", ">")}


def _page(sql: tuple[str, str], c: Conn, args: tuple[Any, ...]) -> list[Row]:
    """The rows without list items; a page that holds a list is read again whole, in one
    statement, so its items are of the same snapshot as its rows."""
    rows = c.execute(sql[0], args).fetchall()
    if any(r[1] == "list" for r in rows):
        rows = [_based(c, r, 4) for r in c.execute(sql[1], args).fetchall()]
    return rows


def get_many(c: Conn, kind: str, sid: str, keys: list[str]) -> list[Row]:
    """(key, type, value, version, joined list items) of the live keys among ``keys``, in
    one statement (a probe of the primary key each), ascending."""
    return _page(_BY_KEYS, c, (kind, sid, json.dumps(keys), time.time()))


def items(c: Conn, kind: str, sid: str, prefix: str, after: str | None,
          limit: int | None) -> list[Row]:
    """(key, type, value, version, joined list items) of the live keys starting with
    ``prefix``, after ``after``, ascending: ``keys()`` with the values, in one statement."""
    lo, op, hi = _range(prefix, after)
    return _page(_BY_RANGE[op], c, (kind, sid, lo, time.time(), hi, -1 if limit is None else limit))


_VERSION = """SELECT version FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3
                AND (expires_at IS NULL OR expires_at > ?4)"""


def check(c: Conn, kind: str, sid: str, key: str, if_version: int) -> int:
    """A batch's check: ``VersionConflict`` unless the key is at ``if_version`` (0:
    absent), inside the caller's write transaction (which holds the file's write
    lock until it ends); its version."""
    row = c.execute(_VERSION, (kind, sid, key, time.time())).fetchone()
    current = row[0] if row else 0
    if current != if_version:
        raise conflict(f"check {kind}:{sid} {key}", if_version, current)
    return current


# The live versions of a batch's keys, by position from 1: one statement, so one state.
_VERSIONS = """SELECT j.key + 1, kv.version FROM json_each(?1) AS j
               JOIN kv ON kv.kind = json_extract(j.value, '$[0]')
                      AND kv.scope_id = json_extract(j.value, '$[1]')
                      AND kv.key = json_extract(j.value, '$[2]')
                      AND (kv.expires_at IS NULL OR kv.expires_at > ?2)"""


def check_many(c: Conn, ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]]
               ) -> list[int]:
    """A batch of checks only, in one statement; the first that fails raises."""
    keys = json.dumps([[kind, sid, key] for _op, kind, sid, key, _args, _kw in ops])
    return checked(ops, dict(c.execute(_VERSIONS, (keys, time.time())).fetchall()))


def write_many(c: Conn, ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]]
               ) -> list[Any]:
    """A batch's ops (op, kind, sid, key, args, kwargs: put, delete, append, check), in
    order, inside the caller's transaction; each one's result."""
    calls: dict[str, Callable[..., Any]] = {"put": put, "delete": delete, "append": append,
                                            "check": check}
    return [calls[op](c, kind, sid, key, *args, **kwargs) for op, kind, sid, key, args, kwargs in ops]


def clear(c: Conn, kind: str, sid: str) -> int:
    """Delete every key of the scope (a ``delete`` change each); how many were live."""
    live = c.execute("SELECT count(*) FROM kv WHERE kind = ?1 AND scope_id = ?2 AND "
                     "(expires_at IS NULL OR expires_at > ?3)", (kind, sid, time.time())).get
    drop_scope(c, kind, sid)
    return live


def _add_items(c: Conn, list_id: int, start: int, items: list[str]) -> None:
    if len(items) == 1:  # the common append: one execute costs less than executemany's setup
        c.execute(_ADD_ITEMS, (list_id, start, items[0]))
    elif items:
        c.executemany(_ADD_ITEMS, [(list_id, start + i, t) for i, t in enumerate(items)])


def put(
    c: Conn,
    kind: str,
    sid: str,
    key: str,
    type_: str,
    value: Any,
    size: int,
    items: list[str] | None,
    if_version: int | None,
    ttl: Any = None,
) -> int:
    """Write a value (``items`` for a list); return the new version.

    ``ttl``: seconds from now (the store's clock), None (never), or KEEP (the
    key's current expiry).
    """
    return _put(c, kind, sid, key, type_, value, size, items, if_version, ttl, None)


def _put(c: Conn, kind: str, sid: str, key: str, type_: str, value: Any, size: int,
         items: list[str] | None, if_version: int | None, ttl: Any,
         based: tuple[int, int] | None) -> int:
    """``put``; ``based``: (list_id, length) of a list made from another (``put_based``),
    instead of ``items``."""
    now = time.time()
    keep = ttl == KEEP
    expires = None if keep or ttl is None else now + ttl
    args = {"kind": kind, "sid": sid, "key": key, "type": type_, "value": value, "size": size,
            "stamp": now_iso(), "now": now, "keep": keep, "expires": None if keep else expires}
    if items is None:  # one statement, unless a list or an expired row is replaced or CAS failed
        # what it replaces, when history is kept (a row the statement below may not take)
        old = c.execute(_FIND_KEPT, (kind, sid, key)).fetchone()
        if if_version is None and not keep:
            done = c.execute(_UPSERT, args).fetchone()
        elif if_version == 0:
            done = c.execute(_CREATE_IF_ABSENT, args).fetchone()
        elif if_version is not None:
            done = c.execute(_REPLACE_AT, {**args, "if_version": if_version}).fetchone()
        else:
            done = None
        if done is not None:
            seq = feed.record(c, "kv", "put", kind, sid, key, done[0], at=args["stamp"])
            history.keep(c, seq, old)
            return done[0]
    row = _settle(c, kind, sid, key, now)
    current = row[0] if row else 0
    if if_version is not None and if_version != current:
        raise conflict(f"put {kind}:{sid} {key}", if_version, current)
    kept = row is not None and history.on(c)
    if row is not None and row[2] is not None:  # a list replaced: its items go, or stay for
        history.release_list(c, row[2], kept)  # what it was (and a new value is another list)
    if items is None:
        list_id = length = None
    elif based is not None:
        list_id, length = based
    else:
        length = len(items)
        list_id = c.execute(_NEW_LIST).fetchone()[0]
        _add_items(c, list_id, 0, items)
    args.update(list_id=list_id, length=length)
    if row is None:
        version = c.execute(_CREATE, args).fetchone()[0]
    else:
        c.execute(_REPLACE, args)
        version = current + 1
    start, count = (0, length) if items is not None else (None, None)
    seq = feed.record(c, "kv", "put", kind, sid, key, version, start, count, at=args["stamp"])
    if kept:
        history.keep(c, seq, row)
    return version


def put_based(c: Conn, kind: str, sid: str, key: str, list_id: int, length: int,
              size: int) -> int:
    """Write a list made from another as it was (``history.based_list``'s id, SPEC §17: a
    restore's, a fork's), as a put of a list: no item is copied. The new version."""
    return _put(c, kind, sid, key, "list", None, size, [], None, None, (list_id, length))


def delete(c: Conn, kind: str, sid: str, key: str, if_version: int | None) -> bool:
    """Remove a key (and a list's items), remembering its version; whether it existed."""
    row = _settle(c, kind, sid, key, time.time())
    current = row[0] if row else 0
    if if_version is not None and if_version != current:
        raise conflict(f"delete {kind}:{sid} {key}", if_version, current)
    if row is None:
        return False
    _remove(c, kind, sid, key, row, "delete")
    return True


def append(
    c: Conn, kind: str, sid: str, key: str, items: list[str], items_size: int,
    ttl: Any = KEEP,
) -> tuple[int, int]:
    """Add items at the end of a list (created if absent); return (length, version).

    ``ttl``: seconds from now, or KEEP (the key's expiry; none for a new list).
    """
    now = time.time()
    keep = ttl == KEEP
    expires = None if keep else now + ttl
    row = _settle(c, kind, sid, key, now)
    n = len(items)
    if row is None:
        length, size = 0, 2
    else:
        if row[1] != "list":
            raise NotAList(f"{kind}:{sid} {key} holds a {row[1]} value, not a list")
        length, size = row[3], row[4]
        if n == 0:  # nothing to add: only a new expiry, if one was asked for
            if ttl != KEEP:
                touch(c, kind, sid, key, ttl)
            return length, row[0]
    # items_size is the JSON of [items]; joining two lists drops one pair of
    # brackets and adds a comma when both are non-empty.
    new_size = size + items_size - 2 + (1 if length and n else 0)
    if new_size > MAX_VALUE:
        raise TooLarge(
            f"the list would be {new_size} bytes, over the limit of {MAX_VALUE}", new_size, MAX_VALUE
        )
    stamp = now_iso()
    if row is None:
        list_id = c.execute(_NEW_LIST).fetchone()[0]
        version = c.execute(_CREATE, {
            "kind": kind, "sid": sid, "key": key, "type": "list", "value": None, "list_id": list_id,
            "length": n, "size": new_size, "stamp": stamp,
            "expires": expires}).fetchone()[0]
    else:
        list_id, version = row[2], row[0] + 1
        c.execute(_EXTEND, (kind, sid, key, version, length + n, new_size, stamp, keep, expires))
    _add_items(c, list_id, length, items)
    seq = feed.record(c, "kv", "append", kind, sid, key, version, length, n, at=stamp)
    history.keep(c, seq, row, if_on=True)  # the list as it was: its list and length
    return length + n, version


def pop(c: Conn, kind: str, sid: str, key: str, n: int) -> tuple[list[str], int]:
    """Remove the last ``n`` items of a list; return their texts in list order and the version."""
    row = _settle(c, kind, sid, key, time.time())
    if row is None:
        return [], 0
    version, type_, list_id, length, size = row[:5]
    if type_ != "list":
        raise NotAList(f"{kind}:{sid} {key} holds a {type_} value, not a list")
    k = min(n, length)
    if k == 0:
        return [], version
    left = length - k
    removed = history.list_items(c, list_id, left, length, None)
    # The JSON of the list loses the items' bytes and one comma each (SPEC §2 size).
    new_size = 2 if left == 0 else size - sum(len(t.encode("utf-8")) for t in removed) - k
    stamp = now_iso()
    c.execute(
        """UPDATE kv SET version = ?4, length = ?5, size = ?6, updated_at = ?7
           WHERE kind = ?1 AND scope_id = ?2 AND key = ?3""",
        (kind, sid, key, version + 1, left, new_size, stamp),
    )
    seq = feed.record(c, "kv", "pop", kind, sid, key, version + 1, left, k, at=stamp)
    kept = history.on(c)
    history.pop_items(c, list_id, left, removed, seq, kept)
    if kept:
        history.keep(c, seq, row)
    return removed, version + 1


def touch(c: Conn, kind: str, sid: str, key: str, ttl: float | None) -> int | None:
    """Set a live key's expiry ``ttl`` seconds from now (None: never), value and version
    unchanged; its version, or None when absent."""
    now = time.time()
    old = c.execute(_FIND_KEPT, (kind, sid, key)).fetchone()  # its expiry as it was (history)
    row = c.execute(
        f"""UPDATE kv SET expires_at = :expires
            WHERE kind = :kind AND scope_id = :sid AND key = :key AND {_LIVE}
            RETURNING version""",
        {"kind": kind, "sid": sid, "key": key, "now": now,
         "expires": None if ttl is None else now + ttl},
    ).fetchone()
    if row is None:
        return None
    history.keep(c, feed.record(c, "kv", "touch", kind, sid, key, row[0]), old)
    return row[0]


def expires_at(c: Conn, kind: str, sid: str, key: str) -> tuple[float | None] | None:
    """(expires_at,) of a live key, or None when absent."""
    return c.execute(
        f"SELECT expires_at FROM kv WHERE kind = :kind AND scope_id = :sid AND key = :key AND {_LIVE}",
        {"kind": kind, "sid": sid, "key": key, "now": time.time()},
    ).fetchone()


def slice_items(
    c: Conn, kind: str, sid: str, key: str, start: int, stop: int | None
) -> list[str] | None:
    """Item texts of list[start:stop] in one statement; None when not a list."""
    rows = c.execute(
        """SELECT k.type, i.item, k.list_id, k.length FROM kv k
           LEFT JOIN list_item i ON i.list_id = k.list_id
             AND i.idx >= (CASE WHEN ?4 < 0 THEN k.length + ?4 ELSE ?4 END)
             AND i.idx < (CASE WHEN ?5 IS NULL THEN k.length
                               WHEN ?5 < 0 THEN k.length + ?5 ELSE ?5 END)
           WHERE k.kind = ?1 AND k.scope_id = ?2 AND k.key = ?3
             AND (k.expires_at IS NULL OR k.expires_at > ?6)
           ORDER BY i.idx""",
        (kind, sid, key, start, stop, time.time()),
    ).fetchall()
    if not rows:
        return []
    if rows[0][0] != "list":
        return None
    if rows[0][2] < 0:  # made from another list: read through its base
        a, b, _ = slice(start, stop).indices(rows[0][3])
        return history.list_items(c, rows[0][2], a, b, None)
    return [r[1] for r in rows if r[1] is not None]


def length(c: Conn, kind: str, sid: str, key: str) -> int | None:
    """Items in a list, 0 when absent, None when the value is not a list."""
    row = c.execute(
        f"SELECT type, length FROM kv WHERE kind = :kind AND scope_id = :sid AND key = :key AND {_LIVE}",
        {"kind": kind, "sid": sid, "key": key, "now": time.time()},
    ).fetchone()
    if row is None:
        return 0
    return row[1] if row[0] == "list" else None


def keys(
    c: Conn, kind: str, sid: str, prefix: str, after: str | None, limit: int | None
) -> list[str]:
    """Live keys starting with ``prefix`` (a range scan of the primary key), ascending."""
    lo, op, hi = _range(prefix, after)
    return [
        r[0]
        for r in c.execute(_KEYS[op], (kind, sid, lo, time.time(), hi, -1 if limit is None else limit))
    ]


# By position, made once: a listing is as hot as a read (an adapter's search runs three).
_KEYS = {op: f"""SELECT key FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key {op} ?3
                     AND key < ?5 AND (expires_at IS NULL OR expires_at > ?4) ORDER BY key LIMIT ?6"""
         for op in (">=", ">")}


def _range(prefix: str, after: str | None) -> tuple[str, str, str]:
    """The key range of a listing: (low bound, its operator, high bound, exclusive)."""
    lo = prefix if after is None or after < prefix else after
    # Keys are ASCII below DEL, so '\x7f' bounds them all; else the prefix's successor.
    hi = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\x7f"
    return lo, (">=" if after is None or after < prefix else ">"), hi


def drop_scope(c: Conn, kind: str, sid: str) -> None:
    """Delete every key of a scope (and list items), remembering versions; a change each."""
    now = time.time()
    for key, *row in c.execute(
        "SELECT key, version, type, list_id, length, size, expires_at, value, updated_at "
        "FROM kv WHERE kind = ?1 AND scope_id = ?2", (kind, sid),
    ).fetchall():
        _remove(c, kind, sid, key, tuple(row),
                "expire" if row[5] is not None and row[5] <= now else "delete")


def purge_expired(c: Conn, now: float, batch: int) -> int:
    """Expire up to ``batch`` keys whose time has come, soonest first; how many."""
    # The batch as a literal: with LIMIT ? this statement took ~8 us instead of ~3.5
    # (benchmarks/PYTHON-COST.md), and it runs in every housekeeping step.
    rows = c.execute(
        f"""SELECT kind, scope_id, key, version, type, list_id, length, size, expires_at, value,
                   updated_at FROM kv
            WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at
            LIMIT {int(batch)}""",
        (now,),
    ).fetchall()
    for kind, sid, key, *row in rows:
        _remove(c, kind, sid, key, tuple(row), "expire")
    return len(rows)


# -- vectors (SPEC §19) ----------------------------------------------------------------
# A vector is a bytes value of float32s, which sqlite-vec's functions read as they are
# (JSON text would be parsed again for every row of every search: ~20x slower). The
# extension is loaded into a connection the first time that connection searches, so
# nothing else ever needs it: the file stays plain tables, readable without it.

# CROSS JOIN keeps the ranges the outer loop, each a range of the primary key (joined the
# other way, SQLite reads the whole scope and tries every range on every row).
_NEAREST = """SELECT kv.key, {score} AS score FROM json_each(:ranges) AS r
              CROSS JOIN kv ON kv.kind = :kind AND kv.scope_id = :sid
                     AND kv.key >= r.value ->> 0 AND kv.key < r.value ->> 1
              WHERE kv.type = 'bytes' AND length(kv.value) = :size
                AND (kv.expires_at IS NULL OR kv.expires_at > :now)
              ORDER BY score DESC, kv.key LIMIT :limit"""
_COSINE = "coalesce(1.0 - vec_distance_cosine(kv.value, :q), 0.0)"  # NULL for a zero vector
_SCORES = {
    "cosine": _NEAREST.format(score=_COSINE),
    "l2": _NEAREST.format(score="-vec_distance_l2(kv.value, :q)"),
    # sqlite-vec has no inner product: the cosine times both norms (|a| is a's distance to 0)
    "inner_product": _NEAREST.format(score=f"{_COSINE} * vec_distance_l2(kv.value, :zero) * :q_norm"),
}


def _load_vec(c: Conn) -> None:
    try:
        import sqlite_vec
    except ImportError:
        raise ImportError("vector search on a file needs sqlite-vec: "
                          "pip install 'agentstate-db[vec]'") from None
    c.enable_load_extension(True)
    try:
        c.load_extension(sqlite_vec.loadable_path())
    finally:
        c.enable_load_extension(False)  # no load_extension() for SQL run later (db.sql)


def vector_method(c: Conn) -> str:
    """``sqlite-vec``, once it loads here.

    :raises ImportError: sqlite-vec is not installed.
    """
    _load_vec(c)
    return "sqlite-vec"


def vector(values: list[float]) -> tuple[str, Any, int]:
    """A vector as stored: its float32s, little-endian, as a bytes value."""
    data = struct.pack(f"<{len(values)}f", *values)
    return "bytes", data, len(data)


def nearest(c: Conn, kind: str, sid: str, ranges: list[tuple[str, str]], query: list[float],
            metric: str, limit: int, method: str) -> list[tuple[str, float]]:
    """(key, score) of the best ``limit`` vectors in the key ranges, in one statement
    (every vector of the ranges is scored: exact, no approximate index)."""
    args = {"ranges": json.dumps(ranges), "kind": kind, "sid": sid, "size": 4 * len(query),
            "now": time.time(), "limit": limit, "q": vector(query)[1],
            "zero": bytes(4 * len(query)), "q_norm": math.sqrt(sum(x * x for x in query))}
    sql = _SCORES[metric]
    try:
        return c.execute(sql, args).fetchall()
    except apsw.SQLError as e:
        if "no such function: vec_" not in str(e):
            raise
    _load_vec(c)  # this connection's first search
    return c.execute(sql, args).fetchall()
