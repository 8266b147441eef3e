"""The change feed over HTTP (SPEC §9, §12): a page, a long poll, a stream of events.

Whatever a reader is shown passes the session rule and its token's grants (``_access``);
its cursor moves past what it scanned (``_feedread``). A long poll or stream checks its caller's token again
every ``LIMITS.stream_recheck`` seconds while it is open, and ends (401) once revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from typing import Any

from starlette.responses import Response

from agentstate.errors import CursorExpired

from .. import _feedread as feed
from .. import _http as h
from .._api import API, Call, change
from .._limits import LIMITS

STREAM_EVENTS = """Server-sent events, one per change: `id:` its seq and `data:` the change as JSON
(the fields of `Change`). An event with only an `id:` moves the cursor past changes the
filters (or the session rule) left out, so a client that reconnects with `Last-Event-ID`
starts there. A comment line (`: keep-alive`) comes after 15 s without a change. The stream
ends with an `event: error` whose `data:` is an error body (`{"error": {"code", "message"}}`)
when its cursor expires later (`cursor_expired`: the purge passed a client that read too
slowly; resynchronise from the current state and reconnect from `GET /v1/changes/head`),
when its token is revoked (`unauthorized`), or when the store fails. Everything in the
request is checked before the 200: a bad filter or limit is a 400, an expired `since` a 410.
HEAD answers the headers of the GET and no body."""


async def changes(api: API, c: Call) -> Response:
    since = h.query_int(c.request, "since", 0) or 0
    wait = h.query_number(c.request, "wait", 0, LIMITS.long_poll_wait) or 0.0
    flt, limit = feed.args(c.request)
    if c.request.method == "HEAD":
        wait = 0.0  # the headers of a GET, at once
    read = functools.partial(feed.read, api.db, api.rule)
    deadline = time.monotonic() + wait
    gone = asyncio.ensure_future(h.disconnected(c.request)) if wait else None
    try:
        with api.waits.hold(c.p) if wait else contextlib.nullcontext():
            return await _poll(api, c, read, since, limit, flt, deadline, gone)
    finally:
        if gone:
            gone.cancel()


async def _poll(api: API, c: Call, read: Any, since: int, limit: int, flt: dict[str, Any],
                deadline: float, gone: asyncio.Future[None] | None) -> Response:
    while True:
        event = api.notifier.event  # before the read: a change during it is not missed
        shown, since, more = await h.blocking(read, c.p, since, limit, flt, c.rules)
        left = deadline - time.monotonic()
        if shown or left <= 0 or api.notifier.closing or (gone and gone.done()):
            return await c.answer({"changes": [change(x) for x in shown], "last": since})
        if not more:  # no connection held meanwhile
            await api.notifier.wait(min(left, LIMITS.stream_recheck), event, gone)
        await c.still()  # revoked meanwhile: 401, and nothing more is shown


async def changes_head(api: API, c: Call) -> Response:
    return h.JSON({"head": await h.blocking(api.db.last_change)})


async def changes_stream(api: API, c: Call) -> Response:
    since = h.query_int(c.request, "since", None)
    last_id = c.request.headers.get("last-event-id", "")
    if since is None:
        since = int(last_id) if h.ascii_int(last_id) and int(last_id) >= 0 \
            else await h.blocking(api.db.last_change)
    flt, limit = feed.args(c.request)
    p = c.p

    def read_from(cursor: int) -> Any:
        return feed.read(api.db, api.rule, p, cursor, limit, flt, c.rules)

    # Counted before anything is read for it (SPEC §16: a refused stream reads nothing);
    # released when the response ends (h.event_stream), or here if it never starts.
    release = api.waits.take(p) if c.request.method != "HEAD" else (lambda: None)
    try:
        first = await h.blocking(read_from, since)  # a bad cursor: its status, before the 200
    except BaseException:
        release()
        raise

    async def still() -> None:
        nonlocal p
        p = await c.still()

    async def expired(e: CursorExpired) -> tuple[bytes, int | None]:
        return feed.error_event(e), None  # the client resynchronises, as after a 410

    async def events() -> Any:
        shown, last, more = first
        yield b": agentstate change stream\n\n"
        for x in shown:
            yield h.sse(change(x), id=x.seq)
        if last != since and (not shown or shown[-1].seq != last):
            yield h.sse(id=last)
        async for chunk in feed.stream(api.notifier, read_from, last, still, on_expired=expired):
            yield chunk

    return h.event_stream(c.request, events(), release)
