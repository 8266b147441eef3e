"""Keys of a scope (SPEC §2, §12), a session's own state, and the all-or-none batch."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

import agentstate
from agentstate._encoding import check_key, check_kind
from agentstate._past import Past
from agentstate._scope import KEEP
from agentstate.errors import InvalidValue, NotFound, TooLarge

from .. import _http as h
from .. import _json
from .._api import API, Call, iso, json_response, raw_object, stored
from .._limits import LIMITS
from .._models import AppendBody, BatchBody, GetManyBody, PopBody, TouchBody


async def scope(api: API, c: Call) -> agentstate.Scope:
    """The scope of the route: a session's own state after the store's access check, any
    other after the session rule (another's session is as absent here as anywhere)."""
    params = c.params
    if "session_id" in params:
        return await h.blocking(c.db.sessions.state, params["session_id"], c.p)
    s = c.db.scope(params["kind"], params["id"])
    if s.kind == "session":
        await h.blocking(api.rule.check, c.p, s.kind, s.id)
    return s


def as_of(c: Call) -> int | None:
    """The change a read is of (``?as_of=SEQ``, SPEC §17), or None: the present."""
    return h.query_int(c.request, "as_of", None)


async def reader(api: API, c: Call) -> agentstate.Scope:
    """The route's scope for reading, after the same checks, as of the query's ``as_of``."""
    return past(api, await scope(api, c), as_of(c))


def past(api: API, s: agentstate.Scope, seq: int | None) -> agentstate.Scope:
    """``s`` as it was right after change ``seq`` (None: as it is). Every read of the past
    checks its seq itself: past the head 400 invalid_value, older than the history kept
    410 cursor_expired."""
    return s if seq is None else Past(api.db._ops, seq).scope(s.kind, s.id)


async def get_key(api: API, c: Call) -> Response:
    s, key, seq = await reader(api, c), c.params["key"], as_of(c)
    if "application/octet-stream" in c.request.headers.get("accept", ""):
        data = await h.blocking(s.get_bytes, key)
        if data is None:
            raise NotFound(f"no key {key!r} in {s.kind}:{s.id}")
        return Response(data, media_type="application/octet-stream")
    check_key(key)

    def read() -> bytes:
        row = api.db._ops.kv_get(s.kind, s.id, key, as_of=seq)  # as stored: no decoding (_api.stored)
        if row is None:
            raise NotFound(f"no key {key!r} in {s.kind}:{s.id}")
        type_, value, version, items = row
        if type_ == "bytes":  # any bytes may be stored: JSON only if they parse (SPEC §2)
            if not _json.is_json(value):
                raise InvalidValue("the stored bytes are not JSON: ask with Accept: "
                                   "application/octet-stream")
            return raw_object(key=h.dumps(key), value=value, version=h.dumps(version))
        text = "[" + (items or "") + "]" if type_ == "list" else value
        return raw_object(key=h.dumps(key), value=stored(text), version=h.dumps(version))

    return json_response(await h.blocking(read))


async def put_key(api: API, c: Call) -> Response:
    s, key = await scope(api, c), c.params["key"]
    if c.request.headers.get("content-type", "").startswith("application/octet-stream"):
        data = await c.raw(LIMITS.bytes_body)
        version = await h.blocking(
            s.put_bytes, key, data, if_version=h.query_int(c.request, "if_version"),
            ttl=h.query_number(c.request, "ttl", 1e-9, 1e11))
        return h.JSON({"version": version})
    b = await c.json()
    if b.keep_ttl and b.ttl is not None:
        raise InvalidValue("keep_ttl and ttl exclude each other")
    version = await h.blocking(s.put, key, b.value, if_version=b.if_version,
                               ttl=KEEP if b.keep_ttl else b.ttl)
    return h.JSON({"version": version})


async def delete_key(api: API, c: Call) -> Response:
    s, key = await scope(api, c), c.params["key"]
    deleted = await h.blocking(s.delete, key, if_version=h.query_int(c.request, "if_version"))
    return h.JSON({"deleted": deleted})


async def append(api: API, c: Call) -> Response:
    s, key = await scope(api, c), c.params["key"]
    b = await c.json(AppendBody)
    r = await h.blocking(s.append, key, b.items, ttl=b.ttl)
    return h.JSON({"length": r.length, "version": r.version})


async def pop(api: API, c: Call) -> Response:
    s, key = await scope(api, c), c.params["key"]
    b = await c.json(PopBody)
    return await c.answer({"items": await h.blocking(s.pop, key, b.n)})


async def touch(api: API, c: Call) -> Response:
    s, key = await scope(api, c), c.params["key"]
    b = await c.json(TouchBody)
    touched = await h.blocking(s.touch, key, b.ttl)
    at = await h.blocking(s.expires_at, key) if touched else None
    return h.JSON({"touched": touched, "expires_at": iso(at)})


async def expires_at(api: API, c: Call) -> Response:
    s, key = await reader(api, c), c.params["key"]
    return h.JSON({"expires_at": iso(await h.blocking(s.expires_at, key))})


async def slice(api: API, c: Call) -> Response:
    s, key = await reader(api, c), c.params["key"]
    start = h.query_int(c.request, "start", 0, lo=-(2**63))
    stop = h.query_int(c.request, "stop", None, lo=-(2**63))
    return await c.answer({"items": await h.blocking(s.slice, key, start, stop)})


async def length(api: API, c: Call) -> Response:
    s, key = await reader(api, c), c.params["key"]
    return h.JSON({"length": await h.blocking(s.length, key)})


async def keys(api: API, c: Call) -> Response:
    s = await reader(api, c)
    limit = h.query_int(c.request, "limit", None, lo=0, hi=LIMITS.list_page)
    found = await h.blocking(s.list, c.q("prefix", "") or "", after=c.q("after") or None,
                             limit=limit)
    return await c.answer({"keys": found, "next": found[-1] if limit and len(found) == limit else None})


def _count_ops(data: dict[str, Any]) -> None:
    ops = data.get("ops")
    if isinstance(ops, list) and len(ops) > LIMITS.batch_ops:
        raise TooLarge(f"a batch of {len(ops)} ops, over the limit of {LIMITS.batch_ops}",
                       len(ops), LIMITS.batch_ops)


async def batch(api: API, c: Call) -> Response:
    b = await c.json(BatchBody, check=_count_ops)
    scopes = []
    for op in b.ops:  # every op's scope checked before anything is applied: all or none
        kind, sep, sid = op.scope.partition(":")
        if not sep:
            raise agentstate.InvalidKey(f"scope must be KIND:ID, got {op.scope!r}")
        scopes.append((check_kind(kind), check_key(sid, "scope id")))
        c.need(kind, sid, op.op != "check")  # a check reads its key, and writes nothing
    sessions = {sid for kind, sid in scopes if kind == "session"}
    if await h.blocking(api.rule.hidden, c.p, sessions):  # as absent here as anywhere else
        raise NotFound("no session: a batch op names a session this principal may not use")

    def apply() -> list[Any]:
        with c.db.batch() as bt:
            for op, (kind, sid) in zip(b.ops, scopes):
                target = bt.scope(kind, sid)
                if op.op == "put":
                    target.put(op.key, op.value, if_version=op.if_version, ttl=op.ttl)
                elif op.op == "delete":
                    target.delete(op.key, if_version=op.if_version)
                elif op.op == "check":
                    target.check(op.key, if_version=op.if_version)
                else:
                    target.append(op.key, op.items, ttl=op.ttl)
        return bt.results or []

    results = await h.blocking(apply)
    return h.JSON({"results": [_result(r) for r in results]})


async def get_many(api: API, c: Call) -> Response:
    s = await scope(api, c)
    b = await c.json(GetManyBody)
    s = past(api, s, b.as_of)
    found = await h.blocking(_decoded, s.get_many, b.keys)
    return await c.answer({"values": {k: {"value": v.value, "version": v.version}
                                      for k, v in found.items()}})


async def items(api: API, c: Call) -> Response:
    s = await reader(api, c)
    after, limit = c.q("after") or None, h.query_int(c.request, "limit", None, lo=0,
                                                      hi=LIMITS.list_page)
    got = await h.blocking(_decoded, s.items, c.q("prefix", "") or "", after=after, limit=limit)
    return await c.answer({"items": [{"key": k, "value": v.value, "version": v.version}
                                     for k, v in got],
                           "next": got[-1][0] if limit and len(got) == limit else None})


def _decoded(read: Any, *args: Any, **kwargs: Any) -> Any:
    """A read of several values; stored bytes that are not JSON cannot be one (as for a
    single key: 400, read that key as application/octet-stream)."""
    try:
        return read(*args, **kwargs)
    except json.JSONDecodeError as e:
        raise InvalidValue(f"a stored bytes value is not JSON ({e}): read that key with "
                           "Accept: application/octet-stream") from None


async def clear(api: API, c: Call) -> Response:
    s = await scope(api, c)
    return h.JSON({"cleared": await h.blocking(s.clear)})


def _result(r: Any) -> Any:
    if isinstance(r, agentstate.Appended):
        return {"length": r.length, "version": r.version}
    if isinstance(r, bool):
        return {"deleted": r}
    return {"version": r}
