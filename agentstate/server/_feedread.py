"""Reading the change feed for one principal, for the long poll, the API's stream and the
pages' stream alike: one page and the cursor after it, and the stream's loop.

The cursor a reader gets back is what was *scanned*, not the last change it was shown:
changes a filter skipped or the session rule hid are behind it too, so the next read
starts past them (a filtered reader that kept its cursor rescanned the same changes at
every commit until the purge passed it: CursorExpired, issue 26.16).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import agentstate
from agentstate import _changes
from agentstate.errors import AgentStateError, CursorExpired

from . import _access
from . import _http as h
from ._access import Rules, SessionRule
from ._api import Notifier, change
from ._limits import LIMITS

KEEP_ALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream
FEED_QUERY = ("topic", "kind", "scope_id", "key")
WINDOW = 100_000  # seqs one read of a caller with grants scans at most (see read)


def args(request: Any, default_limit: int = 1000) -> tuple[dict[str, Any], int]:
    """The §9 filters and the page size of a feed request, checked (InvalidValue)."""
    q = request.query_params
    flt = _changes.filters(**{k: q[k] for k in FEED_QUERY if q.get(k)})
    limit = h.query_int(request, "limit", default_limit, lo=1, hi=LIMITS.feed_page)
    return flt, limit or default_limit


def read(db: agentstate.Database, rule: SessionRule, p: agentstate.Principal, since: int,
         limit: int, flt: dict[str, Any], rules: Rules = None
         ) -> tuple[list[agentstate.Change], int, bool]:
    """(the changes after ``since`` that ``p`` (with ``rules``, its token's grants) may see,
    the cursor to go on from, whether more may follow at once): one scan, then the session
    rule and the grants. Blocking.

    For a caller with grants the store's query keeps only what it may read (``readable``),
    so a token that sees little costs a scan in SQL, not a Python object per change; and
    it scans at most ``WINDOW`` seqs per read, so no one read holds a snapshot for long.

    :raises CursorExpired: changes after ``since`` are no longer kept.
    """
    db._check_open()
    _changes.check_since(since, limit)
    readable = _access.readable(p, rules)
    upto = None if readable is None else since + WINDOW
    # _ops.feed_scan, not db.changes(): it also gives the head it scanned to (a public
    # db.changes_page(...) -> (changes, last) would be the cleaner call)
    rows, head = db._ops.feed_scan(since, limit, flt, readable, upto)
    found = [_changes.change(r) for r in rows]
    full = len(found) == limit
    end = head if upto is None else min(head, upto)  # a window may end before the head
    last = found[-1].seq if full else max(since, end)
    return rule.visible(p, found, rules), last, full or end < head


def error_event(e: AgentStateError) -> bytes:
    """The stream's last event: the §6 error that ended it, as the API's error bodies are."""
    return h.sse(h.error_body(e), event="error")


async def stream(notifier: Notifier, read_from: Callable[[int], Any], cursor: int,
                 still: Callable[[], Awaitable[Any]], *, first: bytes = b"",
                 on_expired: Callable[[CursorExpired], Awaitable[tuple[bytes, int | None]]],
                 denied: Callable[[AgentStateError], bytes] = lambda e: error_event(e)
                 ) -> AsyncIterator[bytes]:
    """Server-sent events of the changes after ``cursor``, until the server stops, the
    caller's right to read ends (``still()`` raises: the ``denied`` event), or the store
    refuses (``on_expired`` says what to send and where to go on, or None: end).

    ``read_from(cursor)`` is ``read`` bound to its reader (run in a worker thread).
    """
    if first:
        yield first
    idle = 0.0
    while not notifier.closing:
        event = notifier.event  # before the read: a change during it is not missed
        try:
            shown, last, more = await h.blocking(read_from, cursor)
        except CursorExpired as e:
            out, again = await on_expired(e)
            yield out
            if again is None:
                return
            cursor = again
            continue
        except AgentStateError as e:  # the store is busy or gone: say so, and end
            yield error_event(e)
            return
        for c in shown:
            yield h.sse(change(c), id=c.seq)
        if last != cursor and (not shown or shown[-1].seq != last):
            yield h.sse(id=last)  # read past what was not shown: a reconnect starts here
        cursor = last
        if not more:
            woke = await notifier.wait(LIMITS.stream_recheck, event)
            idle = 0.0 if woke or shown else idle + LIMITS.stream_recheck
            if idle >= KEEP_ALIVE_S and not notifier.closing:
                idle = 0.0
                yield b": keep-alive\n\n"
        try:
            await still()
        except AgentStateError as e:  # the token was revoked, the sign-in ended
            yield denied(e)
            return
