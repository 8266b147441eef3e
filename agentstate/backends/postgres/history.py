"""Repository of value history (SPEC §17) on PostgreSQL: before-images, the past, lists as they were.

Every kv change made while history is on gets an id, taken under the key's row lock
(so a key's ids follow the order of its changes), and the state it replaced is kept
under that id (``kv_history``) in the write's own statement (lean.py) or function
(``kv_keep`` in ``schema_postgres.sql``). Changes are numbered later, by the feed's
readers (``feed_number`` copies the id), so the past is found through the feed: the
state of a key right after change S is the before-image of its first change after S
(by seq, or among the committed changes not numbered yet, which all come after it),
or its row now when it has not changed since. A change without an id was made while
history was off: what it replaced is unknown, and so is the past before it
(CursorExpired). Lists are never copied: popped items go to ``list_gone`` under the
pop's id; a list made from another (``list_base``) reads its base, which copies what a
pop removes into it first. The purge runs in ``feed_purge_step`` (``history_purge``).
"""

from __future__ import annotations

from typing import Any

from ...errors import CursorExpired, Damaged
from ..base import Filters
from ..grants import Readable
from .feed import GRANTS
from .statements import AUTO, READ, SEQUENCE, Conn

Row = tuple[Any, ...]
State = tuple[Any, ...]

# A state as past.py reads it: version, type, list_id, length, size, expires_at (unix
# time), value (JSON text, or the bytes), updated_at (ISO).
_STATE = ("{t}.version, {t}.type, {t}.list_id, {t}.length, {t}.size, "
          "extract(epoch FROM {t}.expires_at)::float8, {t}.value::text, {t}.data, iso_utc({t}.updated_at)")
_KEY = "kind = %(kind)s AND scope_id = %(sid)s AND key = %(key)s"

# The key's first change after a seq, numbered or not (every committed change not
# numbered yet comes after every numbered one), with what it replaced; else the key's
# row now. One statement: one snapshot, inside a write transaction too.
_AT = f"""
WITH first AS MATERIALIZED (
    (SELECT 0 AS later, seq AS o1, 0::int8 AS o2, id FROM change
     WHERE topic = 'kv' AND {_KEY} AND seq > %(seq)s ORDER BY seq LIMIT 1)
    UNION ALL
    (SELECT 1, ticket, ord, id FROM change_new
     WHERE xid >= (SELECT fence FROM feed_head) AND topic = 'kv' AND {_KEY}
     ORDER BY ticket NULLS LAST, ord LIMIT 1)
    ORDER BY later, o1, o2 LIMIT 1)
SELECT 'then', f.id IS NOT NULL, h.change_id IS NOT NULL, {_STATE.format(t="h")}
FROM first f LEFT JOIN kv_history h ON h.change_id = f.id
UNION ALL
SELECT 'now', true, true, {_STATE.format(t="k")}
FROM kv k WHERE {_KEY} AND k.expires_at IS DISTINCT FROM '-infinity' AND NOT EXISTS (SELECT FROM first)"""


# -- the past --------------------------------------------------------------------------------

def _first(c: Conn) -> None:
    """Before a read of the past: inside a write (a restore, a fork), one transaction from
    here on (what it writes depends on what it read); a read of its own, the committed
    changes numbered first, as the feed's reads do."""
    if c.mode is AUTO and not c.ran:
        c.begin()
    elif c.mode is READ and not c.open:
        c.pending[:0] = SEQUENCE


def on(c: Conn) -> bool:
    """Whether writes keep what they replace: history and the feed are both on."""
    _first(c)
    return c.execute("SELECT history_on()").fetchone()[0]


def floor(c: Conn) -> int:
    """The oldest seq the past is known right after. (A read's first statement: the
    committed changes are numbered first, as the feed's reads do.)"""
    _first(c)
    return c.execute("SELECT floor FROM history_head").fetchone()[0]


def moment(c: Conn, seq: int) -> float | None:
    """When change ``seq`` was written (unix time): what "had expired by then" means."""
    _first(c)
    row = c.execute("SELECT extract(epoch FROM at)::float8 FROM change WHERE seq = %s",
                    (seq,)).fetchone()
    return None if row is None else row[0]


def state_at(c: Conn, kind: str, sid: str, key: str, seq: int, when: float | None) -> State | None:
    """The key's state right after change ``seq`` (``when``: that change's time), or None
    when it was absent (not yet made, deleted, or expired by then).

    :raises CursorExpired: the change after ``seq`` was made while history was off.
    """
    _first(c)
    row = c.execute(_AT, {"kind": kind, "sid": sid, "key": key, "seq": seq}).fetchone()
    if row is None:
        return None
    _where, known, kept, *state = row
    if state[1] == "bytes":
        state[6] = state[7]
    del state[7]
    if not known:
        raise CursorExpired(f"what {kind}:{sid} {key} held right after change {seq} is unknown: "
                            "its next change was made while history was off")
    if not kept:
        return None  # its next change created it
    if state[5] is not None and when is not None and state[5] <= when:
        return None  # expired by then
    return tuple(state)


def present(c: Conn, kind: str, sid: str) -> list[tuple[str, State]]:
    """The scope's live keys now with their states, by key (a fork of the present)."""
    _first(c)
    rows = c.execute(f"SELECT key, {_STATE.format(t='kv')} FROM kv WHERE kind = %s AND scope_id = %s "
                     "AND (expires_at IS NULL OR expires_at > statement_timestamp()) ORDER BY key",
                     (kind, sid)).fetchall()
    return [(key, (*state[:6], state[7] if state[1] == "bytes" else state[6], state[8]))
            for key, *state in rows]


def list_items(c: Conn, list_id: int, start: int, stop: int, seq: int | None) -> list[str]:
    """The item texts of ``list_id`` at indexes start..stop-1 as they were right after
    change ``seq`` (None: now): at each index the item the first pop after ``seq``
    removed from it, else the list's own item, else its base's (list_read). One
    statement."""
    _first(c)
    if stop <= start:
        return []
    if seq is None:
        items = c.execute("SELECT list_read(%s, %s, %s)", (list_id, start, stop)).fetchone()[0]
    else:
        items = [r[0] for r in c.execute(
            """SELECT item FROM (
                   SELECT DISTINCT ON (idx) idx, item FROM (
                       SELECT g.idx, g.item::text AS item, 0 AS src, g.change_id AS o FROM list_gone g
                       WHERE g.list_id = %(list)s AND g.idx >= %(start)s AND g.idx < %(stop)s
                         AND NOT EXISTS (SELECT FROM change c WHERE c.id = g.change_id AND c.seq <= %(seq)s)
                       UNION ALL
                       SELECT r.idx, r.item, 1, 0 FROM list_rows(%(list)s, %(start)s, %(stop)s) r
                   ) x ORDER BY idx, src, o) y ORDER BY idx""",
            {"list": list_id, "start": start, "stop": stop, "seq": seq}).fetchall()]
    if len(items) != stop - start:
        raise Damaged(f"list {list_id}: of items {start}..{stop - 1}, {len(items)} are there")
    return items


def _range(lo: str | None, hi: str | None) -> tuple[str, dict[str, str]]:
    """A key range's condition: from ``lo`` (a key followed by NUL, which text cannot hold
    here: above that key) up to ``hi``, exclusive."""
    lo = lo or ""
    op = ">" if lo.endswith("\x00") else ">="
    return f"key {op} %(lo)s AND key < %(hi)s", {"lo": lo.rstrip("\x00"), "hi": hi or "\x7f"}


def changed_keys(c: Conn, kind: str, sid: str, since: int, lo: str | None = None,
                 hi: str | None = None) -> list[str]:
    """The keys of a scope (between lo and hi, exclusive of hi) with a change after
    ``since``, numbered or not."""
    _first(c)
    keys, bounds = _range(lo, hi)
    return [r[0] for r in c.execute(
        f"""SELECT key FROM change WHERE topic = 'kv' AND kind = %(kind)s AND scope_id = %(sid)s
                   AND seq > %(since)s AND {keys}
            UNION
            SELECT key FROM change_new WHERE xid >= (SELECT fence FROM feed_head) AND topic = 'kv'
                   AND kind = %(kind)s AND scope_id = %(sid)s AND {keys}""",
        {"kind": kind, "sid": sid, "since": since, **bounds}).fetchall()]


def scope_keys(c: Conn, kind: str, sid: str, lo: str | None = None,
               hi: str | None = None) -> list[str]:
    """Every key of a scope with a value now (expired ones too: they may have been live
    then; tombstones are not: a deleted key's delete is a change)."""
    _first(c)
    keys, bounds = _range(lo, hi)
    return [r[0] for r in c.execute(
        f"SELECT key FROM kv WHERE kind = %(kind)s AND scope_id = %(sid)s AND {keys} "
        "AND expires_at IS DISTINCT FROM '-infinity'", {"kind": kind, "sid": sid, **bounds}).fetchall()]


def revisions(c: Conn, kind: str, sid: str, key: str, since: int, before: int | None,
              limit: int | None) -> list[Row]:
    """The key's numbered changes after ``since`` and before ``before``, newest first:
    (seq, op, version, at)."""
    _first(c)
    return c.execute(
        f"""SELECT seq, op, version, iso_utc(at) FROM change
            WHERE topic = 'kv' AND {_KEY} AND seq > %(since)s AND seq < %(before)s
            ORDER BY seq DESC LIMIT %(limit)s""",
        {"kind": kind, "sid": sid, "key": key, "since": since,
         "before": 2**63 - 1 if before is None else before, "limit": limit}).fetchall()


def changed(c: Conn, since: int, until: int, flt: Filters, readable: Readable | None = None,
            after: tuple[str, str, str] | None = None, limit: int | None = None,
            window: tuple[float | None, float] | None = None) -> list[Row]:
    """The keys with a change after ``since`` up to ``until``, by kind, scope id, key:
    those after ``after``, at most ``limit``; with ``readable``, only those its owner may
    read (the feed's filter, in the same query). ``window`` (the times of since and
    until): also the keys that expired in between with no change in the span (the
    change that records an expiry comes when something meets the key: not yet, or later)."""
    _first(c)
    params: dict[str, Any] = {"since": since, "until": until, **flt, "limit": limit}
    where = "".join(f" AND {col} = %({col})s" for col in flt)
    if readable is not None:
        where += " AND " + GRANTS.readable_sql(readable, params)
    if after is not None:
        params.update(ak=after[0], asid=after[1], akey=after[2])
        where += " AND (kind, scope_id, key) > (%(ak)s, %(asid)s, %(akey)s)"
    source = "SELECT topic, kind, scope_id, key FROM change WHERE topic = 'kv' AND seq > %(since)s " \
             "AND seq <= %(until)s"
    if window is not None:
        params.update(t0=window[0], t1=window[1])
        source += f""" UNION ALL {_EXPIRED_NOW} UNION ALL
            SELECT c.topic, c.kind, c.scope_id, c.key FROM change c JOIN kv_history h ON h.change_id = c.id
            WHERE c.topic = 'kv' AND c.op = 'expire' AND c.seq > %(until)s
              AND h.expires_at > {_T0} AND h.expires_at <= to_timestamp(%(t1)s)"""
    return c.execute(
        f"SELECT DISTINCT kind, scope_id, key FROM ({source}) found WHERE true{where} "
        "ORDER BY kind, scope_id, key LIMIT %(limit)s", params).fetchall()


_T0 = "coalesce(to_timestamp(%(t0)s::float8), '-infinity')"
# Rows that expired after t0 and by t1 and are still there (no change records it yet;
# tombstones, at '-infinity', are never after t0).
_EXPIRED_NOW = ("SELECT 'kv' AS topic, kind, scope_id, key FROM kv "
                f"WHERE expires_at > {_T0} AND expires_at <= to_timestamp(%(t1)s)")


def expired_keys(c: Conn, kind: str, sid: str, after: float | None, upto: float) -> list[str]:
    """The keys of a scope whose row expired after ``after`` (None: ever) and by ``upto``
    with no change recording it yet."""
    _first(c)
    return [r[3] for r in c.execute(
        _EXPIRED_NOW + " AND kind = %(kind)s AND scope_id = %(sid)s",
        {"t0": after, "t1": upto, "kind": kind, "sid": sid}).fetchall()]


# -- writes ----------------------------------------------------------------------------------

def based_list(c: Conn, base_id: int, base_len: int, base_seq: int | None) -> int:
    """A new list that reads ``base_id`` as it was right after change ``base_seq`` (None:
    as it is now), below ``base_len`` (a fork's or a restore's); its (negative) id."""
    _first(c)
    return c.execute("SELECT list_based(%s, %s, %s)", (base_id, base_len, base_seq)).fetchone()[0]


def restart(c: Conn, unseen: bool) -> None:
    """History (re)starts now: the past is known from right after the newest numbered
    change on; ``unseen`` (the feed was off: writes got no seq, so what that change left
    may have changed since), only from the next change on. (A change not numbered yet
    made while history was off has no id: state_at refuses it.)"""
    _first(c)
    c.execute("UPDATE history_head SET floor = greatest(floor, (SELECT last FROM feed_head) + %s)",
              (int(unseen),))


__all__ = ["on", "floor", "moment", "state_at", "list_items", "changed_keys", "scope_keys",
           "revisions", "changed", "expired_keys", "based_list", "restart", "present"]
