"""The change feed's public side (SPEC §9): ``Change``, reading, and waiting.

Waiting across processes: SQLite's ``PRAGMA data_version`` changes on a
connection whenever another connection (in any process) commits; reading it
touches only the WAL index in shared memory. A waiter polls it (every 5 ms
right after a change, backing off to 25 ms) and queries the feed only when it
moved, so an idle watcher costs well under 1% of a core and wakes within
~25 ms of a commit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple

import apsw

from . import _feed
from ._encoding import check_int, check_key, check_kind
from .errors import CursorExpired, InvalidValue, UsageError

if TYPE_CHECKING:
    from ._connection import Store

# Seconds between two looks at data_version while waiting: quick right after a
# change (agents often write in bursts), backing off to POLL_MAX when idle, so
# a wake-up takes at most ~POLL_MAX and an idle waiter looks ~40 times a second.
POLL_MIN, POLL_MAX = 0.005, 0.025


def _backoff(interval: float) -> float:
    return min(POLL_MAX, interval * 1.5)
TOPICS = ("kv", "run", "session")
MAX_LIMIT = 10_000


class Change(NamedTuple):
    """One committed change (SPEC §9); values are not in the feed: read them."""

    seq: int
    at: datetime
    topic: str
    op: str
    kind: str | None
    scope_id: str | None
    key: str | None
    version: int | None
    start: int | None
    count: int | None


def _change(row: tuple[Any, ...]) -> Change:
    seq, at, *rest = row
    return Change(seq, datetime.fromisoformat(at), *rest)


def filters(topic: Any = None, kind: Any = None, scope_id: Any = None, key: Any = None) -> dict[str, Any]:
    """The given filters, checked: {} matches every change."""
    out: dict[str, Any] = {}
    if topic is not None:
        if topic not in TOPICS or type(topic) is not str:
            raise InvalidValue(f"topic must be one of {', '.join(TOPICS)}, got {topic!r}")
        out["topic"] = topic
    if kind is not None:
        out["kind"] = check_kind(kind)
    if scope_id is not None:
        out["scope_id"] = check_key(scope_id, "scope id")
    if key is not None:
        out["key"] = check_key(key)
    return out


def check_since(since: Any, limit: Any) -> None:
    check_int("since", since)
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise InvalidValue(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")


def _read(c: apsw.Connection, since: int, limit: int, flt: dict[str, Any]) -> tuple[list[Change], int]:
    """(changes after since, head) in the caller's read transaction.

    :raises CursorExpired: some change after ``since`` is no longer kept.
    """
    head = _feed.head(c)
    if since < head:
        if _feed.setting(c, "feed_retention") == 0:
            raise CursorExpired(f"the change feed is off (feed_retention 0): only since={head} "
                                "(last_change()) is valid")
        oldest = _feed.oldest(c)
        if oldest is None or oldest > since + 1:
            raise CursorExpired(
                f"changes after {since} are no longer kept (the oldest kept is "
                f"{oldest if oldest is not None else 'none'}): read the current state and go on "
                f"from last_change() = {head}")
    return [_change(r) for r in _feed.changes(c, since, limit, flt)], head


def scan(store: Store, since: int, limit: int, flt: dict[str, Any]) -> tuple[list[Change], int]:
    """(changes after since, head), read together in one snapshot."""
    with store.snapshot() as c:
        return _read(c, since, limit, flt)


def changes(store: Store, since: int, limit: int, flt: dict[str, Any]) -> list[Change]:
    return scan(store, since, limit, flt)[0]


def last_change(store: Store) -> int:
    with store.read() as c:
        return _feed.head(c)


def watch(store: Store, since: int, timeout: float | None, limit: int,
          flt: dict[str, Any]) -> list[Change]:
    """Changes after ``since``; if none yet, wait for one (or ``timeout`` seconds: [])."""
    if store.in_write():
        raise UsageError("watch() inside transaction() would wait for itself: call it outside")
    deadline = None if timeout is None else time.monotonic() + timeout
    cursor = since
    while True:
        c = store.conn()
        version = c.pragma("data_version")  # before the query: a commit after it is seen
        found, head = scan(store, cursor, limit, flt)
        if found:
            return found
        cursor = max(cursor, head)  # nothing up to head matches: look only past it next time
        interval = POLL_MIN
        while c.pragma("data_version") == version:
            if deadline is not None and time.monotonic() >= deadline:
                return []
            time.sleep(interval if deadline is None
                       else max(0.0, min(interval, deadline - time.monotonic())))
            interval = _backoff(interval)


async def awatch(store: Store, since: int, limit: int, flt: dict[str, Any]) -> AsyncIterator[Change]:
    """Every change after ``since``, as committed, forever; the loop never waits on SQLite.

    Polls data_version on a connection of its own (one look is microseconds and
    takes no lock); the feed itself is read in a worker thread.
    """
    poll = apsw.Connection(store.path, flags=apsw.SQLITE_OPEN_READWRITE)
    try:
        cursor = since
        while True:
            version = poll.pragma("data_version")
            found, head = await asyncio.to_thread(scan, store, cursor, limit, flt)
            if found:
                for ch in found:
                    yield ch
                cursor = found[-1].seq
                continue
            cursor = max(cursor, head)  # nothing up to head matches: look only past it next time
            interval = POLL_MIN
            while poll.pragma("data_version") == version:
                await asyncio.sleep(interval)
                interval = _backoff(interval)
    finally:
        poll.close()
