"""The State API's core: the route entry, the one place that authenticates, a request's
``Call`` (its principal, its body parsed off the event loop), and the feed's notifier.

A route's needs are stated once, in its ``Route_`` entry (``auth``, ``grant``, ``limit``);
``API.endpoint`` checks them before the handler runs, so no handler reaches the store for
a caller the entry does not admit. What a handler learns only from the body or the store
(a batch's scopes, a fork's new run, the runs a list shows, the feed) it asks through the
same rule (``Call.need``, ``Call.rules``: ``_access``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

import agentstate
from agentstate._encoding import check_key
from agentstate.errors import Busy, Damaged, Forbidden, InvalidValue, Unauthorized

from . import _access
from . import _http as h
from . import _json
from ._access import GRANTS, Rules, SessionRule
from ._limits import LIMITS

TOKEN_CACHE_S = 1.0  # a token's principal is looked up again after this: with the streams'
# check every LIMITS.stream_recheck seconds, a revoked token stops within 2 s (SPEC §15)
INLINE_BODY = 16 * 1024  # a body up to this is parsed on the event loop (a few ms at worst)
AUTH = ("none", "token", "admin")
FENCE_HEADER = "x-agentstate-fence"
DOTS = {"~.": ".", "~..": ".."}  # the path's escape of the keys "." and ".."


@dataclass
class Route_:
    """One route: what it needs and what the OpenAPI document says of it."""

    method: str
    path: str
    handler: Callable[[API, Call], Awaitable[Response]]
    summary: str
    body: Any = None  # a pydantic model, or "action" (the turn actions' several)
    query: tuple[str, ...] = ()
    ok: int = 200
    answer: str = "object"  # a schema name in openapi.SCHEMAS
    errors: tuple[int, ...] = (400,)
    auth: str = "token"  # "none", "token" (any principal) or "admin"
    grant: Any = None  # what a token with grants needs: one of _access.GRANTS (a test
    # walks the table: a route without one is refused to every caller)
    limit: int = LIMITS.small_body  # bytes of body
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        assert self.auth in AUTH, self.auth
        assert self.grant is None or self.grant in GRANTS, self.grant
        if isinstance(self.grant, tuple) or self.grant in ("batch", "list"):  # a grant may refuse it
            self.errors = tuple(sorted({*self.errors, 403}))


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
        waits: list[asyncio.Future[Any]] = [woken, gone] if gone else [woken]
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
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


class Waits:
    """The long polls and streams open now, by principal: each holds a connection and wakes
    every second, so their number is bounded (``LIMITS.waits``; a non-admin principal's,
    ``LIMITS.waits_per_principal``). ``take`` checks and counts one in the same step (on the
    event loop, with no await between: exact under any burst, SPEC §16), before anything
    is read for it; its release ends it."""

    def __init__(self) -> None:
        self.open: dict[str, int] = {}
        self.total = 0

    def take(self, p: agentstate.Principal) -> Callable[[], None]:
        """Count one more for ``p`` (Busy past a limit); the function that releases it
        (idempotent)."""
        if self.total >= LIMITS.waits:
            raise Busy(f"the server holds {self.total} long polls and streams open, its limit: "
                       "try again later")
        if not p.admin and self.open.get(p.name, 0) >= LIMITS.waits_per_principal:
            raise Busy(f"{p.name} holds {LIMITS.waits_per_principal} long polls and streams open, "
                       "the limit for one principal: close one first")
        self.open[p.name] = self.open.get(p.name, 0) + 1
        self.total += 1
        held = [True]

        def release() -> None:
            if held.pop() if held else False:
                self.total -= 1
                self.open[p.name] -= 1
                if not self.open[p.name]:
                    del self.open[p.name]  # the table holds only who has one open

        return release

    @contextmanager
    def hold(self, p: agentstate.Principal) -> Iterator[None]:
        release = self.take(p)
        try:
            yield
        finally:
            release()


class API:
    """What every handler shares: the store, the session rule, the notifier, the tokens."""

    def __init__(self, db: agentstate.Database) -> None:
        self.db = db
        self.rule = SessionRule(db)
        self.notifier = Notifier(db)
        self.waits = Waits()
        self._tokens: dict[str, tuple[float, tuple[agentstate.Principal, Rules] | None]] = {}
        self.routes: list[Route_] = []  # the route table, set by create_app
        self.document: bytes | None = None  # the OpenAPI document, made at its first request
        self._big: asyncio.Semaphore | None = None  # made on the server's own loop
        self.store_id = db._ops.store_id()  # the same through every server of the store
        self.cookie = f"agentstate_ui_{self.store_id}"  # the pages' sign-in (SPEC §16)

    @property
    def big(self) -> asyncio.Semaphore:
        if self._big is None:
            self._big = asyncio.Semaphore(LIMITS.big_bodies)
        return self._big

    async def caller(self, request: Request) -> tuple[agentstate.Principal, Rules]:
        """The caller (a bearer token's principal, or whom an admin acts for) and its token's
        grants; the one place a token is checked. Unauthorized for a missing, unknown,
        revoked or expired token."""
        token = h.bearer(request)
        now = time.monotonic()
        cached = self._tokens.get(token)
        if cached is None or cached[0] <= now:
            found = await h.blocking(self.db.tokens._find, token)
            until = now + TOKEN_CACHE_S
            if found is not None and found[2] is not None:  # it expires sooner than that
                until = min(until, now + found[2])
            if len(self._tokens) > 4096:  # unknown tokens sprayed at us: bounded
                self._tokens.clear()
            self._tokens[token] = cached = (until, None if found is None else found[:2])
        if cached[1] is None:
            raise Unauthorized("unknown token")
        principal, rules = cached[1]
        return h.acting(principal, request), rules

    def endpoint(self, route: Route_) -> Callable[[Request], Awaitable[Response]]:
        """The Starlette endpoint of ``route``: its needs checked, then its handler."""

        async def run(request: Request) -> Response:
            p, rules = None, None
            if route.auth != "none":
                p, rules = await self.caller(request)
                if route.auth == "admin" and not p.admin:
                    raise Forbidden(f"only an admin may do this ({p.name} is not one)")
            c = Call(self, route, request, p, rules)
            _access.check_route(route.grant, p, rules, c.params)
            if "as_of" in request.query_params and "as_of" not in route.query:
                raise InvalidValue("as_of reads the past, which only the key, slice, length, "
                                   "expires_at, keys and items routes (and get_many's body) "
                                   "take: the past is read-only (SPEC §17; put it back with "
                                   ".../restore)")
            try:
                return await route.handler(self, c)
            finally:
                c.done()

        run.__name__ = route.handler.__name__
        return run


class Call:
    """One request to one route."""

    def __init__(self, api: API, route: Route_, request: Request,
                 p: agentstate.Principal | None, rules: Rules = None) -> None:
        self.api, self.route, self.request = api, route, request
        self._p = p
        self.rules = rules  # the token's grants (SPEC §15); None: it has none
        self._holds_big = False

    @property
    def p(self) -> agentstate.Principal:
        assert self._p is not None, "a route without auth has no principal"
        return self._p

    def need(self, kind: str, id: str, write: bool) -> None:
        """Forbidden unless the caller's grants let it read (``write``: and write) the scope
        ``kind:id`` (kind ``runs``: the run ``id``): for ids a handler finds in the body."""
        _access.need(self.p, self.rules, kind, id, write)

    @property
    def readable(self) -> Any:
        """The feed filter of a caller with grants (``_access.readable``), else None."""
        return _access.readable(self.p, self.rules)

    @property
    def params(self) -> dict[str, Any]:
        """The path's parameters; ``~.`` and ``~..`` are the keys ``.`` and ``..``, which a
        URL cannot carry as a segment (fetch and browsers drop them, %2E or not)."""
        return {k: DOTS.get(v, v) for k, v in self.request.path_params.items()}

    @property
    def db(self) -> agentstate.Database:
        """The store, as this request may write it (``fenced_db``)."""
        return fenced_db(self.api.db, self.request, self.p)

    def q(self, name: str, default: str | None = None) -> str | None:
        return self.request.query_params.get(name, default)

    async def still(self) -> agentstate.Principal:
        """The caller again (a stream or long poll asks while it is open): Unauthorized or
        Forbidden once its token is revoked or has expired."""
        self._p, self.rules = await self.api.caller(self.request)
        return self._p

    async def _wait_turn(self) -> None:
        await self.api.big.acquire()
        self._holds_big = True

    def done(self) -> None:
        if self._holds_big:
            self._holds_big = False
            self.api.big.release()

    async def raw(self, limit: int | None = None) -> bytes:
        """The body's bytes, up to the route's limit; a big one waits for its turn. The
        caller is checked again once it has arrived (SPEC §16): a token revoked or expired
        while the body was on its way is Unauthorized, and nothing is written."""
        body = await h.read_body(self.request, limit or self.route.limit, LIMITS.big_body,
                                 self._wait_turn, LIMITS.big_body_seconds)
        if self._p is not None:
            await self.still()
        return body

    async def json(self, model: type[BaseModel] | None = None,
                   check: Callable[[dict[str, Any]], None] | None = None) -> Any:
        """The body as ``model`` (the route's by default): strict JSON, parsed in a worker
        thread when it is big; ``check`` sees the parsed object first (counts, say)."""
        model = model or self.route.body
        raw = await self.raw()

        def parse() -> Any:
            data = _json.parse(raw, LIMITS.json_values) if raw.strip() else {}
            if check is not None and isinstance(data, dict):
                check(data)
            return h.validate(model, data)

        return parse() if len(raw) <= INLINE_BODY else await h.blocking(parse)

    async def answer(self, data: Any, status: int = 200) -> Response:
        """A JSON answer that may be big (values, entries, lists): encoded in a worker thread."""
        body = await h.blocking(h.dumps, data)
        return Response(body, status, media_type="application/json")


def fenced_db(db: agentstate.Database, request: Request,
              p: agentstate.Principal) -> agentstate.Database:
    """``db`` as a request may write it: every write fenced by the turn named in
    ``X-Agentstate-Fence`` (SPEC §14, §16), if the request names one (the API's routes
    and /mcp alike). It must be a turn of the caller's own sessions (any, for an admin):
    another principal's turn is as an unknown one, so the header tells nobody whether
    someone else's turn runs."""
    fence = request.headers.get(FENCE_HEADER)
    if fence is None:
        return db
    return agentstate.Database(db._ops.fenced(
        check_key(fence, "the X-Agentstate-Fence header (a turn id)"),
        None if p.admin else p.name))


# -- shapes of the answers ---------------------------------------------------------------

def page(c: Call) -> tuple[str | None, int | None]:
    """A list route's ``after`` (the id of the previous page's last item) and ``limit``."""
    return c.q("after") or None, h.query_int(c.request, "limit", None, lo=1, hi=LIMITS.list_page)


def next_after(items: list[Any], limit: int | None) -> str | None:
    """The ``after`` of the next page: the last id, when the page came back full."""
    return items[-1].id if limit and len(items) == limit else None


def stored(text: str | bytes | None, what: str = "a stored value") -> bytes:
    """JSON text the store wrote (a value, an entry, a snapshot), as it goes into an answer:
    checked (Damaged if it is not JSON: changed by hand, as the store's own reads say) but not
    decoded and encoded again. The store's C decoder holds the GIL for the whole of a text,
    so decoding a hostile 16 MiB entry stalled every request for seconds. Blocking."""
    if text is None:
        return b"null"
    if not _json.is_json(text):
        raise Damaged(f"{what} is not valid JSON (changed outside agentstate?)")
    return text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")


def raw_object(**fields: bytes) -> bytes:
    """A JSON object of fields already encoded (``stored``, ``h.dumps``)."""
    return b"{" + b",".join(h.dumps(k) + b":" + v for k, v in fields.items()) + b"}"


def json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status, media_type="application/json")


def iso(dt: datetime | None) -> str | None:
    """The store's own time format: ISO-8601 UTC, always with microseconds and a Z."""
    return None if dt is None else dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def change(c: agentstate.Change) -> dict[str, Any]:
    return {**c._asdict(), "at": iso(c.at)}
