"""Repository of scoped keys on PostgreSQL: the functions of ``_kv``, same arguments, same rows.

A write of its own (outside ``transaction()``, not fenced) is first one prepared
statement that does it all (``lean.py``); what that leaves undone, and every write
inside a transaction, is one call of its server function (``kv_put``,
``kv_append``, ... in ``schema_postgres.sql``), which locks the key's row,
checks, writes and records its change; each read is one statement. A row whose ``expires_at``
has passed is absent to every reader (the WHERE clause says so) and expired
for good by the first writer that meets it, as on SQLite; a deleted key's row
stays as a tombstone (expires_at '-infinity', absent to every reader alike),
which keeps its version.

Inside a write transaction (``db.transaction()``, an ``update()`` retry) a
read of a key locks it until the transaction ends: on SQLite a transaction
holds the file's write lock, so what it read cannot change under it; here
the keys it read cannot. Each key is locked before it is read
(``kv_read_lock`` in ``schema_postgres.sql``: its row, whatever it holds, or a
tombstone inserted for a key that has none, which every writer that would
create the key waits for), the lock and the read in one round trip.

"Live" is judged by the read's own time, not by its transaction's start: a key
that expired during a long block is absent in it. Outside a write transaction
that is statement_timestamp(); inside one, the clock when the read starts
(``(SELECT clock_timestamp())``, evaluated once), since the read is sent with its
lock and statement_timestamp() is the time the two arrived, before any wait for
the lock: a key created under that lock and expired meanwhile would read as live.
"""

from __future__ import annotations

import heapq
import json
import math
import operator
from typing import Any

from ..base import KEEP, checked
from . import lean
from .statements import TXN, Conn, inline

Row = tuple[Any, ...]
_KEY = "kind = %(kind)s AND scope_id = %(sid)s AND key = %(key)s"
_LIVE = "(expires_at IS NULL OR expires_at > statement_timestamp())"
_LIVE_LOCKED = "(expires_at IS NULL OR expires_at > (SELECT clock_timestamp()))"
_READ_LOCK = "SELECT kv_read_lock(%s, %s, %s)"
_READ_LOCKS = "SELECT count(kv_read_lock(%s, %s, k)) FROM unnest(%s::text[]) AS k"  # in array order
# A list's items joined; a list made from another (a negative list_id: a fork's, a
# restore's, SPEC §17) reads them through its base (list_read).
_ITEMS = """CASE WHEN type = 'list' THEN
                CASE WHEN list_id > 0 THEN
                  (SELECT string_agg(item::text, ',' ORDER BY idx) FROM list_item WHERE list_id = kv.list_id)
                ELSE array_to_string(list_read(list_id, 0, length), ',') END
              END"""


def _lock(c: Conn, of: str = "") -> str:
    """The locking clause of a read: FOR UPDATE inside a write transaction."""
    return f" FOR UPDATE{of}" if c.mode is TXN else ""


def _live(c: Conn) -> str:
    """The read's test of a live row (see the module docstring)."""
    return _LIVE_LOCKED if c.mode is TXN else _LIVE


def _read(c: Conn, kind: str, sid: str, key: str, sql: str, params: Any) -> list[Row]:
    """The rows of one read of a key. Inside a write transaction the key is locked
    first (kv_read_lock: its row, or a tombstone's when it has none) and then
    read, in a snapshot taken after the lock's waits: what it read stays true until
    the transaction ends. Both statements go in one round trip."""
    if c.mode is not TXN:
        return c.execute(sql, params).fetchall()
    lock = inline(_READ_LOCK, (kind, sid, key))
    if lock is None:
        c.execute(_READ_LOCK, (kind, sid, key))
        return c.execute(sql, params).fetchall()
    return c.execute_after(lock, sql, params).fetchall()


def get(c: Conn, kind: str, sid: str, key: str) -> Row | None:
    """(type, value, version, joined list items) in one statement, or None."""
    rows = _read(
        c, kind, sid, key,
        f"""SELECT type, value::text, data, version, {_ITEMS}
            FROM kv WHERE {_KEY} AND {_live(c)}{_lock(c)}""",
        {"kind": kind, "sid": sid, "key": key})
    if not rows:
        return None
    type_, text, data, version, items = rows[0]
    return type_, data if type_ == "bytes" else text, version, items


_PUT = "SELECT kv_put(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
_PUT_BASED = "SELECT kv_put(%s, %s, %s, 'list', NULL, NULL, %s, NULL, NULL, NULL, false, %s, %s)"
_DELETE = "SELECT kv_delete(%s, %s, %s, %s)"
_APPEND = "SELECT o_length, o_version FROM kv_append(%s, %s, %s, %s, %s, %s)"


def _put_args(kind: str, sid: str, key: str, type_: str, value: Any, size: int,
              items: list[str] | None, if_version: int | None, ttl: Any = None) -> tuple[Any, ...]:
    keep = ttl == KEEP
    return (kind, sid, key, type_, None if type_ == "bytes" else value,
            value if type_ == "bytes" else None, size, items, if_version,
            None if keep else ttl, keep)


def _append_args(kind: str, sid: str, key: str, items: list[str], items_size: int,
                 ttl: Any = KEEP) -> tuple[Any, ...]:
    return (kind, sid, key, items, items_size, None if ttl == KEEP else ttl)


def put(c: Conn, kind: str, sid: str, key: str, type_: str, value: Any, size: int,
        items: list[str] | None, if_version: int | None, ttl: Any = None) -> int:
    """Write a value (``items`` for a list); return the new version.

    ``ttl``: seconds from now (the server's clock), None (never), or KEEP.
    """
    if items is None and c.alone:
        version = lean.put(c, kind, sid, key, type_, value, size, if_version, ttl)
        if version is not None:
            return version
    return c.execute(_PUT, _put_args(kind, sid, key, type_, value, size, items, if_version,
                                     ttl)).fetchone()[0]


def put_based(c: Conn, kind: str, sid: str, key: str, list_id: int, length: int,
              size: int) -> int:
    """Write a list made from another as it was (``history.based_list``'s id, SPEC §17: a
    restore's, a fork's), as a put of a list: no item is copied. The new version."""
    return c.execute(_PUT_BASED, (kind, sid, key, size, list_id, length)).fetchone()[0]


def delete(c: Conn, kind: str, sid: str, key: str, if_version: int | None) -> bool:
    """Remove a key (a tombstone; a list's items deleted); whether it existed."""
    if c.alone:
        done = lean.delete(c, kind, sid, key, if_version)
        if done is not None:
            return done
    return c.execute(_DELETE, (kind, sid, key, if_version)).fetchone()[0]


def append(c: Conn, kind: str, sid: str, key: str, items: list[str], items_size: int,
           ttl: Any = KEEP) -> tuple[int, int]:
    """Add items at the end of a list (created if absent); return (length, version)."""
    if items and c.alone:
        done = lean.append(c, kind, sid, key, items, items_size, ttl)
        if done is not None:
            return done
    return c.execute(_APPEND, _append_args(kind, sid, key, items, items_size, ttl)).fetchone()


# A batch's check: the key locked (as a read in a transaction locks it), then its version
# read in a snapshot taken after that lock's waits (FOR UPDATE: again, at no cost, on
# the row the first statement locked), refused on the server (so that the rest of its
# round trip is undone) unless it is the one expected. Two statements.
_CHECK_READ = ("SELECT v, CASE WHEN v <> %s THEN agentstate_error('VersionConflict', "
               "format('check %%s:%%s %%s: expected version %%s, the current version is %%s', "
               "%s::text, %s::text, %s::text, %s::bigint, v), v::text)::text END "
               "FROM (SELECT coalesce((SELECT version FROM kv WHERE kind = %s AND scope_id = %s "
               f"AND key = %s AND {_LIVE_LOCKED} FOR UPDATE), 0) AS v) AS found")
_CHECK = _READ_LOCK + "; " + _CHECK_READ


def _check_read_args(kind: str, sid: str, key: str, if_version: int) -> tuple[Any, ...]:
    return (if_version, kind, sid, key, if_version, kind, sid, key)


def _check_args(kind: str, sid: str, key: str, if_version: int) -> tuple[Any, ...]:
    return (kind, sid, key, *_check_read_args(kind, sid, key, if_version))


def _checked(cur: Any) -> int:
    cur.nextset()  # past the lock's result
    return cur.fetchone()[0]


def check(c: Conn, kind: str, sid: str, key: str, if_version: int) -> int:
    """A batch's check: ``VersionConflict`` unless the key is at ``if_version`` (0:
    absent); the key stays locked until the transaction ends. Its version."""
    c.execute(_READ_LOCK, (kind, sid, key))
    return c.execute(_CHECK_READ, _check_read_args(kind, sid, key, if_version)).fetchone()[0]


def check_many(c: Conn, ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]]
               ) -> list[int]:
    """A batch of checks only: outside a write transaction one statement that locks
    nothing (the batch writes nothing for them to protect); inside one, as a batch's
    checks (locked until it ends). The first that fails raises ``VersionConflict``."""
    if c.mode is TXN:
        return write_many(c, ops)
    return checked(ops, dict(c.execute(
        f"""SELECT u.ord, kv.version FROM unnest(%s::text[], %s::text[], %s::text[])
                   WITH ORDINALITY AS u(kind, sid, key, ord)
            JOIN kv ON kv.kind = u.kind AND kv.scope_id = u.sid AND kv.key = u.key AND {_LIVE}""",
        ([op[1] for op in ops], [op[2] for op in ops], [op[3] for op in ops])).fetchall()))


# A batch's ops: (statement, its arguments, its result from the cursor) by op.
_BATCHED: dict[str, tuple[str, Any, Any]] = {
    "check": (_CHECK, _check_args, _checked),
    "put": (_PUT, _put_args, lambda cur: cur.fetchone()[0]),
    "delete": (_DELETE, lambda kind, sid, key, if_version: (kind, sid, key, if_version),
               lambda cur: cur.fetchone()[0]),
    "append": (_APPEND, _append_args, lambda cur: cur.fetchone()),
}


def write_many(c: Conn, ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]]
               ) -> list[Any]:
    """A batch's ops (op, kind, sid, key, args, kwargs: put, delete, append, check), in
    order, as one transaction; each one's result. A batch of its own is one prepared
    statement when it can be (``lean.batch``); else, and inside a transaction, in one
    round trip (with the BEGIN and the COMMIT when the batch is a write of its own):
    the functions run one after another on the server, and the first refusal stops the
    rest and undoes them."""
    if c.alone and lean.batchable(ops):
        done = lean.batch(c, ops)
        if done is not None:
            return done
    calls = [(sql, make(kind, sid, key, *args, **kwargs), read)
             for (sql, make, read), (_op, kind, sid, key, args, kwargs)
             in ((_BATCHED[op[0]], op) for op in ops)]
    texts = [inline(sql, params) for sql, params, _read in calls]
    if None in texts:  # a parameter not written as a literal: a statement at a time,
        c.begin()  # in one transaction all the same
        return [check(c, op[1], op[2], op[3], **op[5]) if op[0] == "check"
                else read(c.execute(sql, params)) for op, (sql, params, read) in zip(ops, calls)]
    out: list[Any] = []
    if texts:
        cur = c.execute_all(texts)  # type: ignore[arg-type]
        for _sql, _params, read in calls:
            if out:
                cur.nextset()
            out.append(read(cur))
    return out


def pop(c: Conn, kind: str, sid: str, key: str, n: int) -> tuple[list[str], int]:
    """Remove the last ``n`` items of a list; return their texts in list order and the version."""
    items, version = c.execute("SELECT o_items, o_version FROM kv_pop(%s, %s, %s, %s)",
                               (kind, sid, key, n)).fetchone()
    return items, version


def touch(c: Conn, kind: str, sid: str, key: str, ttl: float | None) -> int | None:
    """Set a live key's expiry (None: never); its version, or None when absent."""
    return c.execute("SELECT kv_touch(%s, %s, %s, %s)", (kind, sid, key, ttl)).fetchone()[0]


def expires_at(c: Conn, kind: str, sid: str, key: str) -> tuple[float | None] | None:
    """(expires_at as unix time,) of a live key, or None when absent."""
    rows = _read(
        c, kind, sid, key,
        f"SELECT extract(epoch FROM expires_at)::float8 FROM kv WHERE {_KEY} AND {_live(c)}{_lock(c)}",
        {"kind": kind, "sid": sid, "key": key})
    return rows[0] if rows else None


def slice_items(c: Conn, kind: str, sid: str, key: str, start: int,
                stop: int | None) -> list[str] | None:
    """Item texts of list[start:stop] in one statement; None when not a list."""
    rows = _read(
        c, kind, sid, key,
        f"""SELECT k.type, i.item::text, k.list_id, k.length FROM kv k
           LEFT JOIN list_item i ON i.list_id = k.list_id
             AND i.idx >= (CASE WHEN %(start)s < 0 THEN k.length + %(start)s ELSE %(start)s END)
             AND i.idx < (CASE WHEN %(stop)s::bigint IS NULL THEN k.length
                               WHEN %(stop)s < 0 THEN k.length + %(stop)s ELSE %(stop)s END)
           WHERE k.kind = %(kind)s AND k.scope_id = %(sid)s AND k.key = %(key)s
             AND {_live(c)}
           ORDER BY i.idx{_lock(c, " OF k")}""",
        {"kind": kind, "sid": sid, "key": key, "start": start, "stop": stop})
    if not rows:
        return []
    if rows[0][0] != "list":
        return None
    if rows[0][2] < 0:  # made from another list: read through its base
        lo, hi, _ = slice(start, stop).indices(rows[0][3])
        return c.execute("SELECT list_read(%s, %s, %s)", (rows[0][2], lo, max(lo, hi))).fetchone()[0]
    return [r[1] for r in rows if r[1] is not None]


def length(c: Conn, kind: str, sid: str, key: str) -> int | None:
    """Items in a list, 0 when absent, None when the value is not a list."""
    rows = _read(c, kind, sid, key, f"SELECT type, length FROM kv WHERE {_KEY} AND {_live(c)}{_lock(c)}",
                 {"kind": kind, "sid": sid, "key": key})
    if not rows:
        return 0
    return rows[0][1] if rows[0][0] == "list" else None


def _range(prefix: str, after: str | None) -> tuple[str, str, str]:
    """The key range of a listing: (low bound, its operator, high bound, exclusive)."""
    lo = prefix if after is None or after < prefix else after
    # Keys are ASCII below DEL, so '\x7f' bounds them all; else the prefix's successor.
    hi = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else "\x7f"
    return lo, (">=" if after is None or after < prefix else ">"), hi


def keys(c: Conn, kind: str, sid: str, prefix: str, after: str | None,
         limit: int | None) -> list[str]:
    """Live keys starting with ``prefix`` (a range scan of the primary key), ascending."""
    lo, op, hi = _range(prefix, after)
    return [r[0] for r in c.execute(
        f"""SELECT key FROM kv WHERE kind = %(kind)s AND scope_id = %(sid)s AND key {op} %(lo)s
            AND key < %(hi)s AND {_LIVE} ORDER BY key LIMIT %(limit)s""",
        {"kind": kind, "sid": sid, "lo": lo, "hi": hi, "limit": limit}).fetchall()]


_MANY = f"""SELECT key, type, value::text, data, version, {_ITEMS}
            FROM kv WHERE kind = %(kind)s AND scope_id = %(sid)s AND {{where}} AND {{live}}
            ORDER BY key {{limit}}"""


def _rows(rows: list[Row]) -> list[Row]:
    return [(key, type_, data if type_ == "bytes" else text, version, items)
            for key, type_, text, data, version, items in rows]


def get_many(c: Conn, kind: str, sid: str, keys: list[str]) -> list[Row]:
    """(key, type, value, version, joined list items) of the live keys among ``keys``, in
    one statement, ascending. Inside a write transaction they lock as ``get`` does: the
    rows found, and a tombstone's for each key found absent (which is then read again)."""
    sql = _MANY.format(where="key = ANY(%(keys)s)", live=_live(c), limit=_lock(c, " OF kv"))
    params = {"kind": kind, "sid": sid, "keys": keys}
    if c.mode is not TXN:
        return _rows(c.execute(sql, params).fetchall())
    # Locked first, in key order (two transactions locking the same keys wait, not
    # deadlock), then read: as _read, one round trip for them all.
    lock = inline(_READ_LOCKS, (kind, sid, sorted(set(keys))))
    if lock is None:
        c.execute(_READ_LOCKS, (kind, sid, sorted(set(keys))))
        return _rows(c.execute(sql, params).fetchall())
    return _rows(c.execute_after(lock, sql, params).fetchall())


def items(c: Conn, kind: str, sid: str, prefix: str, after: str | None,
          limit: int | None) -> list[Row]:
    """(key, type, value, version, joined list items) of the live keys starting with
    ``prefix``, after ``after``, ascending: ``keys()`` with the values, in one statement."""
    lo, op, hi = _range(prefix, after)
    return _rows(c.execute(
        _MANY.format(where=f"key {op} %(lo)s AND key < %(hi)s", live=_live(c),
                     limit="LIMIT %(limit)s" + _lock(c, " OF kv")),
        {"kind": kind, "sid": sid, "lo": lo, "hi": hi, "limit": limit}).fetchall())


def clear(c: Conn, kind: str, sid: str) -> int:
    """Delete every key of the scope (a ``delete`` change each); how many were live."""
    return c.execute("SELECT kv_clear(%s, %s)", (kind, sid)).fetchone()[0]


# -- vectors (SPEC §19) ----------------------------------------------------------------
# A vector is a JSON array of its float32s (9 significant digits give each back
# exactly), which is also pgvector's text form. With the extension installed in the
# database, the server scores them (cast to its type; exact: no index over a kv row);
# without it they are read and scored here, exactly. Which one is decided when a store
# first searches (``vector_method``), not per call.

_VECTOR_SCHEMA = """SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
                    WHERE e.extname = 'vector'"""
_RANGES = """FROM unnest(%(lo)s::text[], %(hi)s::text[]) AS r(lo, hi)
             JOIN kv ON kv.kind = %(kind)s AND kv.scope_id = %(sid)s
                    AND kv.key >= r.lo COLLATE "C" AND kv.key < r.hi COLLATE "C"
             WHERE kv.type = 'json' AND {live}"""
_ARRAYS = f"SELECT kv.key, kv.value::text {_RANGES}"
# pgvector's operators: <=> the cosine distance (NaN for a zero vector), <-> the L2
# distance, <#> minus the inner product; each score as PostgresStore gives it.
_PGVECTOR = {"cosine": "coalesce(nullif(1 - ({v} OPERATOR({s}.<=>) {q}), 'NaN'), 0)",
             "l2": "-({v} OPERATOR({s}.<->) {q})",
             "inner_product": "-({v} OPERATOR({s}.<#>) {q})"}


def _similarity(metric: str, a: list[float], q: list[float], q_norm: float) -> float:
    """``a`` scored against ``q`` (of L2 norm ``q_norm``) by ``metric``, as base.METRICS says."""
    if metric == "l2":
        return -math.sqrt(sum((x - y) * (x - y) for x, y in zip(a, q)))
    dot = sum(map(operator.mul, a, q))
    if metric == "inner_product":
        return dot
    norm = math.sqrt(sum(map(operator.mul, a, a)))
    return dot / (norm * q_norm) if norm and q_norm else 0.0


def vector_method(c: Conn) -> str:
    """``pgvector:<its schema>`` when the extension is installed in the database, else
    ``exact``."""
    row = c.execute(_VECTOR_SCHEMA).fetchone()
    return "exact" if row is None else f"pgvector:{row[0]}"


def vector(values: list[float]) -> tuple[str, Any, int]:
    """A vector as stored: a JSON array of its float32s."""
    text = "[" + ",".join(format(v, ".9g") for v in values) + "]"
    return "json", text, len(text)


def nearest(c: Conn, kind: str, sid: str, ranges: list[tuple[str, str]], query: list[float],
            metric: str, limit: int, method: str) -> list[tuple[str, float]]:
    """(key, score) of the best ``limit`` vectors in the key ranges: one statement (every
    vector of the ranges is scored: exact, no approximate index)."""
    params = {"lo": [lo for lo, _ in ranges], "hi": [hi for _, hi in ranges], "kind": kind,
              "sid": sid, "dims": len(query), "limit": limit}
    if method.startswith("pgvector:"):
        schema = '"' + method[len("pgvector:"):].replace('"', '""') + '"'
        score = _PGVECTOR[metric].format(v=f"(kv.value::text)::{schema}.vector", s=schema,
                                         q=f"%(q)s::{schema}.vector")
        sql = (f"SELECT kv.key, {score} AS score {_RANGES.format(live=_live(c))} "
               "AND CASE WHEN json_typeof(kv.value) = 'array' THEN json_array_length(kv.value) END "
               "= %(dims)s ORDER BY score DESC, kv.key LIMIT %(limit)s")
        return c.execute(sql, {**params, "q": vector(query)[1]}).fetchall()
    q_norm = math.sqrt(sum(x * x for x in query))
    scored = []
    for key, text in c.execute(_ARRAYS.format(live=_live(c)), params):
        a = json.loads(text)
        if isinstance(a, list) and len(a) == len(query):
            scored.append((_similarity(metric, a, query, q_norm), key))
    return [(key, score) for score, key in heapq.nsmallest(limit, scored, key=lambda s: (-s[0], s[1]))]
