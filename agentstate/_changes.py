"""The change feed's public side (SPEC §9): ``Change``, filters, and checks.

Reading and waiting are backend operations (``_ops``); for a file, waiting
polls SQLite's ``data_version`` (``_connection.DataVersionWaiter``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, NamedTuple

from ._encoding import check_int, check_key, check_kind
from .errors import InvalidValue

TOPICS = ("kv", "run", "session")
MAX_LIMIT = 10_000


class Change(NamedTuple):
    """One committed change (SPEC §9); values are not in the feed: read them."""

    seq: int
    at: datetime
    topic: str
    op: str
    kind: str | None
    scope_id: str | None
    key: str | None
    version: int | None
    start: int | None
    count: int | None  # type: ignore[assignment]  # a field (SPEC §9), over tuple.count


def parse_at(at: Any) -> datetime:
    """A change's time as a backend gives it (ISO text, or a datetime already)."""
    return at if isinstance(at, datetime) else datetime.fromisoformat(at)


def change(row: tuple[Any, ...]) -> Change:
    seq, at, *rest = row
    return Change(seq, at if isinstance(at, datetime) else datetime.fromisoformat(at), *rest)


async def as_changes(rows: AsyncIterator[tuple[Any, ...]]) -> AsyncIterator[Change]:
    async for row in rows:
        yield change(row)


def filters(topic: Any = None, kind: Any = None, scope_id: Any = None, key: Any = None) -> dict[str, Any]:
    """The given filters, checked: {} matches every change."""
    out: dict[str, Any] = {}
    if topic is not None:
        if topic not in TOPICS or type(topic) is not str:
            raise InvalidValue(f"topic must be one of {', '.join(TOPICS)}, got {topic!r}")
        out["topic"] = topic
    if kind is not None:
        out["kind"] = check_kind(kind)
    if scope_id is not None:
        out["scope_id"] = check_key(scope_id, "scope id")
    if key is not None:
        out["key"] = check_key(key)
    return out


def check_since(since: Any, limit: Any) -> None:
    check_int("since", since)
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise InvalidValue(f"limit must be an integer from 1 to {MAX_LIMIT}, got {limit!r}")
