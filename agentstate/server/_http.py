"""HTTP plumbing of the State API: bodies, errors, principals, JSON out.

The store stays the authority on values: a body is parsed with the strict
JSON rules of SPEC §2 (no NaN or Infinity literals), its envelope is checked
by a strict pydantic model (``false`` is not an integer, ``"3"`` is not a
number), and the values themselves go to the store, which validates them.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

import agentstate
from agentstate.errors import FIELDS, AgentStateError, Forbidden, InvalidValue, TooLarge, Unauthorized

M = TypeVar("M", bound=BaseModel)
PRINCIPAL_HEADER = "x-agentstate-principal"


class Body(BaseModel):
    """Every request body: strict types, no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid")


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def dumps(data: Any) -> bytes:
    return _dumps(data).encode("utf-8", "surrogatepass")


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def error_body(e: AgentStateError) -> dict[str, Any]:
    """``{"error": {"code", "message", ...}}`` with the error's fields (SPEC §12)."""
    body: dict[str, Any] = {"code": e.code, "message": str(e)}
    for name in FIELDS:
        if name in vars(e) or (name == "outcome_unknown" and getattr(e, name, False)):
            body[name] = getattr(e, name)
    return {"error": body}


def error_response(e: AgentStateError) -> JSON:
    return JSON(error_body(e), status_code=e.status)


async def read_body(request: Request, limit: int, big: int | None = None,
                    on_big: Callable[[], Awaitable[None]] | None = None,
                    big_seconds: float | None = None) -> bytes:
    """The raw body; TooLarge as soon as it is known to pass ``limit``, before reading it whole.
    ``on_big`` is awaited once, before the body grows past ``big`` bytes (a turn to wait for);
    after it the rest must arrive within ``big_seconds`` (InvalidValue: too slow)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body is {declared} bytes, over the limit of {limit}", int(declared), limit)
    deadline: float | None = None

    async def turn() -> None:
        nonlocal deadline
        await on_big()  # type: ignore[misc]
        if big_seconds is not None:
            deadline = time.monotonic() + big_seconds

    waited = on_big is None
    if not waited and declared is not None and declared.isdigit() and int(declared) > (big or 0):
        await turn()
        waited = True
    chunks, size = [], 0
    stream = request.stream().__aiter__()
    while True:
        try:
            if deadline is None:
                chunk = await stream.__anext__()
            else:
                chunk = await asyncio.wait_for(stream.__anext__(), max(0.0, deadline - time.monotonic()))
        except StopAsyncIteration:
            break
        except asyncio.TimeoutError:
            raise InvalidValue(f"the body did not arrive within {big_seconds:g} s") from None
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body is over the limit of {limit} bytes", size, limit)
        if not waited and size > (big or 0):
            await turn()
            waited = True
        chunks.append(chunk)
    return b"".join(chunks)


def validate(model: type[M], data: Any) -> M:
    """``data`` (parsed JSON) as ``model``; InvalidValue naming every problem."""
    if not isinstance(data, dict):
        raise InvalidValue("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']}"
                             for err in e.errors(include_url=False))
        raise InvalidValue(f"bad body: {problems}") from None


def query_int(request: Request, name: str, default: int | None = None, lo: int = 0,
              hi: int = 2**63 - 1) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not ascii_int(text):
        raise InvalidValue(f"{name} must be an integer, got {text!r}")
    v = int(text)
    if not lo <= v <= hi:
        raise InvalidValue(f"{name} must be an integer from {lo} to {hi}, got {v}")
    return v


def ascii_int(text: str) -> bool:
    """An integer as ASCII digits (str.isdigit() also takes '²' and '١', which int() refuses
    or reads as another number)."""
    return re.fullmatch(r"-?[0-9]{1,19}", text) is not None


def query_number(request: Request, name: str, lo: float, hi: float) -> float | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return None
    try:
        v = float(text)
    except ValueError:
        raise InvalidValue(f"{name} must be a number, got {text!r}") from None
    if not lo <= v <= hi:  # NaN fails too
        raise InvalidValue(f"{name} must be a number from {lo:g} to {hi:g}, got {text!r}")
    return v


def bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized("send Authorization: Bearer <token> (agentstate tokens create NAME)")
    return token.strip()


def acting(principal: agentstate.Principal, request: Request) -> agentstate.Principal:
    """Who a request acts as: the token's principal, or the one named in
    X-Agentstate-Principal, always without admin rights. An admin token may name anyone
    (a service acting for its users; its own name, to act as a plain principal of that
    name); any other token only itself."""
    other = request.headers.get(PRINCIPAL_HEADER)
    if other is None:
        return principal
    if principal.admin:
        return agentstate.Principal(other)  # InvalidKey for a bad name
    if other == principal.name:
        return principal
    raise Forbidden(f"only an admin token may act for another principal ({principal.name} "
                    "is not an admin)")


class _Stream(StreamingResponse):
    """A stream that calls ``release`` when it ends however it ends (its client gone before
    its first byte too: its events are then never iterated, so their own finally never runs)."""

    def __init__(self, events: AsyncIterator[bytes], release: Callable[[], None],
                 **kw: Any) -> None:
        super().__init__(events, **kw)
        self.release = release

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()


def event_stream(request: Request, events: AsyncIterator[bytes],
                 release: Callable[[], None] = lambda: None) -> Response:
    """Server-sent events; for HEAD only the headers (a stream never ends by itself, and a
    HEAD response that never ended wedged its keep-alive connection). ``release``: called
    when the response ends (``Waits.take``'s)."""
    headers = {"cache-control": "no-cache", "x-accel-buffering": "no"}
    if request.method == "HEAD":
        events = _nothing()  # the GET's headers, and an end at once
    return _Stream(events, release, media_type="text/event-stream", headers=headers)


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


def sse(data: Any = None, *, event: str | None = None, id: int | None = None) -> bytes:
    """One server-sent event (``data`` as JSON; none: an event that only moves the id)."""
    out = b"" if event is None else b"event: " + event.encode() + b"\n"
    if id is not None:
        out += b"id: %d\n" % id
    if data is not None:
        out += b"data: " + dumps(data) + b"\n"
    return out + b"\n"


async def disconnected(request: Request) -> None:
    """Return once the client has gone (for a request whose body nobody reads: a GET)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a store call in a worker thread: the event loop never waits on the store."""
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
