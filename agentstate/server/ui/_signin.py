"""Signing in to the pages: the token goes in once, in a POST body, and stays on the server.

The browser holds only an opaque sign-in id, in a cookie that is HttpOnly (no
script reads it), SameSite=Strict (no other site's page sends it) and scoped to
``/ui``. The token it stands for stays in this process's memory and is checked
against the store again every few seconds, so a revoked token signs the page
out as fast as it stops the API, and ends the page's open stream too. Why not the token itself in the cookie: the
cookie jar, its logs and any proxy would then hold a credential that works
against the whole API; a sign-in id works only here and dies with the server
or at sign-out. The one write (deciding a turn) carries a per-sign-in CSRF
token in a hidden field as well, and every POST must come from our own origin.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

import agentstate

from .. import _http as h

COOKIE = "agentstate_ui"
IDLE_S = 12 * 3600.0  # a sign-in nobody used for this long is forgotten
RECHECK_S = 1.0  # the token is looked up again after this (a revoked token stops within it)
MAX_SIGNINS = 10_000


@dataclass
class SignIn:
    sid: str
    token: str
    csrf: str
    principal: agentstate.Principal
    checked: float
    used: float


class SignIns:
    """The server-side sign-ins of one server process (lost on restart: sign in again)."""

    def __init__(self, db: agentstate.Database) -> None:
        self.db = db
        self._by_id: dict[str, SignIn] = {}

    async def start(self, token: str) -> str | None:
        """A new sign-in id for a valid token, else None."""
        principal = await h.blocking(self.db.tokens.principal, token) if token else None
        if principal is None:
            return None
        now = time.monotonic()
        self._forget_idle(now)
        sid = secrets.token_urlsafe(32)
        self._by_id[sid] = SignIn(sid, token, secrets.token_urlsafe(32), principal, now, now)
        return sid

    def end(self, request: Request) -> None:
        self._by_id.pop(request.cookies.get(COOKIE, ""), None)

    async def find(self, request: Request) -> SignIn | None:
        """The request's sign-in, its token re-checked when due; None when signed out."""
        sid = request.cookies.get(COOKIE, "")
        s = self._by_id.get(sid)
        now = time.monotonic()
        if s is None or now - s.used > IDLE_S:
            self._by_id.pop(sid, None)
            return None
        return await self.recheck(s)

    async def recheck(self, s: SignIn) -> SignIn | None:
        """``s`` if it still stands (not signed out, its token not revoked), else None: what
        an open stream asks every second."""
        if self._by_id.get(s.sid) is not s:
            return None  # signed out, or forgotten
        now = time.monotonic()
        if now - s.checked > RECHECK_S:
            principal = await h.blocking(self.db.tokens.principal, s.token)
            if principal is None:  # revoked
                self._by_id.pop(s.sid, None)
                return None
            s.principal, s.checked = principal, now
        s.used = now
        return s

    def _forget_idle(self, now: float) -> None:
        if len(self._by_id) < MAX_SIGNINS:
            return
        for sid, s in list(self._by_id.items()):
            if now - s.used > IDLE_S:
                del self._by_id[sid]
        while len(self._by_id) >= MAX_SIGNINS:  # still full: the least recently used go
            del self._by_id[min(self._by_id, key=lambda k: self._by_id[k].used)]


def csrf_ok(s: SignIn, sent: str) -> bool:
    return hmac.compare_digest(s.csrf.encode(), sent.encode("utf-8", "replace"))


def same_origin(request: Request) -> bool:
    """A POST from a page of this server: its Origin (or, lacking one, Referer) names our host."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return True  # not a browser (browsers send Origin on every POST); the cookie still must match
    parts = urlsplit(origin)
    return parts.netloc == request.headers.get("host", "") and parts.scheme in ("http", "https")


def safe_next(path: str) -> str:
    """Where to go after signing in: a path of these pages only (no open redirect)."""
    if path.startswith("/ui") and not path.startswith("//") and "\\" not in path \
            and all(ch.isprintable() for ch in path):
        return path
    return "/ui"
