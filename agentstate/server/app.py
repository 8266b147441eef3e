"""The State API (SPEC §12): an ASGI app over one store, on top of the public objects.

Routes are listed once, in ``_routes.ROUTES``, with what each needs and what the OpenAPI
document says of it; ``_api.API.endpoint`` is the one place that authenticates; the
handlers (``views/``) parse, run the store call in a worker thread and answer JSON. One
exception handler turns every library error into ``{"error": {"code", "message", ...}}``
with its SPEC §6 status.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

import agentstate
from agentstate.errors import AgentStateError, InvalidValue

from . import _http as h
from ._api import API, Route_
from ._cors import CORS
from ._routes import ROUTES

log = logging.getLogger("agentstate.server")

__all__ = ["API", "ROUTES", "Route_", "create_app"]


async def on_error(request: Request, exc: Exception) -> Response:
    """The one exception handler of the API (the pages have their own, as pages)."""
    if isinstance(exc, AgentStateError):
        return h.error_response(exc)
    if isinstance(exc, json.JSONDecodeError):
        return h.error_response(InvalidValue(f"stored bytes are not JSON: {exc}"))
    if isinstance(exc, HTTPException):  # no such route, or a method it does not take
        # unknown_route, never not_found: a client that reached the wrong path (a proxy's
        # prefix not stripped) must not read "absent key" (SPEC §16)
        code = {404: "unknown_route", 405: "method_not_allowed"}.get(exc.status_code, "error")
        detail = ("no such route (is a proxy's path prefix left in the URL?)"
                  if exc.status_code == 404 and exc.detail == "Not Found" else exc.detail)
        return h.JSON({"error": {"code": code, "message": f"{request.method} {request.url.path}: "
                                 f"{detail}"}}, status_code=exc.status_code)
    if isinstance(exc, ClientDisconnect):  # it left halfway through its body: nobody to answer
        return Response(status_code=400)
    log.exception("unexpected error in %s %s", request.method, request.url.path)
    return h.JSON({"error": {"code": "error", "message": "internal error (see the server's log)"}},
                  status_code=500)


def create_app(db: agentstate.Database, *, cors_origins: Iterable[str] = ()) -> Starlette:
    """The State API over ``db`` (a Database from ``agentstate.open``). ``cors_origins``:
    the origins whose pages may call the API from a browser (SPEC §16; none: no CORS)."""
    from agentstate import mcp  # here: mcp's modules import the server's (no cycle at import)

    from . import ui

    api = API(db)
    api.routes = ROUTES
    over_mcp = mcp.over_http(api)  # /mcp: the store as MCP tools (SPEC §18), with the mcp extra

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        api.notifier.loop = asyncio.get_running_loop()
        api.notifier.task = asyncio.create_task(api.notifier.run())
        try:
            async with over_mcp.running():
                yield
        finally:
            api.notifier.task.cancel()

    app = Starlette(
        routes=[Route(r.path, api.endpoint(r), methods=[r.method]) for r in ROUTES],
        # CORS outermost (a preflight is answered before anything else looks at it); the
        # pages at /ui and MCP at /mcp, beside the API (not in its document).
        middleware=[*([Middleware(CORS, origins=cors_origins)] if cors_origins else []),
                    ui.middleware(api), *over_mcp.middleware],
        # Exception's handler runs in Starlette's outermost middleware, which raises the error
        # again (for the server's log); the others' do not: an expected error is no traceback.
        exception_handlers={c: on_error for c in (Exception, AgentStateError, HTTPException,
                                                  ClientDisconnect)},
        lifespan=lifespan,
    )
    app.state.notifier = api.notifier  # serve's Ctrl-C calls its stop_waiting()
    app.state.api = api
    return app
