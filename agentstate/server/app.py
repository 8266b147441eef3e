"""The State API (SPEC §12): an ASGI app over one store, on top of the public objects.

Routes are listed once, in ROUTES, with what the OpenAPI document says of
them; handlers are short: authenticate, parse, run the store call in a worker
thread, answer JSON. One exception handler turns every library error into
``{"error": {"code", "message", ...}}`` with its SPEC §6 status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

import agentstate
from agentstate import KEEP
from agentstate.errors import AgentStateError, InvalidValue, NotFound, Unauthorized

from . import _http as h
from ._models import (AppendBody, BatchBody, DecideBody, FailBody, FinishBody, ForkBody, HoldBody,
                      LeaseBody, PopBody, PruneRunsBody, PruneSessionsBody, PutBody, SessionBody,
                      SettingBody, TouchBody, TrimBody, TurnBody, WriteBody)

log = logging.getLogger("agentstate.server")
KIB, MIB = 1024, 1024 * 1024
BODY_LIMIT = 4 * MIB  # a 1 MiB value, even with every character \\u-escaped in transit
BATCH_LIMIT = 16 * MIB
RUN_LIMIT = 64 * MIB  # entries of up to 16 MiB each
MAX_WAIT = 300.0  # seconds a long poll may hold
TOKEN_CACHE_S = 2.0  # a revoked token stops working within this


@dataclass
class Route_:
    """One route: what it does, and what the OpenAPI document says of it."""

    method: str
    path: str
    handler: Callable[..., Awaitable[Response]]
    summary: str
    body: Any = None  # a pydantic model, or "bytes"
    query: tuple[str, ...] = ()
    ok: int = 200
    answer: str = "object"  # a schema name in openapi.SCHEMAS
    errors: tuple[int, ...] = (400,)
    auth: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


class Notifier:
    """One watcher of the feed for the whole server: long polls and streams wait on it
    (an asyncio event), holding no database connection or lock while they wait."""

    def __init__(self, db: agentstate.Database) -> None:
        self.db = db
        self.event = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.closing = False  # the server is stopping: waits end, streams close

    async def run(self) -> None:
        while True:
            try:
                async for _ch in self.db.awatch(await h.blocking(self.db.last_change)):
                    self.event.set()
                    self.event = asyncio.Event()
            except asyncio.CancelledError:
                raise
            except Exception:  # the store hiccuped (busy, restarted): look again shortly
                await asyncio.sleep(1.0)

    async def wait(self, timeout: float, since: asyncio.Event,
                   gone: asyncio.Future[None] | None = None) -> bool:
        """True at the first change after ``since`` (the ``event`` taken before the caller's
        last read, so a change during that read is not missed); False after ``timeout``, when
        ``gone`` is done (the client left) or when the server is stopping."""
        if self.closing:
            return False
        woken = asyncio.ensure_future(since.wait())
        try:
            await asyncio.wait([woken, gone] if gone else [woken], timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)
        finally:
            woken.cancel()
        return woken.done() and not woken.cancelled() and not self.closing

    def stop_waiting(self) -> None:
        """End every long poll and stream (from any thread, a signal handler too): a server
        waits for its open responses before it stops, and a change stream never ends."""
        def close() -> None:
            self.closing = True
            self.event.set()
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(close)


class API:
    """The handlers, over one Database."""

    def __init__(self, db: agentstate.Database) -> None:
        self.db = db
        self.notifier = Notifier(db)
        self._tokens: dict[str, tuple[float, agentstate.Principal | None]] = {}

    # -- who is calling -----------------------------------------------------------

    async def principal(self, request: Request) -> agentstate.Principal:
        token = h.bearer(request)
        now = time.monotonic()
        cached = self._tokens.get(token)
        if cached is None or cached[0] < now:
            found = await h.blocking(self.db.tokens.principal, token)
            if len(self._tokens) > 4096:
                self._tokens.clear()
            self._tokens[token] = cached = (now + TOKEN_CACHE_S, found)
        if cached[1] is None:
            raise Unauthorized("unknown token")
        return h.acting(cached[1], request)

    async def whoami(self, request: Request) -> Response:
        p = await self.principal(request)
        return h.JSON({"name": p.name, "admin": p.admin})

    async def admin(self, request: Request) -> agentstate.Principal:
        p = await self.principal(request)
        if not p.admin:
            raise agentstate.Forbidden(f"only an admin may do this ({p.name} is not one)")
        return p

    # -- keys -----------------------------------------------------------------------

    async def scope(self, request: Request) -> agentstate.Scope:
        p = await self.principal(request)
        params = request.path_params
        if "session_id" in params:  # a session's own state, after the access check
            return await h.blocking(self.db.sessions.state, params["session_id"], p)
        scope = self.db.scope(params["kind"], params["id"])
        if scope.kind == "session" and await self.others_sessions(p, {scope.id}):
            # another principal's session is as absent here as under /v1/sessions
            raise NotFound(f"no session {scope.id!r}")
        return scope

    async def get_key(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        if "application/octet-stream" in request.headers.get("accept", ""):
            data = await h.blocking(s.get_bytes, key)
            if data is None:
                raise NotFound(f"no key {key!r} in {s.kind}:{s.id}")
            return Response(data, media_type="application/octet-stream")
        try:
            value, version = await h.blocking(s.get_versioned, key)
        except json.JSONDecodeError as e:
            raise InvalidValue(f"the stored bytes are not JSON ({e}): ask with Accept: "
                               "application/octet-stream") from None
        if version == 0:
            raise NotFound(f"no key {key!r} in {s.kind}:{s.id}")
        return h.JSON({"key": key, "value": value, "version": version})

    async def put_key(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        if request.headers.get("content-type", "").startswith("application/octet-stream"):
            data = await h.read_body(request, 2 * MIB)
            version = await h.blocking(
                s.put_bytes, key, data, if_version=h.query_int(request, "if_version"),
                ttl=h.query_number(request, "ttl", 1e-9, 1e11))
            return h.JSON({"version": version})
        b = await h.json_body(request, PutBody, BODY_LIMIT)
        if b.keep_ttl and b.ttl is not None:
            raise InvalidValue("keep_ttl and ttl exclude each other")
        version = await h.blocking(s.put, key, b.value, if_version=b.if_version,
                                   ttl=KEEP if b.keep_ttl else b.ttl)
        return h.JSON({"version": version})

    async def delete_key(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        deleted = await h.blocking(s.delete, key, if_version=h.query_int(request, "if_version"))
        return h.JSON({"deleted": deleted})

    async def append(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        b = await h.json_body(request, AppendBody, BODY_LIMIT)
        r = await h.blocking(s.append, key, b.items, ttl=b.ttl)
        return h.JSON({"length": r.length, "version": r.version})

    async def pop(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        b = await h.json_body(request, PopBody, KIB)
        return h.JSON({"items": await h.blocking(s.pop, key, b.n)})

    async def touch(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        b = await h.json_body(request, TouchBody, KIB)
        touched = await h.blocking(s.touch, key, b.ttl)
        at = await h.blocking(s.expires_at, key) if touched else None
        return h.JSON({"touched": touched, "expires_at": _iso(at)})

    async def expires_at(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        return h.JSON({"expires_at": _iso(await h.blocking(s.expires_at, key))})

    async def slice(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        start = h.query_int(request, "start", 0, lo=-(2**63))
        stop = h.query_int(request, "stop", None, lo=-(2**63))
        return h.JSON({"items": await h.blocking(s.slice, key, start, stop)})

    async def length(self, request: Request) -> Response:
        s, key = await self.scope(request), request.path_params["key"]
        return h.JSON({"length": await h.blocking(s.length, key)})

    async def keys(self, request: Request) -> Response:
        s = await self.scope(request)
        limit = h.query_int(request, "limit", None)
        keys = await h.blocking(s.list, request.query_params.get("prefix", ""),
                                after=request.query_params.get("after") or None, limit=limit)
        return h.JSON({"keys": keys, "next": keys[-1] if limit and len(keys) == limit else None})

    async def batch(self, request: Request) -> Response:
        p = await self.principal(request)
        b = await h.json_body(request, BatchBody, BATCH_LIMIT)
        sessions = {op.scope.partition(":")[2] for op in b.ops if op.scope.startswith("session:")}
        if await self.others_sessions(p, sessions):  # as absent here as anywhere else
            raise NotFound("no session: a batch op names a session this principal may not use")

        def apply() -> list[Any]:
            with self.db.batch() as bt:
                for op in b.ops:
                    kind, sep, sid = op.scope.partition(":")
                    if not sep:
                        raise agentstate.InvalidKey(f"scope must be KIND:ID, got {op.scope!r}")
                    target = bt.scope(kind, sid)
                    if op.op == "put":
                        target.put(op.key, op.value, if_version=op.if_version, ttl=op.ttl)
                    elif op.op == "delete":
                        target.delete(op.key, if_version=op.if_version)
                    else:
                        target.append(op.key, op.items, ttl=op.ttl)
            return bt.results or []

        results = await h.blocking(apply)
        return h.JSON({"results": [_result(r) for r in results]})

    # -- runs -------------------------------------------------------------------------

    async def runs_list(self, request: Request) -> Response:
        await self.principal(request)
        after, limit = _page(request)
        runs = await h.blocking(self.db.runs.list, after=after, limit=limit)
        return h.JSON({"runs": [_summary(r) for r in runs], "next": _next(runs, limit)})

    async def run_get(self, request: Request) -> Response:
        await self.principal(request)
        run_id = request.path_params["run_id"]
        # The backend's own read (the seam's run_read): a remote load() checks the
        # history against its recorded bounds and format as a local one does.
        got = await h.blocking(self.db._ops.run_read, _run_id(run_id))
        if got is None:
            raise agentstate.RunNotFound(f"no run {run_id!r}")
        (snapshot, next_seq, fmt, first, *_), rows = got
        try:
            entries = [json.loads(text) for _, text in rows]
            snap = None if snapshot is None else json.loads(snapshot)
        except ValueError as e:
            raise agentstate.Damaged(f"run {run_id!r}: a stored entry or the snapshot is not "
                                     f"JSON: {e}") from None
        return h.JSON({"id": run_id, "snapshot": snap, "entries": entries, "first_seq": first,
                       "next_seq": next_seq, "format": fmt})

    async def run_head(self, request: Request) -> Response:
        await self.principal(request)
        head = await h.blocking(self.db.runs.head, request.path_params["run_id"])
        if head is None:
            raise agentstate.RunNotFound(f"no run {request.path_params['run_id']!r}")
        return h.JSON({"id": head.id, "snapshot": head.snapshot, "first_seq": head.first_seq,
                       "next_seq": head.next_seq, "format": head.format,
                       "created_at": _iso(head.created_at), "updated_at": _iso(head.updated_at)})

    async def run_delete(self, request: Request) -> Response:
        await self.principal(request)
        return h.JSON({"deleted": await h.blocking(self.db.runs.delete, request.path_params["run_id"])})

    async def run_write(self, request: Request) -> Response:
        await self.principal(request)
        b = await h.json_body(request, WriteBody, RUN_LIMIT)
        await h.blocking(self.db.runs.write, request.path_params["run_id"], b.entries, b.snapshot,
                         create=b.create)
        return h.JSON({"written": True})

    async def run_entries(self, request: Request) -> Response:
        await self.principal(request)
        entries = await h.blocking(self.db.runs.entries, request.path_params["run_id"],
                                   h.query_int(request, "since", 0), h.query_int(request, "limit"))
        return h.JSON({"entries": entries})

    async def run_tail(self, request: Request) -> Response:
        await self.principal(request)
        n = h.query_int(request, "n", 20)
        return h.JSON({"entries": await h.blocking(self.db.runs.tail, request.path_params["run_id"], n)})

    async def run_load(self, request: Request) -> Response:
        await self.principal(request)
        rec = await h.blocking(self.db.runs.load, request.path_params["run_id"])
        return h.JSON({"entries": rec.entries, "snapshot": rec.snapshot})

    async def run_fork(self, request: Request) -> Response:
        await self.principal(request)
        b = await h.json_body(request, ForkBody, KIB)
        await h.blocking(self.db.runs.fork, request.path_params["run_id"], b.new_id, upto=b.upto)
        return h.JSON({"id": b.new_id})

    async def run_trim(self, request: Request) -> Response:
        await self.principal(request)
        b = await h.json_body(request, TrimBody, KIB)
        n = await h.blocking(self.db.runs.trim, request.path_params["run_id"], before=b.before)
        return h.JSON({"removed": n})

    async def runs_prune(self, request: Request) -> Response:
        await self.principal(request)
        b = await h.json_body(request, PruneRunsBody, KIB)
        ids = await h.blocking(self.db.runs.prune, older_than=b.older_than,
                               finished_only=b.finished_only)
        return h.JSON({"runs": ids})

    # -- sessions and turns ---------------------------------------------------------------

    async def sessions_create(self, request: Request) -> Response:
        p = await self.principal(request)
        b = await h.json_body(request, SessionBody, BODY_LIMIT)
        return h.JSON(_session(await h.blocking(self.db.sessions.create, p, metadata=b.metadata)),
                      status_code=201)

    async def sessions_list(self, request: Request) -> Response:
        p = await self.principal(request)
        after, limit = _page(request)
        found = await h.blocking(self.db.sessions.list, p, after=after, limit=limit)
        return h.JSON({"sessions": [_session(s) for s in found], "next": _next(found, limit)})

    async def session_get(self, request: Request) -> Response:
        p = await self.principal(request)
        return h.JSON(_session(await h.blocking(self.db.sessions.get, request.path_params["session_id"], p)))

    async def session_delete(self, request: Request) -> Response:
        p = await self.principal(request)
        await h.blocking(self.db.sessions.delete, request.path_params["session_id"], p)
        return h.JSON({"deleted": True})

    async def sessions_prune(self, request: Request) -> Response:
        p = await self.principal(request)
        b = await h.json_body(request, PruneSessionsBody, KIB)
        return h.JSON({"sessions": await h.blocking(self.db.sessions.prune, p, idle_for=b.idle_for)})

    async def session_release(self, request: Request) -> Response:
        p = await self.principal(request)
        return h.JSON(_turn(await h.blocking(self.db.sessions.release, request.path_params["session_id"], p)))

    async def turns_list(self, request: Request) -> Response:
        p = await self.principal(request)
        after, limit = _page(request)
        turns = await h.blocking(self.db.sessions.turns, request.path_params["session_id"], p,
                                 after=after, limit=limit)
        return h.JSON({"turns": [_turn(t) for t in turns], "next": _next(turns, limit)})

    async def turns_by_status(self, request: Request) -> Response:
        p = await self.principal(request)
        after, limit = _page(request)
        given = ",".join(request.query_params.getlist("status"))  # ?status=a,b or ?status=a&status=b
        status = given.split(",") if given else agentstate._sessions.FINDABLE
        turns = await h.blocking(self.db.sessions.turns_by_status, p, status, after=after, limit=limit)
        return h.JSON({"turns": [_turn(t) for t in turns], "next": _next(turns, limit)})

    async def turn_start(self, request: Request) -> Response:
        p = await self.principal(request)
        b = await h.json_body(request, TurnBody, BODY_LIMIT)
        t = await h.blocking(self.db.sessions.start_turn, request.path_params["session_id"], p,
                             input=b.input, lease=b.lease, queued=b.queued)
        return h.JSON(_turn(t), status_code=201)

    async def turn_get(self, request: Request) -> Response:
        p = await self.principal(request)
        return h.JSON(_turn(await h.blocking(self.db.sessions.get_turn, request.path_params["turn_id"], p)))

    async def turn_action(self, request: Request) -> Response:
        p = await self.principal(request)
        turn_id, action = request.path_params["turn_id"], request.path_params["action"]
        sessions = self.db.sessions
        model = ACTIONS.get(action)
        if model is None:
            raise NotFound(f"no action {action!r} (start, heartbeat, hold, decide, resume, finish, fail)")
        b = await h.json_body(request, model, BODY_LIMIT)

        def act() -> agentstate.Turn:
            if action == "decide":
                return sessions.decide(turn_id, p, b.decision)
            if action == "resume":
                return sessions.resume(turn_id, p, lease=b.lease if b.lease is not None else 60.0)
            t = sessions.get_turn(turn_id, p)
            if action == "start":
                return t.start(b.lease if b.lease is not None else 60.0)
            if action == "heartbeat":
                return t.heartbeat(b.lease)
            if action == "hold":
                return t.hold(b.request)
            if action == "finish":
                return t.finish(b.result)
            return t.fail(b.error)

        return h.JSON(_turn(await h.blocking(act)))

    # -- changes and settings ----------------------------------------------------------------

    def _feed_args(self, request: Request) -> tuple[dict[str, Any], int]:
        flt = {k: request.query_params[k] for k in ("topic", "kind", "scope_id", "key")
               if request.query_params.get(k)}
        return flt, h.query_int(request, "limit", 1000, lo=1) or 1000

    async def others_sessions(self, p: agentstate.Principal, ids: set[str]) -> set[str]:
        """Which of ``ids`` are sessions that ``p`` may not see (none for an admin)."""
        if p.admin or not ids:
            return set()

        def check() -> set[str]:
            own = {s.id for s in self.db.sessions.list(p)}
            out = set()
            for sid in ids - own:
                try:
                    self.db.sessions.get(sid, SEE_ALL)
                    out.add(sid)  # a session, and not theirs
                except NotFound:
                    pass  # a plain scope of kind session: anyone's
            return out

        return await h.blocking(check)

    async def visible(self, p: agentstate.Principal,
                      found: list[agentstate.Change]) -> list[agentstate.Change]:
        """What of the feed a principal may see: an admin all; anyone else every change but
        those of other principals' sessions (their ids, turns and state keys), deleted
        sessions included."""
        if p.admin or not any(_of_a_session(c) for c in found):
            return found
        own = {s.id for s in await h.blocking(self.db.sessions.list, p)}
        sessions = {c.scope_id for c in found if c.topic == "session"}  # these were sessions
        hidden = (sessions - own) | await self.others_sessions(
            p, {c.scope_id for c in found if _of_a_session(c)} - sessions - own)
        return [c for c in found if not (_of_a_session(c) and c.scope_id in hidden)]

    async def changes(self, request: Request) -> Response:
        p = await self.principal(request)
        since = h.query_int(request, "since", 0)
        wait = h.query_number(request, "wait", 0, MAX_WAIT) or 0.0
        flt, limit = self._feed_args(request)
        deadline = time.monotonic() + wait
        gone = asyncio.ensure_future(h.disconnected(request)) if wait else None
        try:
            while True:
                event = self.notifier.event  # before the read: a change during it is not missed
                found = await h.blocking(self.db.changes, since, limit=limit, **flt)
                shown = await self.visible(p, found)
                since = found[-1].seq if found else since  # past what was read, shown or not
                left = deadline - time.monotonic()
                if shown or left <= 0 or self.notifier.closing or (gone and gone.done()):
                    return h.JSON({"changes": [_change(c) for c in shown], "last": since})
                if not found:  # no connection held meanwhile
                    await self.notifier.wait(min(left, 5.0), event, gone)
        finally:
            if gone:
                gone.cancel()

    async def changes_head(self, request: Request) -> Response:
        await self.principal(request)
        return h.JSON({"head": await h.blocking(self.db.last_change)})

    async def changes_stream(self, request: Request) -> Response:
        p = await self.principal(request)
        since = h.query_int(request, "since", None)
        last_id = request.headers.get("last-event-id", "")
        if since is None:
            since = int(last_id) if h.ascii_int(last_id) and int(last_id) >= 0 \
                else await h.blocking(self.db.last_change)
        flt, limit = self._feed_args(request)
        await h.blocking(self.db.changes, since, limit=1, **flt)  # refuse a bad cursor up front

        async def events() -> AsyncIterator[bytes]:
            cursor = since
            yield b": agentstate change stream\n\n"
            while not self.notifier.closing:
                event = self.notifier.event  # before the read: a change during it is not missed
                found = await h.blocking(self.db.changes, cursor, limit=limit, **flt)
                for c in await self.visible(p, found):
                    yield b"id: %d\ndata: " % c.seq + h.dumps(_change(c)) + b"\n\n"
                cursor = found[-1].seq if found else cursor
                if not found and not await self.notifier.wait(15.0, event) \
                        and not self.notifier.closing:
                    yield b": keep-alive\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache", "x-accel-buffering": "no"})

    async def settings(self, request: Request) -> Response:
        await self.principal(request)
        return h.JSON(await h.blocking(self.db.settings))

    async def set_setting(self, request: Request) -> Response:
        await self.admin(request)
        b = await h.json_body(request, SettingBody, KIB)
        await h.blocking(self.db.set_setting, request.path_params["name"], b.value)
        return h.JSON(await h.blocking(self.db.settings))

    async def check(self, request: Request) -> Response:
        await self.admin(request)
        return h.JSON({"problems": await h.blocking(self.db.check)})

    async def info(self, request: Request) -> Response:
        await self.admin(request)
        return h.JSON(await h.blocking(self.db.info))

    async def health(self, request: Request) -> Response:
        return h.JSON({"ok": True, "version": agentstate.__version__})

    async def openapi(self, request: Request) -> Response:
        from .openapi import document

        return h.JSON(document(ROUTES))


# -- shapes of the answers ---------------------------------------------------------------

def _iso(dt: Any) -> str | None:
    """The store's own time format: ISO-8601 UTC, always with microseconds and a Z."""
    return None if dt is None else dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _result(r: Any) -> Any:
    if isinstance(r, agentstate.Appended):
        return {"length": r.length, "version": r.version}
    if isinstance(r, bool):
        return {"deleted": r}
    return {"version": r}


def _summary(r: agentstate.SavedState) -> dict[str, Any]:
    return {"id": r.id, "task": r.task, "turn": r.turn, "stopped_by": r.stopped_by,
            "finished": r.finished, "created_at": _iso(r.created_at), "updated_at": _iso(r.updated_at)}


def _session(s: agentstate.SessionInfo) -> dict[str, Any]:
    return {"id": s.id, "owner": s.owner, "created_at": _iso(s.created_at), "metadata": s.metadata}


def _turn(t: agentstate.Turn) -> dict[str, Any]:
    return {"id": t.id, "session_id": t.session_id, "n": t.n, "status": t.status, "input": t.input,
            "request": t.request, "decision": t.decision, "result": t.result, "error": t.error,
            "lease": t.lease, "lease_until": t.lease_until, "created_at": _iso(t.created_at),
            "updated_at": _iso(t.updated_at)}


def _change(c: agentstate.Change) -> dict[str, Any]:
    return {**c._asdict(), "at": _iso(c.at)}


SEE_ALL = agentstate.Principal("agentstate-server", admin=True)  # to tell sessions from scopes


def _page(request: Request) -> tuple[str | None, int | None]:
    """A list route's ``after`` (the id of the previous page's last item) and ``limit``."""
    return request.query_params.get("after") or None, h.query_int(request, "limit", None, lo=1)


def _next(items: list[Any], limit: int | None) -> str | None:
    """The ``after`` of the next page: the last id, when the page came back full."""
    return items[-1].id if limit and len(items) == limit else None


def _of_a_session(c: agentstate.Change) -> bool:
    return c.topic == "session" or (c.topic == "kv" and c.kind == "session")


def _run_id(run_id: str) -> str:
    from agentstate._encoding import check_key

    return check_key(run_id, "run id")


ACTIONS = {"start": LeaseBody, "heartbeat": LeaseBody, "hold": HoldBody, "decide": DecideBody,
           "resume": LeaseBody, "finish": FinishBody, "fail": FailBody}


def _routes(api: API) -> list[Route_]:
    kv = "/v1/scopes/{kind}/{id}/keys"
    own = "/v1/sessions/{session_id}/state/keys"
    out: list[Route_] = []
    for base, tag in ((kv, "scope"), (own, "session state")):
        out += [
            Route_("GET", base + "/{key}", api.get_key, f"Read a key ({tag})", answer="Versioned",
                   errors=(400, 404), extra={"bytes_answer": True}),
            Route_("PUT", base + "/{key}", api.put_key, f"Write a key ({tag})", body=PutBody,
                   query=("if_version", "ttl"), answer="Version", errors=(400, 409, 413),
                   extra={"bytes_body": True}),
            Route_("DELETE", base + "/{key}", api.delete_key, f"Delete a key ({tag})",
                   query=("if_version",), answer="Deleted", errors=(400, 409)),
            Route_("POST", base + "/{key}/append", api.append, f"Append to a list ({tag})",
                   body=AppendBody, answer="Appended", errors=(400, 409, 413)),
            Route_("POST", base + "/{key}/pop", api.pop, f"Pop the last items ({tag})", body=PopBody,
                   answer="Items", errors=(400, 409, 413)),
            Route_("POST", base + "/{key}/touch", api.touch, f"Set a key's expiry ({tag})",
                   body=TouchBody, answer="Touched", errors=(400, 413)),
            Route_("GET", base + "/{key}/expires_at", api.expires_at, f"When a key expires ({tag})",
                   answer="ExpiresAt"),
            Route_("GET", base + "/{key}/slice", api.slice, f"Items of a list ({tag})",
                   query=("start", "stop"), answer="Items", errors=(400, 409)),
            Route_("GET", base + "/{key}/length", api.length, f"Length of a list ({tag})",
                   answer="Length", errors=(400, 409)),
            Route_("GET", base, api.keys, f"List keys ({tag})", query=("prefix", "after", "limit"),
                   answer="Keys"),
        ]
    for r in out:
        if r.path.startswith(own):
            r.errors = tuple(sorted({*r.errors, 404}))
    out += [
        Route_("POST", "/v1/batch", api.batch, "Writes applied all or none", body=BatchBody,
               answer="BatchResults", errors=(400, 409, 413)),
        Route_("GET", "/v1/runs", api.runs_list, "Runs, newest update first", query=("after", "limit"),
               answer="Runs", errors=(400, 404)),
        Route_("POST", "/v1/runs/prune", api.runs_prune, "Delete old runs", body=PruneRunsBody,
               answer="RunIds", errors=(400, 413)),
        Route_("GET", "/v1/runs/{run_id}", api.run_get, "A run: entries and snapshot",
               answer="Run", errors=(400, 404)),
        Route_("GET", "/v1/runs/{run_id}/head", api.run_head, "A run's snapshot and bounds, without "
               "its history", answer="RunHead", errors=(400, 404, 500)),
        Route_("DELETE", "/v1/runs/{run_id}", api.run_delete, "Delete a run", answer="Deleted"),
        Route_("POST", "/v1/runs/{run_id}/write", api.run_write, "Add entries, replace the snapshot",
               body=WriteBody, answer="Written", errors=(400, 404, 409, 413)),
        Route_("GET", "/v1/runs/{run_id}/entries", api.run_entries, "Entries from a seq",
               query=("since", "limit"), answer="Entries"),
        Route_("GET", "/v1/runs/{run_id}/tail", api.run_tail, "The last entries", query=("n",),
               answer="Entries"),
        Route_("GET", "/v1/runs/{run_id}/load", api.run_load, "The run ready to resume",
               answer="Record", errors=(400, 404, 500)),
        Route_("POST", "/v1/runs/{run_id}/fork", api.run_fork, "Fork a run", body=ForkBody,
               answer="Id", errors=(400, 404, 409, 413)),
        Route_("POST", "/v1/runs/{run_id}/trim", api.run_trim, "Remove old entries", body=TrimBody,
               answer="Removed", errors=(400, 404, 413)),
        Route_("POST", "/v1/sessions", api.sessions_create, "A new session", body=SessionBody,
               ok=201, answer="Session", errors=(400, 403, 413)),
        Route_("GET", "/v1/sessions", api.sessions_list, "My sessions (all: admin)",
               query=("after", "limit"), answer="Sessions", errors=(400, 403, 404)),
        Route_("POST", "/v1/sessions/prune", api.sessions_prune, "Delete idle sessions (admin)",
               body=PruneSessionsBody, answer="SessionIds", errors=(400, 403, 413)),
        Route_("GET", "/v1/sessions/{session_id}", api.session_get, "A session", answer="Session",
               errors=(400, 403, 404)),
        Route_("DELETE", "/v1/sessions/{session_id}", api.session_delete, "Delete a session",
               answer="Deleted", errors=(400, 403, 404)),
        Route_("GET", "/v1/sessions/{session_id}/turns", api.turns_list, "A session's turns",
               query=("after", "limit"), answer="Turns", errors=(400, 403, 404)),
        Route_("POST", "/v1/sessions/{session_id}/turns", api.turn_start, "Start (or queue) a turn",
               body=TurnBody, ok=201, answer="Turn", errors=(400, 403, 404, 409, 413)),
        Route_("POST", "/v1/sessions/{session_id}/release", api.session_release,
               "End the active turn (admin)", answer="Turn", errors=(400, 403, 404, 409)),
        Route_("GET", "/v1/turns", api.turns_by_status, "Open turns by status (mine; all: admin)",
               query=("status", "after", "limit"), answer="Turns", errors=(400, 403, 404)),
        Route_("GET", "/v1/turns/{turn_id}", api.turn_get, "A turn", answer="Turn",
               errors=(400, 403, 404)),
        Route_("POST", "/v1/turns/{turn_id}/{action}", api.turn_action, "Move a turn", body="action",
               answer="Turn", errors=(400, 403, 404, 409, 413)),
        Route_("GET", "/v1/changes", api.changes, "Changes after a seq (a long poll with wait)",
               query=("since", "wait", "topic", "kind", "scope_id", "key", "limit"), answer="Changes",
               errors=(400, 410)),
        Route_("GET", "/v1/changes/head", api.changes_head, "The newest change's seq",
               answer="Head", errors=()),
        Route_("GET", "/v1/changes/stream", api.changes_stream, "Changes as server-sent events",
               query=("since", "topic", "kind", "scope_id", "key", "limit"), answer="stream",
               errors=(400, 410)),
        Route_("GET", "/v1/settings", api.settings, "The store's settings", answer="Settings",
               errors=()),
        Route_("PUT", "/v1/settings/{name}", api.set_setting, "Change a setting (admin)",
               body=SettingBody, answer="Settings", errors=(400, 403, 413)),
        Route_("GET", "/v1/admin/check", api.check, "Integrity and invariants (admin)",
               answer="Problems", errors=(403, 500)),
        Route_("GET", "/v1/admin/info", api.info, "Sizes, versions, counts (admin)", answer="object",
               errors=(403,)),
        Route_("GET", "/v1/whoami", api.whoami, "Who a request acts as", answer="object", errors=()),
        Route_("GET", "/v1/health", api.health, "Liveness", answer="Health", errors=(), auth=False),
        Route_("GET", "/openapi.json", api.openapi, "This document", answer="object", errors=(),
               auth=False),
    ]
    return out


ROUTES: list[Route_] = []


def create_app(db: agentstate.Database) -> Starlette:
    """The State API over ``db`` (a Database from ``agentstate.open``)."""
    api = API(db)
    routes = _routes(api)
    ROUTES[:] = routes

    async def on_error(request: Request, exc: Exception) -> Response:
        if isinstance(exc, AgentStateError):
            return h.error_response(exc)
        if isinstance(exc, json.JSONDecodeError):
            return h.error_response(InvalidValue(f"stored bytes are not JSON: {exc}"))
        log.exception("unexpected error in %s %s", request.method, request.url.path)
        return h.JSON({"error": {"code": "error", "message": "internal error (see the server's log)"}},
                      status_code=500)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        code = {404: "not_found", 405: "method_not_allowed"}.get(status, "error")
        return h.JSON({"error": {"code": code, "message": f"{request.method} {request.url.path}: "
                                 f"{getattr(exc, 'detail', 'not found')}"}}, status_code=status)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        api.notifier.loop = asyncio.get_running_loop()
        api.notifier.task = asyncio.create_task(api.notifier.run())
        try:
            yield
        finally:
            api.notifier.task.cancel()

    from starlette.exceptions import HTTPException

    from . import ui

    app = Starlette(
        routes=[Route(r.path, r.handler, methods=[r.method]) for r in routes],
        middleware=[ui.middleware(api)],  # the pages at /ui, beside the API (not in its document)
        exception_handlers={Exception: on_error, AgentStateError: on_error, HTTPException: not_found},
        lifespan=lifespan,
    )
    app.state.notifier = api.notifier  # serve's Ctrl-C calls its stop_waiting()
    return app
