"""Repository of value history (SPEC §17) on a file: before-images, the past, lists as they were.

Every change of a key keeps the state it replaced (its before-image: ``kv_history``,
keyed by the change's seq) in the write's own transaction, while history is on. The
state of a key right after change S is the before-image of its first change after S,
or, if it has not changed since, its row in ``kv``; a change with no before-image
created the key (it was absent). Lists are never copied: a before-image names its list
and length, and popped items move to ``list_gone`` (by the pop's seq). A list made from
another (a fork's, a restore's: ``list_base``) reads its base below its base length;
a pop of the base first copies what it removes into each such list, so their items
never change under them. The purge (``purge_step``) drops before-images and popped
items past the retention, and empties lists nothing refers to any more, a bounded
amount per write.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from ...errors import Damaged
from ..base import Conn, Filters
from ..grants import Readable
from .feed import GRANTS

Row = tuple[Any, ...]
# A key's state as the write paths read it (kv.py's _FIND): version, type, list_id,
# length, size, expires_at, value, updated_at.
State = tuple[Any, ...]

_ON = ("NOT EXISTS (SELECT 1 FROM setting WHERE name IN ('history_retention', 'feed_retention') "
       "AND value = 0)")
_KEEP = """INSERT INTO kv_history (seq, version, type, value, list_id, length, size, updated_at,
                                   expires_at)
           VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"""
_KEEP_IF_ON = _KEEP.replace("VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                            f"SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9 WHERE {_ON}")
_NEW_LIST = "UPDATE list_seq SET last = last + 1 RETURNING last"


# -- the write side ------------------------------------------------------------------------

def on(c: Conn) -> bool:
    """Whether writes keep what they replace: history and the feed are both on."""
    return c.execute(f"SELECT {_ON}").fetchone()[0] == 1


def keep(c: Conn, seq: int | None, old: State | None, if_on: bool = False) -> None:
    """Keep ``old`` (a live state a change replaced or removed) as change ``seq``'s
    before-image; nothing when the feed is off (no seq) or nothing was there. ``if_on``:
    only if history is on (asked in the same statement)."""
    if seq is not None and old is not None:
        version, type_, list_id, length, size, expires, value, updated = old
        c.execute(_KEEP_IF_ON if if_on else _KEEP,
                  (seq, version, type_, value, list_id, length, size, updated, expires))


def needed(c: Conn, list_id: int) -> bool:
    """Whether a list is read by a list made from it (a fork's, a restore's)."""
    return c.execute("SELECT 1 FROM list_base WHERE base_id = ?", (list_id,)).fetchone() is not None


def release_list(c: Conn, list_id: int, kept: bool) -> None:
    """A list stopped being its key's value (replaced, deleted, expired). Kept in a
    before-image, or read by a list made from it: its items stay (the purge empties it
    once nothing reads it). Else they go now, as before history."""
    if kept or needed(c, list_id):
        return
    _drop_list(c, list_id)


def _drop_list(c: Conn, list_id: int) -> None:
    c.execute("DELETE FROM list_item WHERE list_id = ?", (list_id,))
    c.execute("DELETE FROM list_gone WHERE list_id = ?", (list_id,))
    base = c.execute("DELETE FROM list_base WHERE list_id = ? RETURNING base_id", (list_id,)).fetchone()
    if base is not None:  # its base may have lost its last reader
        c.execute("INSERT OR IGNORE INTO list_dead VALUES (?)", (base[0],))


# A pop's items, copied first into each list made from this one that reads them (below its
# base length, where it has no item of its own, and not past a live list's end, where an
# append writes its own): what it reads never changes.
_GIVE = """INSERT INTO list_item (list_id, idx, item)
           SELECT b.list_id, ?2, ?3 FROM list_base b
           WHERE b.base_id = ?1 AND b.base_len > ?2
             AND ?2 < coalesce((SELECT length FROM kv WHERE list_id = b.list_id), b.base_len)
             AND NOT EXISTS (SELECT 1 FROM list_item i WHERE i.list_id = b.list_id AND i.idx = ?2)"""


def pop_items(c: Conn, list_id: int, left: int, items: list[str], seq: int | None,
              kept: bool) -> None:
    """A pop's removal of ``items``, the list's items from index ``left`` on: lists made
    from this one get their copies first; kept (history on), they move to list_gone under
    the pop's seq, where a past state of the list still reads them."""
    if needed(c, list_id):
        c.executemany(_GIVE, [(list_id, left + i, t) for i, t in enumerate(items)])
    c.execute("DELETE FROM list_item WHERE list_id = ? AND idx >= ?", (list_id, left))
    if seq is not None and kept:
        c.executemany("INSERT INTO list_gone (list_id, idx, seq, item) VALUES (?, ?, ?, ?)",
                      [(list_id, left + i, seq, t) for i, t in enumerate(items)])


def based_list(c: Conn, base_id: int, base_len: int, base_seq: int | None) -> int:
    """A new list that reads ``base_id`` as it was right after change ``base_seq`` (None:
    as it is now), below ``base_len`` (a fork's or a restore's); its (negative) id.
    Nothing is copied but what a pop of the base removed since then (the earliest such
    item of each index)."""
    list_id = -c.execute(_NEW_LIST).fetchone()[0]
    c.execute("INSERT INTO list_base (list_id, base_id, base_len) VALUES (?, ?, ?)",
              (list_id, base_id, base_len))
    c.execute("""INSERT INTO list_item (list_id, idx, item)
                 SELECT ?1, idx, item FROM (
                     SELECT idx, item, row_number() OVER (PARTITION BY idx ORDER BY seq) AS first
                     FROM list_gone WHERE list_id = ?2 AND idx < ?3 AND seq > ?4)
                 WHERE first = 1""", (list_id, base_id, base_len, base_seq))
    return list_id


# -- lists as they were ----------------------------------------------------------------------

def list_items(c: Conn, list_id: int, start: int, stop: int, seq: int | None) -> list[str]:
    """The item texts of ``list_id`` at indexes start..stop-1 as they were right after
    change ``seq`` (None: now). An index reads, in order: the item the first pop after
    ``seq`` removed from it; the list's own item; its base's item (which a pop of the base
    would have copied here first: the base is read as it is now)."""
    if stop <= start:
        return []
    found: dict[int, str] = {}
    if seq is not None:
        for idx, item in c.execute(
                "SELECT idx, item FROM list_gone WHERE list_id = ?1 AND idx >= ?2 AND idx < ?3 "
                "AND seq > ?4 ORDER BY idx, seq DESC", (list_id, start, stop, seq)):
            found[idx] = item  # the earliest such pop's, as the last one set
    for idx, item in c.execute(
            "SELECT idx, item FROM list_item WHERE list_id = ?1 AND idx >= ?2 AND idx < ?3",
            (list_id, start, stop)):
        found.setdefault(idx, item)
    if len(found) < stop - start:
        base = c.execute("SELECT base_id, base_len FROM list_base WHERE list_id = ?",
                         (list_id,)).fetchone()
        missing = [i for i in range(start, stop) if i not in found]
        if base is None or missing[-1] >= base[1]:
            raise Damaged(f"list {list_id}: items {missing[:5]} are missing")
        for idx, item in zip(range(missing[0], missing[-1] + 1),
                             list_items(c, base[0], missing[0], missing[-1] + 1, None)):
            found.setdefault(idx, item)
    return [found[i] for i in range(start, stop)]


# -- the past --------------------------------------------------------------------------------

def floor(c: Conn) -> int:
    """The oldest seq the past is known right after (every later change kept what it
    replaced, while its change row is kept)."""
    return c.execute("SELECT floor FROM history_head").fetchone()[0]


def moment(c: Conn, seq: int) -> float | None:
    """When change ``seq`` was written (unix time): what "had expired by then" means."""
    row = c.execute("SELECT at FROM change WHERE seq = ?", (seq,)).fetchone()
    if row is None:
        return None
    return datetime.strptime(row[0], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


# The first change of a key after a seq, with what it replaced (none: it created the key).
_NEXT = """
SELECT h.seq, h.version, h.type, h.list_id, h.length, h.size, h.expires_at, h.value, h.updated_at
FROM change c LEFT JOIN kv_history h ON h.seq = c.seq
WHERE c.topic = 'kv' AND c.kind = ?1 AND c.scope_id = ?2 AND c.key = ?3 AND c.seq > ?4
ORDER BY c.seq LIMIT 1"""
_NOW = """SELECT 1, version, type, list_id, length, size, expires_at, value, updated_at
          FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key = ?3"""


def state_at(c: Conn, kind: str, sid: str, key: str, seq: int, when: float | None) -> State | None:
    """The key's state right after change ``seq`` (``when``: that change's time), as
    (version, type, list_id, length, size, expires_at, value, updated_at), or None when it
    was absent (not yet made, deleted, or expired by then)."""
    row = c.execute(_NEXT, (kind, sid, key, seq)).fetchone()
    if row is None:
        row = c.execute(_NOW, (kind, sid, key)).fetchone()
    if row is None or row[0] is None:
        return None
    if row[6] is not None and when is not None and row[6] <= when:
        return None  # expired by then
    return tuple(row[1:])


def changed_keys(c: Conn, kind: str, sid: str, since: int, lo: str | None = None,
                 hi: str | None = None) -> list[str]:
    """The keys of a scope (between lo and hi, exclusive of hi) with a change after
    ``since``: with the scope's keys of now, every key the scope had at ``since``."""
    rows = c.execute(
        "SELECT DISTINCT key FROM change WHERE topic = 'kv' AND kind = ?1 AND scope_id = ?2 "
        "AND seq > ?3 AND key >= coalesce(?4, '') AND key < coalesce(?5, char(127))",
        (kind, sid, since, lo, hi)).fetchall()
    return [r[0] for r in rows]


def present(c: Conn, kind: str, sid: str) -> list[tuple[str, State]]:
    """The scope's live keys now with their states, by key (a fork of the present)."""
    return [(r[0], tuple(r[1:])) for r in c.execute(
        "SELECT key, version, type, list_id, length, size, expires_at, value, updated_at FROM kv "
        "WHERE kind = ?1 AND scope_id = ?2 AND (expires_at IS NULL OR expires_at > ?3) ORDER BY key",
        (kind, sid, time.time())).fetchall()]


def scope_keys(c: Conn, kind: str, sid: str, lo: str | None = None,
               hi: str | None = None) -> list[str]:
    """Every key row of a scope now (expired ones too: they may have been live then)."""
    return [r[0] for r in c.execute(
        "SELECT key FROM kv WHERE kind = ?1 AND scope_id = ?2 AND key >= coalesce(?3, '') "
        "AND key < coalesce(?4, char(127))", (kind, sid, lo, hi)).fetchall()]


_REVISIONS = """
SELECT seq, op, version, at FROM change INDEXED BY change_by_key
WHERE topic = 'kv' AND kind = ?1 AND scope_id = ?2 AND key = ?3 AND seq > ?4 AND seq < ?5
ORDER BY seq DESC LIMIT ?6"""


def revisions(c: Conn, kind: str, sid: str, key: str, since: int, before: int | None,
              limit: int | None) -> list[Row]:
    """The key's kept changes after ``since`` and before ``before``, newest first:
    (seq, op, version, at)."""
    return c.execute(_REVISIONS, (kind, sid, key, since, 2**63 - 1 if before is None else before,
                                  -1 if limit is None else limit)).fetchall()


def changed(c: Conn, since: int, until: int, flt: Filters, readable: Readable | None = None,
            after: tuple[str, str, str] | None = None, limit: int | None = None,
            window: tuple[float | None, float] | None = None) -> list[tuple[str, str, str]]:
    """The keys with a change after ``since`` up to ``until``, by kind, scope id, key:
    those after ``after``, at most ``limit``; with ``readable``, only those its owner may
    read (the feed's filter, in the same query). ``window`` (the times of since and
    until): also the keys that expired in between with no change in the span (the
    change that records an expiry comes when something meets the key: not yet, or later)."""
    params: dict[str, Any] = {"since": since, "until": until, **flt,
                              "limit": -1 if limit is None else limit}
    where = "".join(f" AND {col} = :{col}" for col in flt)
    if readable is not None:
        where += " AND " + GRANTS.readable_sql(readable, params)
    if after is not None:
        params.update(ak=after[0], asid=after[1], akey=after[2])
        where += " AND (kind, scope_id, key) > (:ak, :asid, :akey)"
    source = "SELECT topic, kind, scope_id, key FROM change WHERE topic = 'kv' AND seq > :since " \
             "AND seq <= :until"
    if window is not None:
        params.update(t0=float("-inf") if window[0] is None else window[0], t1=window[1])
        source += f""" UNION ALL {_EXPIRED_NOW} UNION ALL
            SELECT c.topic, c.kind, c.scope_id, c.key FROM change c JOIN kv_history h ON h.seq = c.seq
            WHERE c.topic = 'kv' AND c.op = 'expire' AND c.seq > :until
              AND h.expires_at > :t0 AND h.expires_at <= :t1"""
    return c.execute(
        f"SELECT DISTINCT kind, scope_id, key FROM ({source}) WHERE true{where} "
        "ORDER BY kind, scope_id, key LIMIT :limit", params).fetchall()


# Rows that expired after :t0 and by :t1 and are still there (no change records it yet).
_EXPIRED_NOW = ("SELECT 'kv' AS topic, kind, scope_id, key FROM kv "
                "WHERE expires_at > :t0 AND expires_at <= :t1")


def expired_keys(c: Conn, kind: str, sid: str, after: float | None, upto: float) -> list[str]:
    """The keys of a scope whose row expired after ``after`` (None: ever) and by ``upto``
    with no change recording it yet."""
    return [r[3] for r in c.execute(
        _EXPIRED_NOW + " AND kind = :kind AND scope_id = :sid",
        {"t0": float("-inf") if after is None else after, "t1": upto, "kind": kind,
         "sid": sid}).fetchall()]


# -- settings and the purge ------------------------------------------------------------------

def restart(c: Conn, unseen: bool) -> None:
    """History (re)starts now (SPEC §17): the past is known from right after the head on;
    ``unseen`` (the feed was off: writes got no seq, so what the head's change left may
    have changed since), only from the next change on (a read of the head reads the
    present)."""
    c.execute("UPDATE history_head SET floor = max(floor, (SELECT coalesce(max(seq), 0) "
              "FROM change) + ?)", (int(unseen),))


# Of the ?1 changes after the floor, those before the first one still within the
# retention (written at ?2 or later) lose their before-images, as the feed's purge
# takes a prefix: the floor only moves on.
_MOVE_FLOOR = """
UPDATE history_head SET floor = max(floor, coalesce(
    (SELECT min(seq) FILTER (WHERE at >= ?2) - 1 FROM
        (SELECT seq, at FROM change WHERE seq > (SELECT floor FROM history_head)
         ORDER BY seq LIMIT ?1)),
    (SELECT max(seq) FROM (SELECT seq FROM change WHERE seq > (SELECT floor FROM history_head)
                           ORDER BY seq LIMIT ?1)),
    floor))
RETURNING floor"""


def purge_step(c: Conn, cutoff: str, batch: int) -> int:
    """Drop what no past read needs any more, a bounded amount: the before-images of
    changes older than the retention (``cutoff``, ISO time) or than the oldest change the
    feed keeps; popped items no list made from theirs reads; the items of lists nothing
    refers to any more. How many rows went."""
    floor = c.execute(_MOVE_FLOOR, (batch, cutoff)).fetchone()[0]
    oldest = c.execute("SELECT min(seq) FROM change").fetchone()[0]
    if oldest is not None and oldest - 1 > floor:  # the feed's purge went further
        floor = c.execute("UPDATE history_head SET floor = ? RETURNING floor",
                          (oldest - 1,)).fetchone()[0]
    gone = c.execute(
        "DELETE FROM kv_history WHERE seq IN (SELECT seq FROM kv_history WHERE seq <= ?1 "
        f"ORDER BY seq LIMIT {int(batch)}) RETURNING list_id", (floor,)).fetchall()
    c.executemany("INSERT OR IGNORE INTO list_dead VALUES (?)",
                  [(x,) for x in {r[0] for r in gone if r[0] is not None}])
    return len(gone) + _purge_gone(c, floor, batch) + _purge_dead(c, batch)


def _purge_gone(c: Conn, floor: int, batch: int) -> int:
    """Popped items the history no longer needs (popped at or before the floor)."""
    c.execute(f"""DELETE FROM list_gone WHERE (list_id, idx, seq) IN (
                    SELECT list_id, idx, seq FROM list_gone WHERE seq <= ?1 ORDER BY seq
                    LIMIT {int(batch)})""", (floor,))
    return c.changes()


def _purge_dead(c: Conn, batch: int) -> int:
    """Empty, a bounded amount at a time, the lists nothing refers to any more (queued in
    list_dead when they may have lost their last reader)."""
    n = 0
    for (list_id,) in c.execute(f"SELECT list_id FROM list_dead LIMIT {int(batch)}").fetchall():
        if c.execute("""SELECT EXISTS (SELECT 1 FROM kv WHERE list_id = ?1)
                           OR EXISTS (SELECT 1 FROM kv_history WHERE list_id = ?1)
                           OR EXISTS (SELECT 1 FROM list_base WHERE base_id = ?1)""",
                     (list_id,)).fetchone()[0]:
            c.execute("DELETE FROM list_dead WHERE list_id = ?", (list_id,))
            continue
        c.execute(f"""DELETE FROM list_item WHERE list_id = ?1 AND idx IN (
                        SELECT idx FROM list_item WHERE list_id = ?1 LIMIT {int(batch)})""",
                  (list_id,))
        n += c.changes()
        if c.execute("SELECT 1 FROM list_item WHERE list_id = ?", (list_id,)).fetchone() is None:
            _drop_list(c, list_id)  # its popped items, its base row (the base then queued)
            c.execute("DELETE FROM list_dead WHERE list_id = ?", (list_id,))
        if n >= batch:
            break
    return n


__all__ = ["on", "keep", "release_list", "pop_items", "based_list", "list_items", "floor",
           "moment", "state_at", "changed_keys", "scope_keys", "present", "revisions", "changed",
           "expired_keys", "restart",
           "purge_step"]
