"""The handlers of the pages: sign the caller in, read a page in a worker thread, render it."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timezone
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, urlencode

import jinja2
from starlette.requests import ClientDisconnect, Request
from starlette.exceptions import HTTPException
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.middleware import Middleware
from starlette.routing import BaseRoute, Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

import agentstate
from agentstate.errors import (AgentStateError, CursorExpired, InvalidValue, NotFound, TooLarge,
                               Unauthorized)

from agentstate._encoding import check_key
from agentstate._grants import RUNS

from .. import _access as access
from .. import _feedread as feed
from .. import _http as h
from .. import _json
from .._limits import LIMITS
from . import _history
from . import _pages as pages
from . import _render
from ._signin import SignIn, SignIns, csrf_ok, safe_next, same_origin
from ._timeline import mark_claims, timeline

if TYPE_CHECKING:
    from .._api import API

TURNS = 20  # turns on a session's page
FORM_LIMIT = LIMITS.form_body  # a decision of up to 1 MiB, form-encoded
SIGNIN_FORM = LIMITS.signin_form  # signing in and out: a token, a path, a CSRF token
STREAM_PAGE = 200  # changes a page's stream reads at a time
# Nothing from elsewhere: our own script and style only; no inline script can run.
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "connect-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",  # no-referrer would make Origin "null" on our own POSTs
    "cache-control": "no-store",
}
STATIC = {"ui.js": "text/javascript; charset=utf-8", "ui.css": "text/css; charset=utf-8"}


def _when(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):  # a lease's end: Unix seconds
        value = datetime.fromtimestamp(value, timezone.utc)
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return "" if value is None else str(value)


ENV = jinja2.Environment(loader=jinja2.PackageLoader("agentstate.server.ui", "templates"),
                         autoescape=True)
ENV.filters.update(pretty=_render.pretty, when=_when, short=_render.short, size=pages.size_of,
                   url=lambda s: quote(str(s), safe=""))


class UI:
    def __init__(self, api: API) -> None:
        self.api = api
        self.db: agentstate.Database = api.db
        self.signins = SignIns(api.db, api.cookie)

    # -- plumbing ---------------------------------------------------------------------

    async def render(self, request: Request, name: str, signin: SignIn | None, status: int = 200,
                     **ctx: Any) -> HTMLResponse:
        """The page, rendered in a worker thread with its budget for values (_render)."""
        query = [(k, v) for k, v in request.query_params.multi_items() if k != "format"]
        ctx.update(request=request, me=signin.principal if signin else None,
                   csrf=signin.csrf if signin else "", since=getattr(request.state, "since", ""),
                   raw_url=request.url.path + "?" + urlencode([*query, ("format", "json")]))

        def make() -> str:
            _render.start_page()
            return ENV.get_template(name).render(**ctx)

        return HTMLResponse(await h.blocking(make), status_code=status, headers=HEADERS)

    async def raw(self, data: Any) -> Response:
        """A page's data as JSON (``?format=json``): the whole of what the page cut (bytes:
        JSON already)."""
        body = data if isinstance(data, bytes) else await h.blocking(h.dumps, data)
        return Response(body, media_type="application/json",
                        headers={**HEADERS, "content-disposition": "inline"})

    def page(self, fn: Callable[[Request, SignIn], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        """A handler for signed-in callers only; the store's refusals as pages."""

        async def handler(request: Request) -> Response:
            signin = await self.signins.find(request)
            if signin is None:
                if request.method != "GET":
                    return await self.render(request, "error.html", None, 401, title="Signed out",
                                       message="Sign in again: the sign-in has ended.")
                nxt = request.url.path + (f"?{request.url.query}" if request.url.query else "")
                return RedirectResponse("/ui/login?next=" + quote(nxt, safe=""), 303, headers=HEADERS)
            try:
                # The feed's head before the page's own reads: the page's stream starts
                # there, so a write made while the page renders or its script connects shows.
                request.state.since = await h.blocking(self.db.last_change)
                return await fn(request, signin)
            except AgentStateError as e:
                status = 404 if isinstance(e, NotFound) else e.status
                return await self.render(request, "error.html", signin, status,
                                         title=type(e).__name__, message=str(e))
            except json.JSONDecodeError as e:
                return await self.render(request, "error.html", signin, 400, title="Not JSON",
                                         message=f"the stored bytes are not JSON: {e}")

        return handler

    async def form(self, request: Request, limit: int = FORM_LIMIT) -> dict[str, str]:
        """The form's fields; a big one parsed in a worker thread."""
        raw = await h.read_body(request, limit)

        def parse() -> dict[str, str]:
            try:
                return dict(parse_qsl(raw.decode("utf-8"), keep_blank_values=True,
                                      strict_parsing=False, max_num_fields=100))
            except UnicodeDecodeError:
                raise InvalidValue("the form is not UTF-8") from None
            except ValueError as e:  # more fields than any of our forms has
                raise InvalidValue(f"not one of our forms: {e}") from None

        return parse() if len(raw) <= 16 * 1024 else await h.blocking(parse)

    # -- signing in -------------------------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        return await self.render(request, "login.html", None, next=safe_next(request.query_params.get("next", "")),
                           error=None)

    async def login(self, request: Request) -> Response:
        if not same_origin(request):
            return await self.render(request, "error.html", None, 403, title="Refused",
                               message="a sign-in from another site's page")
        f = await self.form(request, SIGNIN_FORM)  # before signing in: small
        nxt = safe_next(f.get("next", ""))
        sid = await self.signins.start(f.get("token", "").strip())
        if sid is None:
            return await self.render(request, "login.html", None, 401, next=nxt, error="unknown token")
        r = RedirectResponse(nxt, 303, headers=HEADERS)
        r.set_cookie(self.signins.cookie, sid, path="/ui", httponly=True, samesite="strict",
                     secure=request.url.scheme == "https")
        return r

    async def logout(self, request: Request) -> Response:
        # Always ended, whatever the form says: a sign-out forced on someone is harmless,
        # while one refused in silence (a proxy that rewrites Host, a stale page's form)
        # would leave a live sign-in behind a browser that shows it signed out.
        await self.signins.end(request)
        r = RedirectResponse("/ui/login", 303, headers=HEADERS)
        r.delete_cookie(self.signins.cookie, path="/ui")
        return r

    # -- pages ------------------------------------------------------------------------

    async def overview(self, request: Request, s: SignIn) -> Response:
        o = await h.blocking(pages.overview, self.db, self.api.rule, s.principal, s.rules)
        return await self.render(request, "overview.html", s, o=o, watch="*")

    async def runs(self, request: Request, s: SignIn) -> Response:
        after = request.query_params.get("after") or None
        if after is not None:
            access.need(s.principal, s.rules, RUNS, after, False)
        rows = await h.blocking(lambda: self.db.runs._list(after, pages.PAGE + 1,
                                                           pages.run_grants(s.principal, s.rules)))
        return await self.render(request, "runs.html", s, runs=rows[:pages.PAGE], after=after,
                           next=_next(rows), watch="run")

    async def run(self, request: Request, s: SignIn) -> Response:
        run_id = request.path_params["run_id"]
        access.need(s.principal, s.rules, RUNS, check_key(run_id, "run id"), False)
        before = h.query_int(request, "before")
        rp = await h.blocking(pages.run_page, self.db, run_id, before)
        if _as_json(request):  # as stored: what the page shows may be cut
            return await self.raw(rp.raw)
        budget = [LIMITS.run_page_search]
        items = await h.blocking(timeline, rp.entries,
                                 lambda since, n: pages.entries(self.db, run_id, since, n, budget))
        await h.blocking(mark_claims, items, functools.partial(pages.fence_holds, self.db),
                         await h.blocking(self.db._ops.clock))  # the store's clock (SPEC §16)
        return await self.render(request, "run.html", s, rp=rp, items=items,
                           watch=f"run::{run_id}" if rp.newest else "")

    async def snapshot(self, request: Request, s: SignIn) -> Response:
        run_id = request.path_params["run_id"]
        access.need(s.principal, s.rules, RUNS, check_key(run_id, "run id"), False)
        snap, raw = await h.blocking(pages.snapshot_page, self.db, run_id)
        if _as_json(request):
            return await self.raw(raw)
        return await self.render(request, "snapshot.html", s, run_id=run_id, snapshot=snap,
                           watch=f"run::{run_id}")

    async def sessions(self, request: Request, s: SignIn) -> Response:
        after = request.query_params.get("after") or None
        rows = await h.blocking(lambda: self.db.sessions.list(s.principal, after=after,
                                                              limit=pages.PAGE + 1))
        return await self.render(request, "sessions.html", s, sessions=rows[:pages.PAGE], after=after,
                           next=_next(rows), watch="session")

    async def session(self, request: Request, s: SignIn) -> Response:
        sid = request.path_params["session_id"]
        after = request.query_params.get("after") or None

        def read() -> tuple[Any, ...]:
            info = self.db.sessions.get(sid, s.principal)
            turns = self.db.sessions.turns(sid, s.principal, after=after, limit=TURNS + 1)
            keys = _keys(self.db, self.db.sessions.state(sid, s.principal), None)
            return info, turns, keys

        info, turns, keys = await h.blocking(read)
        if _as_json(request):
            return await self.raw({"id": info.id, "owner": info.owner, "metadata": info.metadata,
                                   "turns": [_turn(t) for t in turns[:TURNS]]})
        return await self.render(request, "session.html", s, info=info, turns=turns[:TURNS], after=after,
                           next=_next(turns, TURNS), keys=keys,
                           watch=f"session::{sid} kv:session:{sid}")

    async def turns(self, request: Request, s: SignIn) -> Response:
        section = request.query_params.get("which", "")
        if section not in pages.SECTIONS:
            raise NotFound(f"no list of turns named {section!r} (one of {', '.join(pages.SECTIONS)})")
        after = request.query_params.get("after") or None
        rows = await h.blocking(lambda: self.db.sessions.turns_by_status(
            s.principal, pages.SECTIONS[section], after=after, limit=pages.PAGE + 1))
        title = {"active": "Queued and running turns", "held": "Turns held for a decision",
                 "expired": "Turns whose lease lapsed"}[section]
        return await self.render(request, "turns.html", s, title=title, turns=rows[:pages.PAGE],
                           which=section, after=after, next=_next(rows), watch="session")

    async def turn(self, request: Request, s: SignIn) -> Response:
        t = await h.blocking(self.db.sessions.get_turn, request.path_params["turn_id"], s.principal)
        if _as_json(request):
            return await self.raw(_turn(t))
        return await self.render(request, "turn.html", s, t=t, error=None, draft="",
                           watch=f"session::{t.session_id}:{t.id}")

    async def decide(self, request: Request, s: SignIn) -> Response:
        turn_id = request.path_params["turn_id"]
        f = await self.form(request)
        if await self.signins.recheck(s) is None:  # ended while the form was on its way
            return await self.render(request, "error.html", None, 401, title="Signed out",
                                     message="Sign in again: the sign-in has ended.")
        if not same_origin(request) or not csrf_ok(s, f.get("csrf", "")):
            return await self.render(request, "error.html", s, 403, title="Refused",
                               message="the form did not come from this page (reload it and try again)")
        text = f.get("decision", "")
        try:  # the API's parser: strict JSON, bounded depth and size, GIL-friendly
            decision = await h.blocking(_json.parse, text, LIMITS.json_values)
        except (InvalidValue, TooLarge) as e:
            error = f"the decision is not JSON the store takes: {e}"
        else:
            try:
                await h.blocking(self.db.sessions.decide, turn_id, s.principal, decision)
                return RedirectResponse(f"/ui/turns/{quote(turn_id, safe='')}", 303, headers=HEADERS)
            except AgentStateError as e:
                if isinstance(e, NotFound):
                    raise
                error = f"{type(e).__name__}: {e}"
        t = await h.blocking(self.db.sessions.get_turn, turn_id, s.principal)
        return await self.render(request, "turn.html", s, 400, t=t, error=error, draft=text,
                           watch=f"session::{t.session_id}:{t.id}")

    async def scopes(self, request: Request, s: SignIn) -> Response:
        kind, sid = request.query_params.get("kind", ""), request.query_params.get("id", "")
        as_of = h.query_int(request, "as_of")  # the feed page's form: a scope as of a change
        if kind and sid:
            then = "" if as_of is None else f"?as_of={as_of}"
            return RedirectResponse(f"/ui/scopes/{quote(kind, safe='')}/{quote(sid, safe='')}{then}",
                                    303, headers=HEADERS)
        head = await h.blocking(self.db.last_change)

        def read() -> list[Any]:
            recent, _ = pages.changes_window(self.db, head, 2000, topic="kv")
            return self.api.rule.visible(s.principal, recent, s.rules)

        seen: dict[tuple[str, str], Any] = {}
        for c in reversed(await h.blocking(read)):
            if (c.kind, c.scope_id) not in seen and len(seen) < pages.PAGE:
                seen[(c.kind, c.scope_id)] = c.at
        return await self.render(request, "scopes.html", s, recent=seen, watch="kv")

    async def scope(self, request: Request, s: SignIn) -> Response:
        kind, sid = request.path_params["kind"], request.path_params["id"]
        after = request.query_params.get("after") or None
        as_of = h.query_int(request, "as_of")  # SPEC §17: the scope as it was then

        def read() -> Any:
            sc = pages.scope(self.db, self.api.rule, kind, sid, s.principal, s.rules, as_of)
            return _keys(self.db, sc, after, as_of), _when_of(self.db, as_of)

        keys, then = await h.blocking(read)
        return await self.render(request, "scope.html", s, kind=kind, sid=sid, keys=keys, after=after,
                                 as_of=as_of, then=then,
                                 watch=f"kv:{kind}:{sid}" if as_of is None else "")

    async def key(self, request: Request, s: SignIn) -> Response:
        kind, sid, key = (request.path_params[k] for k in ("kind", "id", "key"))
        start = h.query_int(request, "start", 0) or 0
        as_of = h.query_int(request, "as_of")  # SPEC §17: the value as it was then
        before = h.query_int(request, "before")  # the history's older page

        def read() -> dict[str, Any]:
            sc = pages.scope(self.db, self.api.rule, kind, sid, s.principal, s.rules, as_of)
            row = pages.stored(self.db, sc, key, as_of)
            revisions, older = ([], None) if _as_json(request) else \
                _history.history(self.db, sc, check_key(key), before)
            if row is None and (_as_json(request) or not revisions):
                raise NotFound(f"no key {key!r} in {kind}:{sid}"
                               + ("" if as_of is None else f" as of change {as_of}"))
            if _as_json(request):  # the value as stored: JSON, or bytes
                assert row is not None
                return {"raw": row.data if row.data is not None else row.text.encode("utf-8"),
                        "bytes": row.data is not None}
            out: dict[str, Any] = {"revisions": revisions, "older": older,
                                   "then": _when_of(self.db, as_of), "absent": row is None}
            if row is None:  # gone (now, or then): its history is what the page shows
                return out
            out.update({"expires_at": sc.expires_at(key), "bytes": None, "items": None,
                        "size": row.size, "version": row.version})
            if row.data is not None:
                out.update(value=None, version=None, bytes=row.data[:4096])
                return out
            if row.is_list:  # a page of its items, each parsed as far as a page shows
                out["length"] = sc.length(key)
                texts = self.db._ops.kv_slice(sc.kind, sc.id, key, start, start + pages.PAGE,
                                              as_of=as_of) or []
                out["items"] = [pages.parse(t)[0] for t in texts]
            else:
                out["value"] = pages.parse(row.text)[0]
            return out

        k = await h.blocking(read)
        if "raw" in k:
            return Response(k["raw"], headers={**HEADERS, "content-disposition": "inline"},
                            media_type="application/octet-stream" if k["bytes"]
                            else "application/json")
        return await self.render(request, "key.html", s, kind=kind, sid=sid, key=key, k=k, start=start,
                                 page=pages.PAGE, as_of=as_of,
                                 watch=f"kv:{kind}:{sid}:{key}" if as_of is None else "")

    async def changes(self, request: Request, s: SignIn) -> Response:
        head = await h.blocking(self.db.last_change)
        before = h.query_int(request, "before")
        upto = head if before is None or before > head else before - 1
        def read() -> tuple[list[Any], bool]:
            rows, purged = pages.changes_window(self.db, upto, pages.PAGE)
            # others' sessions, and what the token's grants do not cover, left out
            return self.api.rule.visible(s.principal, rows, s.rules), purged

        rows, purged = await h.blocking(read)
        older = upto - pages.PAGE + 1 if upto > pages.PAGE and not purged else None
        return await self.render(request, "changes.html", s, changes=list(reversed(rows)), head=head,
                           newest=before is None or before > head, older=older, purged=purged,
                           watch="")

    async def stream(self, request: Request, s: SignIn) -> Response:
        """The change feed as server-sent events, for a signed-in page (an EventSource
        cannot send the API's Authorization header; it sends the cookie). It starts where
        the page was rendered (``?since=``; on a reconnect, the browser's Last-Event-ID),
        shows what the API would, and ends when the sign-in does."""
        last_id = request.headers.get("last-event-id", "")
        since = h.query_int(request, "since")
        if h.ascii_int(last_id) and int(last_id) >= 0:
            since = int(last_id)
        # counted before anything is read for it (SPEC §16); released when the response ends
        release = self.api.waits.take(s.principal) if request.method != "HEAD" else (lambda: None)
        if since is None:
            try:
                since = await h.blocking(self.db.last_change)
            except BaseException:
                release()
                raise
        db, rule, signin = self.db, self.api.rule, s

        def read_from(cursor: int) -> Any:
            return feed.read(db, rule, signin.principal, cursor, STREAM_PAGE, {}, signin.rules)

        async def still() -> None:
            if await self.signins.recheck(signin) is None:
                raise Unauthorized("signed out")

        async def expired(e: CursorExpired) -> tuple[bytes, int | None]:
            # away too long: the page reloads what it shows, and the stream goes on from now
            return h.sse({}, event="resync"), await h.blocking(db.last_change)

        async def events() -> AsyncIterator[bytes]:
            async for chunk in feed.stream(
                    self.api.notifier, read_from, since, still, first=b"retry: 1000\n\n",
                    on_expired=expired, denied=lambda e: h.sse({}, event="signedout")):
                yield chunk

        return h.event_stream(request, events(), release)

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in STATIC:
            return Response("not found", 404, media_type="text/plain")
        data = resources.files(__package__).joinpath("static", name).read_bytes()
        return Response(data, media_type=STATIC[name],
                        headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"})


def _next(rows: list[Any], size: int = pages.PAGE) -> str | None:
    """The ``after`` of the next page, when a read of size + 1 found more."""
    return rows[size - 1].id if len(rows) > size else None


def _keys(db: agentstate.Database, sc: agentstate.Scope, after: str | None,
          as_of: int | None = None) -> dict[str, Any]:
    """A page of a scope's keys, each with its version, size, expiry and a preview (``sc``
    and ``as_of``: of the past, SPEC §17)."""
    names = sc.list(after=after, limit=pages.PAGE + 1)
    rows = []
    for key in names[:pages.PAGE]:
        row = pages.stored(db, sc, key, as_of)
        if row is None:  # expired or deleted meanwhile
            continue
        if row.data is not None:
            version, preview = None, f"({row.size} bytes, not JSON)"
        else:  # the stored text, compact: a preview needs no parse
            version = row.version
            preview = row.text if len(row.text) <= 120 else row.text[:120] + "…"
        rows.append({"key": key, "version": version, "size": row.size, "preview": preview,
                     "expires_at": sc.expires_at(key)})
    return {"rows": rows, "next": names[pages.PAGE - 1] if len(names) > pages.PAGE else None}


def _when_of(db: agentstate.Database, seq: int | None) -> datetime | None:
    return None if seq is None else pages.moment(db, seq)


def _as_json(request: Request) -> bool:
    return request.query_params.get("format") == "json"


def _turn(t: agentstate.Turn) -> dict[str, Any]:
    return {"id": t.id, "session_id": t.session_id, "n": t.n, "status": t.status, "input": t.input,
            "request": t.request, "decision": t.decision, "result": t.result, "error": t.error,
            "created_at": _when(t.created_at), "updated_at": _when(t.updated_at)}


def routes(api: API, ui: UI | None = None) -> list[BaseRoute]:
    """The routes of the pages, to mount beside the API's."""
    ui = ui or UI(api)
    p = ui.page
    return [
        Route("/ui", p(ui.overview), methods=["GET"]),
        Route("/ui/", p(ui.overview), methods=["GET"]),
        Route("/ui/login", ui.login_form, methods=["GET"]),
        Route("/ui/login", ui.login, methods=["POST"]),
        Route("/ui/logout", ui.logout, methods=["POST"]),
        Route("/ui/runs", p(ui.runs), methods=["GET"]),
        Route("/ui/runs/{run_id}", p(ui.run), methods=["GET"]),
        Route("/ui/runs/{run_id}/snapshot", p(ui.snapshot), methods=["GET"]),
        Route("/ui/sessions", p(ui.sessions), methods=["GET"]),
        Route("/ui/sessions/{session_id}", p(ui.session), methods=["GET"]),
        Route("/ui/turns", p(ui.turns), methods=["GET"]),
        Route("/ui/turns/{turn_id}", p(ui.turn), methods=["GET"]),
        Route("/ui/turns/{turn_id}/decide", p(ui.decide), methods=["POST"]),
        Route("/ui/scopes", p(ui.scopes), methods=["GET"]),
        Route("/ui/scopes/{kind}/{id}", p(ui.scope), methods=["GET"]),
        Route("/ui/scopes/{kind}/{id}/keys/{key}", p(ui.key), methods=["GET"]),
        Route("/ui/changes", p(ui.changes), methods=["GET"]),
        Route("/ui/stream", p(ui.stream), methods=["GET"]),
        Route("/ui/static/{name}", ui.static, methods=["GET"]),
    ]


def middleware(api: API) -> Middleware:
    """Serve the pages (any path under /ui) before the API's router sees the request."""
    ui = UI(api)
    router = Router(routes(api, ui))

    class Pages:
        def __init__(self, app: ASGIApp) -> None:
            self.app = app

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            path = scope.get("path", "")
            if scope["type"] != "http" or not (path == "/ui" or path.startswith("/ui/")):
                return await self.app(scope, receive, send)
            try:
                await router(scope, receive, send)
            except HTTPException as e:  # no such page, or a method it does not take
                await Response(f"{e.status_code} {e.detail}", e.status_code, media_type="text/plain",
                               headers=e.headers)(scope, receive, send)
            except ClientDisconnect:  # it left halfway through a form: nobody to answer
                return
            except AgentStateError as e:  # outside a page's own handler: signing in, a form
                page = await ui.render(Request(scope), "error.html", None, e.status,
                                       title=type(e).__name__, message=str(e))
                await page(scope, receive, send)

    return Middleware(Pages)
