"""The past over HTTP (SPEC §17): a key's revisions, what changed between two changes,
a scope put back as it was, a session forked. (Reads as of a change are the key routes'
``?as_of=``: ``views/keys``.)

Values go out as the key routes give them, with a ``type``: ``"json"``, or ``"bytes"``
for a value written as bytes, whose ``value`` is then its base64 text (a JSON answer
cannot carry raw bytes, and bytes need not be JSON).
"""

from __future__ import annotations

import base64
from typing import Any

from starlette.responses import Response

import agentstate
from agentstate import _changes, _past
from agentstate._encoding import check_key, check_kind
from agentstate.errors import InvalidValue

from .. import _access
from .. import _http as h
from .._api import API, Call, iso
from .._limits import LIMITS
from .._models import RestoreBody, SessionForkBody
from .keys import scope
from .sessions import _session

DIFF_PAGE = 1000  # diffs one answer holds unless limit= says fewer (or more, to list_page)

CHUNK = 32  # revisions read from the store at a time, so a page stops near its byte budget
HISTORY = (f"Newest first: `{{seq, version, op, at, value, type}}` for each change of the key "
           "still kept (`op` as in the feed; `value` what the key held after it, null after a "
           "delete or an expiry; `type` `bytes` for a value written as bytes, whose `value` is "
           "then base64). `since`: only changes after that seq; `before`: only changes before "
           f"it. A page holds at most `limit` revisions (and at most "
           f"{LIMITS.history_page:,}, the default) and ends early once its values pass "
           f"{LIMITS.history_bytes:,} bytes; `next` is the `before` of the next (older) page, "
           "null at the end.")
DIFF = ("One `{kind, scope_id, key, before, after}` per key changed after `since` (default 0) "
        "up to `until` (default: the newest change), ordered by kind, scope id and key; "
        "`before` and `after` are `{value, version, type}` (absent: null and 0; `type` as in a "
        "key's history). A key changed and changed back is listed with equal values. Only "
        "what the caller may read: a token with grants sees the scopes its rules cover and "
        "its own sessions, as in the feed. A page at a time: `limit` (default 1,000) and "
        "`after`, the page before's `next` (`KIND/SCOPE_ID/KEY/UNTIL`: its last diff, and "
        "the change the diff is up to, so that the pages of one diff are of one moment; "
        "null: no more). A page ends early once its values pass "
        f"{LIMITS.history_bytes:,} bytes. 400: a seq past the newest change, or `until` "
        "before `since`; 410: older than the history kept.")
RESTORE = ("One write that puts every key of the scope (or only `keys`) back to its value right "
           "after change `at`, as new versions recorded in the feed; keys made since are "
           "deleted. `{\"restored\"}`: how many keys changed. A restored key does not expire. "
           "400: `at` past the newest change; 410: older than the history kept.")


def value(v: Any, version: int) -> dict[str, Any]:
    """A value as the past's answers carry it: ``{"value", "version", "type"}``."""
    if isinstance(v, bytes):
        return {"value": base64.b64encode(v).decode("ascii"), "version": version, "type": "bytes"}
    return {"value": v, "version": version, "type": "json"}


def revision(r: agentstate.Revision) -> dict[str, Any]:
    v = value(r.value, r.version)
    return {"seq": r.seq, "version": r.version, "op": r.op, "at": iso(r.at), "value": v["value"],
            "type": v["type"]}


def _size(v: Any) -> int:
    return len(v) if isinstance(v, bytes) else len(h.dumps(v))


async def history(api: API, c: Call) -> Response:
    """A page of the key's kept revisions, newest first; ``next``: the ``before`` of the
    next page (older ones), null when there is none. A page stops at ``limit`` revisions
    (at most ``LIMITS.history_page``: a bigger limit is a longer walk of pages, not an
    error, since a page may end early anyway), or once its values pass
    ``LIMITS.history_bytes`` (a list's every revision holds the whole list of its moment)."""
    s, key = await scope(api, c), c.params["key"]
    since = h.query_int(c.request, "since", None)
    before = h.query_int(c.request, "before", None)
    asked = h.query_int(c.request, "limit", None, lo=1)
    limit = LIMITS.history_page if asked is None else min(asked, LIMITS.history_page)

    found = await h.blocking(history_page, s, key, since, before, limit, LIMITS.history_bytes)
    return await c.answer(found)


def history_page(s: agentstate.Scope, key: str, since: int | None, before: int | None,
                 limit: int, budget: int) -> dict[str, Any]:
    """``{"revisions", "next"}``: at most ``limit`` revisions before ``before``, newest
    first, read a few at a time until their values pass ``budget`` bytes (the API's route
    and the MCP tool). Blocking."""
    def read(cursor: int | None, n: int) -> list[agentstate.Revision]:
        return s.history(key, since=since, before=cursor, limit=n)

    out, more = bounded(read, lambda r: _size(r.value), lambda r: r.seq, before, limit, budget)
    return {"revisions": [revision(r) for r in out], "next": out[-1].seq if more else None}


def bounded(read: Any, size_of: Any, cursor_of: Any, cursor: Any, limit: int,
            budget: int) -> tuple[list[Any], bool]:
    """Up to ``limit`` rows of ``read(cursor, n)`` (n rows after ``cursor``), read a few at
    a time, stopping at the first row whose values take the page past ``budget`` bytes;
    and whether there may be more. The first read is of one row and each next read of as
    many as the budget left holds at the sizes seen so far (at most CHUNK): a page passes
    its budget by one row, and holds no more than that in memory (a list's every revision,
    a diff's both values, may be the whole of a big list)."""
    out: list[Any] = []
    size, more = 0, True
    while more and len(out) < limit and size < budget:
        want = min(CHUNK, limit - len(out))
        if size:
            want = min(want, max(1, (budget - size) * len(out) // size))
        elif not out:
            want = 1
        got = read(cursor, want)
        more = len(got) == want
        for i, row in enumerate(got):
            out.append(row)
            size += size_of(row)
            if size >= budget:
                more = more or i + 1 < len(got)
                break
        if out:
            cursor = cursor_of(out[-1])
    return out, more and bool(out)


async def diff(api: API, c: Call) -> Response:
    """Each key changed after ``since`` up to ``until`` that the caller may read, a page
    at a time (``limit``, default 1,000; ``after``, the ``next`` of the page before): the
    session rule and the token's grants leave out the rest in the store's own query, as
    in the feed, so a caller that may read little costs the store little. A page ends
    early once its values pass ``LIMITS.history_bytes``. Without ``until`` the diff is up
    to the newest change when its first page was asked: ``next`` carries that change, so
    a diff followed page by page is of one moment (a write between two pages shows up in
    none of them, never half)."""
    q = c.request.query_params
    since = h.query_int(c.request, "since", 0)
    until = h.query_int(c.request, "until", None)
    limit = h.query_int(c.request, "limit", DIFF_PAGE, lo=1, hi=LIMITS.list_page) or DIFF_PAGE
    flt = _changes.filters(**{k: q[k] for k in ("kind", "scope_id", "key") if q.get(k)})
    assert since is not None
    after = None
    if q.get("after"):
        parts = q["after"].split("/")
        if len(parts) not in (3, 4):
            raise InvalidValue("after is the next of a diff's page: KIND/SCOPE_ID/KEY, "
                               f"and the change it is up to, got {q['after']!r}")
        after = (check_kind(parts[0]), check_key(parts[1], "scope id"), check_key(parts[2]))
        if len(parts) == 4:
            end = int(parts[3]) if h.ascii_int(parts[3]) else -1
            if end < 0 or (until is not None and until != end):
                raise InvalidValue(f"after {q['after']!r} is of a diff up to another change "
                                   f"than until={until}")
            until = end
    readable = _access.past_readable(c.p, c.rules)

    def read() -> tuple[list[agentstate.Diff], bool, int | None]:
        end = until
        if end is None:  # the newest change now: every page of this diff is up to it
            head = api.db.last_change()
            end = head if head >= since else None  # else the store says since is past it

        def chunk(cursor: tuple[str, str, str] | None, n: int) -> list[agentstate.Diff]:
            return _past.diff_rows(api.db._ops.diff(since, end, flt, readable, cursor, n))

        found, more = bounded(chunk, lambda d: _size(d.before.value) + _size(d.after.value),
                              lambda d: (d.kind, d.scope_id, d.key), after, limit,
                              LIMITS.history_bytes)
        return found, more, end

    found, more, end = await h.blocking(read)
    last = found[-1] if more else None
    return await c.answer({"diffs": [
        {"kind": d.kind, "scope_id": d.scope_id, "key": d.key,
         "before": value(*d.before), "after": value(*d.after)} for d in found],
        "next": None if last is None else f"{last.kind}/{last.scope_id}/{last.key}/{end}"})


async def restore(api: API, c: Call) -> Response:
    s = await scope(api, c)
    b = await c.json(RestoreBody)
    return h.JSON({"restored": await h.blocking(s.restore, b.at, keys=b.keys)})


async def fork(api: API, c: Call) -> Response:
    b = await c.json(SessionForkBody)
    s = await h.blocking(c.db.sessions.fork, c.params["session_id"], c.p, at=b.at,
                         metadata=b.metadata)
    return await c.answer(_session(s), 201)
