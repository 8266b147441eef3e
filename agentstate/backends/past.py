"""The past of the store (SPEC §17), written once over a backend's repositories.

A backend keeps, for each change of a key, the state it replaced (``HistoryRepo``);
this module answers the questions: a key as it was right after a change, a scope's
keys then, a key's revisions, what changed between two changes, and writes a scope
(or a new session) back to how it was. Every function runs on one connection in one
snapshot (or write transaction) that the caller holds.

A state is (version, type, list_id, length, size, expires_at, value, updated_at); a
read answers in the shape of the present's reads: (type, stored, version, joined
list items).
"""

from __future__ import annotations

from typing import Any

from ..errors import CursorExpired, InvalidValue
from .base import Backend, Conn, Filters, Row, SETTINGS
from .grants import Readable

State = tuple[Any, ...]
_END = "\x7f"  # above every key (keys are ASCII below DEL)


def moment(b: Backend, c: Conn, seq: int) -> float | None:
    """The time of change ``seq`` (what "expired by then" means; the head's: now), once
    ``seq`` is known to be one the past is kept for.

    :raises InvalidValue: ``seq`` is not a change yet (past the head), or not a seq.
    :raises CursorExpired: the history kept does not reach back to ``seq``.
    """
    if type(seq) is not int or seq < 0:
        raise InvalidValue(f"as_of must be a change's seq (an integer >= 0), got {seq!r}")
    head = b.feed.head(c)
    if seq > head:
        raise InvalidValue(f"as_of={seq} is past the newest change ({head}): the store has no "
                           "such moment yet")
    if seq < head:
        settings = b.feed.settings(c)
        if not settings.get("history_retention", SETTINGS["history_retention"]) \
                or not settings.get("feed_retention", SETTINGS["feed_retention"]):
            raise CursorExpired(f"history is off (history_retention or feed_retention 0): only "
                                f"as_of={head} (the head) can be read")
        floor = b.history.floor(c)
        if seq < floor:
            raise CursorExpired(f"the history kept reaches back to change {floor}, not to "
                                f"{seq}: read a later change (history_retention is "
                                f"{settings.get('history_retention')} s)")
    if seq == head:  # nothing changed since: the present, expiry judged now
        return b.store.clock()
    return b.history.moment(c, seq) if seq else None


def read(b: Backend, c: Conn, state: State | None, seq: int) -> Row | None:
    """A state as ``kv_get`` answers: (type, stored, version, joined list items)."""
    if state is None:
        return None
    version, type_, list_id, length, _size, _expires, value, _updated = state
    items = None
    if type_ == "list":
        items = ",".join(b.history.list_items(c, list_id, 0, length, seq))
    return type_, value, version, items


def state(b: Backend, c: Conn, kind: str, sid: str, key: str, seq: int,
          when: float | None) -> State | None:
    return b.history.state_at(c, kind, sid, key, seq, when)


def get(b: Backend, c: Conn, kind: str, sid: str, key: str, seq: int) -> Row | None:
    when = moment(b, c, seq)
    return read(b, c, state(b, c, kind, sid, key, seq, when), seq)


def expires_at(b: Backend, c: Conn, kind: str, sid: str, key: str, seq: int) -> float | None:
    when = moment(b, c, seq)
    s = state(b, c, kind, sid, key, seq, when)
    return None if s is None else s[5]


def length(b: Backend, c: Conn, kind: str, sid: str, key: str, seq: int) -> int | None:
    """Items in the list then; 0 when absent, None when not a list."""
    s = state(b, c, kind, sid, key, seq, moment(b, c, seq))
    if s is None:
        return 0
    return s[3] if s[1] == "list" else None


def slice_items(b: Backend, c: Conn, kind: str, sid: str, key: str, start: int,
                stop: int | None, seq: int) -> list[str] | None:
    s = state(b, c, kind, sid, key, seq, moment(b, c, seq))
    if s is None:
        return []
    if s[1] != "list":
        return None
    lo, hi, _ = slice(start, stop).indices(s[3])
    return b.history.list_items(c, s[2], lo, hi, seq)


def _range(prefix: str, after: str | None) -> tuple[str, str]:
    lo = prefix if after is None or after < prefix else after + "\x00"
    hi = prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else _END
    return lo, hi


def states(b: Backend, c: Conn, kind: str, sid: str, prefix: str, after: str | None,
           limit: int | None, seq: int) -> list[tuple[str, State]]:
    """The scope's live keys then, starting with ``prefix``, after ``after``, ascending, at
    most ``limit``, with their states: the keys it has now and those changed since
    (deleted ones among them) are every key it had."""
    when = moment(b, c, seq)
    if limit == 0:
        return []  # as the present's: none (the loop below appends one before it counts)
    lo, hi = _range(prefix, after)
    candidates = sorted(set(b.history.scope_keys(c, kind, sid, lo, hi))
                        | set(b.history.changed_keys(c, kind, sid, seq, lo, hi)))
    out = []
    for key in candidates:
        s = state(b, c, kind, sid, key, seq, when)
        if s is not None:
            out.append((key, s))
            if limit is not None and len(out) >= limit:
                break
    return out


def keys(b: Backend, c: Conn, kind: str, sid: str, prefix: str, after: str | None,
         limit: int | None, seq: int) -> list[str]:
    return [k for k, _s in states(b, c, kind, sid, prefix, after, limit, seq)]


def items(b: Backend, c: Conn, kind: str, sid: str, prefix: str, after: str | None,
          limit: int | None, seq: int) -> list[Row]:
    return [(k, *read(b, c, s, seq)) for k, s in  # type: ignore[misc]
            states(b, c, kind, sid, prefix, after, limit, seq)]


def get_many(b: Backend, c: Conn, kind: str, sid: str, keys: list[str], seq: int) -> list[Row]:
    when = moment(b, c, seq)
    out = []
    for key in sorted(set(keys)):
        row = read(b, c, state(b, c, kind, sid, key, seq, when), seq)
        if row is not None:
            out.append((key, *row))
    return out


# -- revisions and differences -----------------------------------------------------------

def revisions(b: Backend, c: Conn, kind: str, sid: str, key: str, since: int,
              before: int | None, limit: int | None) -> list[Row]:
    """(seq, version, op, at, type, stored, joined list items) of the key's kept changes,
    newest first: what it held right after each (None after a delete or an expiry)."""
    # What a change left is known while the next change's before-image is kept: from the
    # floor on, while history is on; with it off, only the newest change's (what is there).
    since = max(since, b.history.floor(c) - 1)
    if not b.history.on(c):
        limit = 1 if before is None else 0
    out = []
    for seq, op, version, at in b.history.revisions(c, kind, sid, key, since, before, limit):
        row = read(b, c, state(b, c, kind, sid, key, seq, None), seq) \
            if op not in ("delete", "expire") else None
        out.append((seq, version, op, at, *(row[:2] if row else (None, None)),
                    row[3] if row else None))
    return out


def diff(b: Backend, c: Conn, since: int, until: int | None, flt: Filters,
         readable: Readable | None = None, after: tuple[str, str, str] | None = None,
         limit: int | None = None) -> list[Row]:
    """(kind, scope id, key, before, after) for each key changed after ``since`` up to
    ``until`` (after the key ``after``, at most ``limit``; ``readable``: only what its
    owner may read): ``kv_get`` rows as they were at each end (None: absent)."""
    end = b.feed.head(c) if until is None else until
    if end < since:
        raise InvalidValue(f"until ({until}) is before since ({since})")
    when_since, when_end = moment(b, c, since), moment(b, c, end)
    out = []
    window = (when_since, b.store.clock() if when_end is None else when_end)
    for kind, sid, key in b.history.changed(c, since, end, flt, readable, after, limit, window):
        out.append((kind, sid, key,
                    read(b, c, state(b, c, kind, sid, key, since, when_since), since),
                    read(b, c, state(b, c, kind, sid, key, end, when_end), end)))
    return out


def then_and_now(b: Backend, c: Conn, kind: str, sid: str, seq: int,
                 keys: list[str] | None) -> list[tuple[str, State | None, Row | None]]:
    """For a restore: each key of the scope (or of ``keys``) that changed after ``seq``
    (an expiry included), with its state then and its ``kv_get`` row now, by key."""
    when = moment(b, c, seq)
    changed = set(b.history.changed_keys(c, kind, sid, seq))  # and those expired since:
    changed.update(b.history.expired_keys(c, kind, sid, when, b.store.clock()))
    wanted = sorted(changed if keys is None else set(keys) & changed)
    return [(key, state(b, c, kind, sid, key, seq, when), b.kv.get(c, kind, sid, key))
            for key in wanted]


# -- writing the past back -----------------------------------------------------------------

def write_back(b: Backend, c: Conn, kind: str, sid: str, key: str, s: State,
               seq: int | None) -> int:
    """Write ``s`` (the key's state right after ``seq``) as a new version of ``key`` in the
    scope: a list as one made from the list then (nothing copied). Its expiry is not
    brought back: a restored or forked key does not expire. The new version."""
    version, type_, list_id, length, size, _expires, value, _updated = s
    if type_ == "list":
        return b.kv.put_based(c, kind, sid, key, b.history.based_list(c, list_id, length, seq),
                              length, size)
    return b.kv.put(c, kind, sid, key, type_, value, size, None, None, None)


def restore(b: Backend, c: Conn, kind: str, sid: str, seq: int, keys: list[str] | None) -> int:
    """The scope's keys (or ``keys``) back as they were right after ``seq``, as new versions
    (a key made since is deleted), in the caller's write transaction; how many changed. A
    key whose value is the same again (changed and changed back) is left as it is."""
    n = 0
    for key, then, now in then_and_now(b, c, kind, sid, seq, keys):
        if then is None:
            if now is not None:
                b.kv.delete(c, kind, sid, key, None)
                n += 1
            continue
        was = read(b, c, then, seq) or ()
        if now is not None and (now[2] == then[0] or was[:2] + was[3:] == now[:2] + now[3:]):
            continue  # the same version, or the same value again: nothing to put back
        write_back(b, c, kind, sid, key, then, seq)
        n += 1
    return n


def fork(b: Backend, c: Conn, kind: str, src: str, dst: str, seq: int | None) -> int:
    """Copy the scope ``src`` as it was right after ``seq`` (None: as it is now, whatever
    the feed has numbered) into the empty scope ``dst`` (a new session's): lists are made
    from the lists then. How many keys."""
    done = 0
    found = b.history.present(c, kind, src) if seq is None else \
        states(b, c, kind, src, "", None, None, seq)
    for key, s in found:
        write_back(b, c, kind, dst, key, s, seq)
        done += 1
    return done
