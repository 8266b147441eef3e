"""``/mcp`` in ``agentstate serve``: MCP over streamable HTTP (SPEC §18), beside the State
API, with its bearer tokens, grants and owner rule.

Every request is authenticated by the API's one place for it (``API.caller``) before the
SDK's transport sees it: a missing, unknown, revoked or expired token is the API's 401 and
nothing more. Each tool call asks again (``HttpHost``), after its body was read. An MCP
session belongs to the token that opened it: a request with another token (or acting for
another principal) is answered as if the session did not exist. Like the pages at /ui,
``/mcp`` is no route of the API and not in its OpenAPI document.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from agentstate.errors import AgentStateError, Busy
import agentstate.server._http as h
from agentstate.server._api import API
from agentstate.server._limits import LIMITS

from ._caller import HttpHost
from ._server import build

PATH = "/mcp"


class OverHTTP:
    """The MCP endpoint of one API: ``middleware`` serves ``/mcp``; ``running()`` is its
    part of the app's lifespan (the SDK's session manager)."""

    def __init__(self, api: API) -> None:
        self.api = api
        self.server = build(HttpHost(api))
        self.manager: StreamableHTTPSessionManager | None = None  # while the app runs
        self.middleware = [Middleware(_Path, over=self)]
        self._key = secrets.token_bytes(32)  # names a token in memory, unlike the store's hash

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The SDK's session manager, for one run of the app (a manager runs only once)."""
        self.manager = StreamableHTTPSessionManager(
            app=self.server,
            # the largest body a value-carrying API route takes; a run entry of the store's
            # 16 MiB limit is written through the API (POST /v1/runs/{id}/write), not here
            max_request_body_size=LIMITS.value_body,
            # DNS rebinding cannot reach this: every request needs a bearer token, which a
            # page served from another origin does not have
            security_settings=None)
        try:
            async with self.manager.run():
                yield
        finally:
            self.manager = None

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        manager = self.manager
        try:
            if manager is None:  # the app's lifespan did not run (or has ended)
                raise Busy("MCP is not served now: the server is starting or stopping")
            p, _rules = await self.api.caller(request)
        except AgentStateError as e:
            response = h.error_response(e)
            if e.status == 401:
                response.headers["www-authenticate"] = 'Bearer realm="agentstate"'
            await response(scope, receive, send)
            return
        # The SDK binds a session to whoever opened it (its "user"): here the token itself,
        # by a keyed hash (the token is never kept, and the store's own hash of it is not
        # what is kept either), and whom it acts for.
        token = hmac.new(self._key, h.bearer(request).encode(), hashlib.sha256).hexdigest()
        scope["user"] = AuthenticatedUser(AccessToken(token=token, client_id=p.name, scopes=[],
                                                      subject=token))
        await manager.handle_request(scope, receive, send)


class _Path:
    """Serves ``/mcp`` before the API's router sees the request (as the pages' middleware)."""

    def __init__(self, app: ASGIApp, over: OverHTTP) -> None:
        self.app, self.over = app, over

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") in (PATH, PATH + "/"):
            await self.over.handle(scope, receive, send)
        else:
            await self.app(scope, receive, send)
