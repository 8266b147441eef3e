"""Signing in to the pages: the token goes in once, in a POST body, and stays on the server.

The browser holds only an opaque sign-in id, in a cookie that is HttpOnly (no
script reads it), SameSite=Strict (no other site's page sends it) and scoped to
``/ui``. The store keeps a hash of it, tied to the token's hash (SPEC §15), so
every server of the store knows the sign-in: a browser signed in through one
is signed in on all, and signing out through one signs out on all. A sign-in
lapses after ``IDLE_S`` unused, ends at sign-out, and ends with its token
(revoked: the store deletes it; expired: it is no longer found). Each server
asks the store again every ``RECHECK_S``, so that happens within a second, and
ends the page's open stream too. Why not the token itself in the cookie: the
cookie jar, its logs and any proxy would then hold a credential that works
against the whole API; a sign-in id works only here. The one write (deciding
a turn) carries a CSRF token in a hidden field as well, derived from the
sign-in id (``csrf_of``: any server computes it, none stores it, and it does
not give the id away), and every POST must come from our own origin.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request

import agentstate
from agentstate import _grants

from .. import _http as h
from .._access import Rules

IDLE_S = 12 * 3600.0  # a sign-in nobody used for this long lapses
EXTEND_S = 3600.0  # a sign-in's end moves on when it is used, at most this often (a write)
RECHECK_S = 1.0  # the store is asked again after this (a revoked token stops within it)
MAX_CACHED = 10_000  # sign-ins this process remembers between checks


def csrf_of(sid: str) -> str:
    """The CSRF token of a sign-in: a hash of its id under a label of its own, so a page
    that shows it gives neither the id nor the hash the store keeps."""
    return hashlib.sha256(b"agentstate-ui-csrf:" + sid.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class SignIn:
    sid: str  # the cookie's value (the store holds its hash)
    csrf: str
    principal: agentstate.Principal
    rules: Rules  # the token's grants (SPEC §15)
    checked: float  # when the store last said it stands (monotonic)


class SignIns:
    """The sign-ins of the store, as this server process sees them: the store's answer,
    remembered for ``RECHECK_S``."""

    def __init__(self, db: agentstate.Database, cookie: str) -> None:
        self.db = db
        self.cookie = cookie  # named by the store's id: two stores on one host keep theirs
        self._seen: dict[str, SignIn] = {}

    async def start(self, token: str) -> str | None:
        """A new sign-in id for a valid token, else None."""
        if not 20 <= len(token) <= 200:
            return None
        return await h.blocking(self.db._ops.signin_create, token, IDLE_S)

    async def end(self, request: Request) -> None:
        sid = request.cookies.get(self.cookie, "")
        self._seen.pop(sid, None)
        if sid:
            await h.blocking(self.db._ops.signin_end, sid)

    async def find(self, request: Request) -> SignIn | None:
        """The request's sign-in, asked of the store when due; None when signed out."""
        sid = request.cookies.get(self.cookie, "")
        if not 20 <= len(sid) <= 100:
            return None
        s = self._seen.get(sid)
        return await (self.recheck(s) if s is not None else self._ask(sid))

    async def recheck(self, s: SignIn) -> SignIn | None:
        """``s`` if it still stands (not signed out, lapsed, or its token revoked or
        expired: through any server), else None: what an open stream asks every second."""
        if time.monotonic() - s.checked <= RECHECK_S and self._seen.get(s.sid) is s:
            return s
        return await self._ask(s.sid)

    async def _ask(self, sid: str) -> SignIn | None:
        now = time.monotonic()
        row = await h.blocking(self.db._ops.signin_find, sid)
        if row is None:
            self._seen.pop(sid, None)
            return None
        _token, name, admin, grants, token_left, left = row
        checked = now if token_left is None else min(now, now + token_left - RECHECK_S)
        s = SignIn(sid, csrf_of(sid), agentstate.Principal(name, bool(admin)),
                   _grants.loads(grants), checked)
        if left < IDLE_S - EXTEND_S:  # used: it lapses IDLE_S from now (a write an hour)
            await h.blocking(self.db._ops.signin_extend, sid, IDLE_S)
        if len(self._seen) >= MAX_CACHED:
            self._seen.clear()  # a cache: the store has them all
        self._seen[sid] = s
        return s


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
