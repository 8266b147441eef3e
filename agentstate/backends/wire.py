"""What the remote client checks of what goes over the wire: connect()'s URL and token
before anything is sent, a path's segments, and an answer back into the store's rows
(or its error body into the store's error class)."""

from __future__ import annotations

import base64
import json
from datetime import datetime
from typing import Any
from urllib.parse import quote

from .. import errors as E
from .base import Row, Stored

dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def segments(*parts: str) -> str:
    """Path segments, escaped; "." and ".." (valid keys) as %2E, or URL rules would drop them."""
    return "/".join("%2E" * len(p) if p and set(p) <= {"."} else quote(p, safe="") for p in parts)


def text(v: Any) -> str | None:
    return None if v is None else dumps(v)


def ts(iso: str | None) -> float | None:
    return None if iso is None else datetime.fromisoformat(iso).timestamp()


def typed(v: dict[str, Any]) -> tuple[str, Stored]:
    """(type, stored) of a value the past's routes give: ``{"value", "type"}``, bytes in
    base64 (server/views/past.py)."""
    if v["type"] == "bytes":
        return "bytes", base64.b64decode(v["value"])
    return "json", dumps(v["value"])


def turn_row(d: dict[str, Any]) -> Row:
    return (d["id"], d["session_id"], d["n"], d["status"], text(d["input"]), text(d["request"]),
            text(d["decision"]), text(d["result"]), d["error"], d["lease_until"],
            d["created_at"], d["updated_at"], d["lease"])


def session_row(d: dict[str, Any]) -> Row:
    return (d["id"], d["owner"], d["created_at"], dumps(d["metadata"]))


def change_row(d: dict[str, Any]) -> Row:
    return (d["seq"], d["at"], d["topic"], d["op"], d["kind"], d["scope_id"], d["key"],
            d["version"], d["start"], d["count"])

# Every error class by its code (NotFound before RunNotFound, which shares it): errors
# added to ``errors`` later come back as themselves, not as an unknown answer.
_CLASSES: dict[str, type[E.AgentStateError]] = {}
for _cls in vars(E).values():
    if isinstance(_cls, type) and issubclass(_cls, E.AgentStateError) and _cls is not E.AgentStateError:
        _CLASSES.setdefault(_cls.code, _cls)


def error(status: int, body: Any, runs: bool, write: bool = False) -> E.AgentStateError:
    info = body.get("error") if isinstance(body, dict) else None
    if not isinstance(info, dict) or info.get("code") not in _CLASSES:
        # Not one of the store's refusals: a proxy, or the server failed unexpectedly.
        # A write may have been done before that: as a failed COMMIT, its outcome is unknown.
        message = str(info.get("message", "")) if isinstance(info, dict) else ""
        failed = E.StorageError(f"the server answered {status}" + (
            f": {message}" if message else " without an agentstate error"))
        failed.outcome_unknown = write and status >= 500
        return failed
    code = info["code"]
    cls = E.RunNotFound if code == "not_found" and runs else _CLASSES[code]
    err = cls.__new__(cls)
    Exception.__init__(err, str(info.get("message", "")))
    for name in E.FIELDS:
        if name in info:
            setattr(err, name, info[name])
    return err


def check_token(token: Any) -> None:
    """A token goes into a header: visible ASCII only (the store makes URL-safe base64).
    The error never repeats it (it may be a real token with a stray character)."""
    t = token.strip() if isinstance(token, str) else None
    if not t or any(not "\x21" <= ch <= "\x7e" for ch in t):
        raise E.Unauthorized("connect(): the token has characters no token has (a token is "
                             "visible ASCII: check for a line break or a space copied with it)")


def check_url(url: Any) -> None:
    """An http(s) URL of a server: no user:password (it would be kept in db.path and in
    every error message), no query or fragment. The error does not repeat a password."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url) if isinstance(url, str) else None
        ok = parts is not None and parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        parts, ok = None, False
    if not ok or parts is None:
        shown = repr(url) if not isinstance(url, str) or "@" not in url else "(a URL with credentials)"
        raise E.InvalidValue(f"connect() takes an http:// or https:// URL of a server, got {shown}")
    if parts.username is not None or parts.password is not None:
        raise E.InvalidValue("connect(): a URL with a user or password in it; give the token "
                             "as token= (or $AGENTSTATE_TOKEN) instead")
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        raise E.InvalidValue(f"connect() takes the server's URL without a query or fragment, got {url!r}")


def redirected(request: str, r: Any) -> E.StorageError:
    """A 3xx answer (an httpx response). agentstate never redirects: whatever answered is
    not the store and did not do the write. Followed, a redirect would send the body, the
    principal and the fence elsewhere, and a 303 turns a write into a GET whose answer
    looks like success. Where it pointed is named without credentials, query or path."""
    import httpx

    try:
        where = httpx.URL(r.headers.get("location", ""))
        shown = f"{where.scheme}://{where.host}" + (f":{where.port}" if where.port else "")
    except (httpx.InvalidURL, ValueError):
        shown = "(an address that does not parse)"
    return E.StorageError(f"{request}: answered {r.status_code}, a redirect to {shown}, "
                          "which is never followed (an agentstate server never redirects)")
