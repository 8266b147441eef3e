"""HTTP plumbing of the State API: bodies, errors, principals, JSON out.

The store stays the authority on values: a body is parsed with the strict
JSON rules of SPEC §2 (no NaN or Infinity literals), its envelope is checked
by a strict pydantic model (``false`` is not an integer, ``"3"`` is not a
number), and the values themselves go to the store, which validates them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.requests import Request
from starlette.responses import Response

import agentstate
from agentstate.errors import AgentStateError, Forbidden, InvalidValue, TooLarge, Unauthorized

M = TypeVar("M", bound=BaseModel)
PRINCIPAL_HEADER = "x-agentstate-principal"
FIELDS = ("current_version", "turn_id", "size", "limit", "outcome_unknown")


class Body(BaseModel):
    """Every request body: strict types, no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_loads = json.JSONDecoder(parse_constant=_no_constants).decode
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def dumps(data: Any) -> bytes:
    return _dumps(data).encode("utf-8", "surrogatepass")


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return dumps(content)


def error_response(e: AgentStateError) -> JSON:
    body: dict[str, Any] = {"code": e.code, "message": str(e)}
    for name in FIELDS:
        if name in vars(e) or (name == "outcome_unknown" and getattr(e, name, False)):
            body[name] = getattr(e, name)
    return JSON({"error": body}, status_code=e.status)


async def read_body(request: Request, limit: int) -> bytes:
    """The raw body; TooLarge as soon as it is known to pass ``limit``, before reading it whole."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body is {declared} bytes, over the limit of {limit}", int(declared), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body is over the limit of {limit} bytes", size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Request, model: type[M], limit: int) -> M:
    raw = await read_body(request, limit)
    try:
        data = _loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise InvalidValue(f"the body is not JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidValue("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']}"
                             for err in e.errors(include_url=False))
        raise InvalidValue(f"bad body: {problems}") from None


def query_int(request: Request, name: str, default: int | None = None, lo: int = 0) -> int | None:
    text = request.query_params.get(name)
    if text is None or text == "":
        return default
    if not ascii_int(text):
        raise InvalidValue(f"{name} must be an integer, got {text!r}")
    v = int(text)
    if not lo <= v <= 2**63 - 1:
        raise InvalidValue(f"{name} must be an integer from {lo}, got {v}")
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


async def disconnected(request: Request) -> None:
    """Return once the client has gone (for a request whose body nobody reads: a GET)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def blocking(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a store call in a worker thread: the event loop never waits on the store."""
    return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
