"""Pages on other origins (SPEC §16): ``agentstate serve --cors-origin ORIGIN``.

A page served from a listed origin may call the API with a bearer token: its browser's
preflight (OPTIONS with ``Access-Control-Request-Method``) is answered here, before routing
and before any token is looked at, and every answer says that origin may read it. An origin
not listed gets no CORS header at all, so its browser keeps the answers from the page;
without the option there is no CORS here at all (``create_app`` leaves this out). Origins
are exact (no wildcard), and no credentials are allowed: the token travels in
``Authorization``, never in a cookie. The pages at /ui are same-origin by design: not here.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

METHODS = "GET, HEAD, PUT, POST, DELETE"
REQUEST_HEADERS = ("authorization", "content-type")  # and every x-agentstate-* header
# What the clients read of an answer beyond the status: its type (bytes or JSON) and length.
EXPOSED = "Content-Type, Content-Length"
MAX_AGE = "600"  # seconds a browser may keep a preflight's answer
_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(text: str) -> str:
    """``text`` as a browser sends it in ``Origin``: ``scheme://host[:port]``, lower case,
    without a default port. :raises ValueError: not one http(s) origin."""
    try:
        parts = urlsplit(text.strip())
        port = parts.port
    except ValueError:
        parts, port = None, None
    if (parts is None or parts.scheme not in _DEFAULT_PORTS or not parts.hostname
            or parts.username is not None or parts.password is not None
            or parts.path not in ("", "/") or parts.query or parts.fragment
            or text.strip().endswith(("?", "#"))):
        raise ValueError(f"{text!r} is not an origin: give one as http(s)://host[:port] (exact, "
                         "no path and no wildcard), once per --cors-origin")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    shown_port = "" if port is None or port == _DEFAULT_PORTS[parts.scheme] else f":{port}"
    return f"{parts.scheme}://{host}{shown_port}"


def _allowed(header: str) -> bool:
    return header in REQUEST_HEADERS or header.startswith("x-agentstate-")


class CORS:
    """The API's answers to the listed origins (an ASGI middleware, outside the routes)."""

    def __init__(self, app: ASGIApp, origins: Iterable[str]) -> None:
        self.app = app
        self.origins = frozenset(origin(o) for o in origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path.startswith("/v1/") or path == "/openapi.json"):
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        asked = headers.get("origin", "")
        listed = asked in self.origins
        if listed and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            return await self._preflight(headers, asked, send)

        async def answer(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out.add_vary_header("Origin")  # a cache must not give one origin's answer to another
                if listed:
                    out["access-control-allow-origin"] = asked
                    out["access-control-expose-headers"] = EXPOSED
            await send(message)

        await self.app(scope, receive, answer)

    async def _preflight(self, headers: Headers, asked: str, send: Send) -> None:
        """204, allowing the request headers of ours it names (a browser refuses the request
        if one it names is left out); nothing reaches the routes or the token check."""
        wanted = [h.strip().lower() for h in headers.get("access-control-request-headers", "").split(",")]
        out = {"access-control-allow-origin": asked, "access-control-allow-methods": METHODS,
               "access-control-max-age": MAX_AGE, "vary": "Origin"}
        allowed = [h for h in wanted if h and _allowed(h)]
        if allowed:
            out["access-control-allow-headers"] = ", ".join(allowed)
        await send({"type": "http.response.start", "status": 204,
                    "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out.items()]})
        await send({"type": "http.response.body", "body": b""})
