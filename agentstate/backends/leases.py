"""The rules of leases that every backend and every reader shares (SPEC §4, §14, §16):
when a turn's status reads as expired, and where a tool call stands given its newest
entry. Written once; the backends, the command and the pages all ask here."""

from __future__ import annotations

import time
from typing import Any, Final

Row = tuple[Any, ...]


# -- turns (SPEC §4) ---------------------------------------------------------------------

LEASED: Final = ("queued", "running", "resuming")  # states that lapse into 'expired'


def effective_status(status: str, lease_until: float | None, now: float | None = None) -> str:
    """A leased state whose lease lapsed reads as 'expired'."""
    if status in LEASED and lease_until is not None and lease_until < (now or time.time()):
        return "expired"
    return status


# -- tool calls that run at most once (SPEC §14) -------------------------------------------

CALL_TYPES: Final = ("tool_call", "tool_result")  # the entries once() and load() pair by call_id
RESERVED: Final = ("seq", "type", "call_id", "at", "fence", "lease", "retry")  # not in ``call``
SETTLED: Final = {"ok": "done", "error": "failed"}  # the tool_result statuses that settle a call


def call_state(entry: dict[str, Any], fence_live: bool | None, now: float) -> str:
    """What a call is, from its newest entry: ``done`` or ``failed`` (a result with
    status ok or error is recorded), ``in_progress`` (a claim that is still live: its
    fence's turn holds it — ``fence_live``, see ``claim_live`` —, or without a fence less
    than its ``lease`` seconds have passed since its ``at``), else ``in_doubt`` (it may
    have run; so is a call whose newest result says neither ok nor error, such as
    load()'s synthetic ``unknown`` written back: SPEC §16)."""
    if entry.get("type") == "tool_result":
        return SETTLED.get(entry.get("status"), "in_doubt")  # type: ignore[arg-type]
    if entry.get("fence") is not None:
        return "in_progress" if fence_live else "in_doubt"
    at, lease = entry.get("at"), entry.get("lease")
    if not isinstance(at, str) or isinstance(lease, bool) or not isinstance(lease, (int, float)):
        return "in_doubt"  # a tool_call written by hand: nothing says it is still running
    try:
        claimed = parse_iso(at)
    except ValueError:
        return "in_doubt"
    return "in_progress" if now < claimed + lease else "in_doubt"


def claim_count(entry: dict[str, Any]) -> int:
    """Which claim of a call a tool_call entry is: its ``retry`` (the first claim has none: 0)."""
    n = entry.get("retry")
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0


def parse_iso(text: str) -> float:
    """The store's ISO-8601 UTC text (``iso()``) as a unix time."""
    from datetime import datetime, timezone

    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()


HOLDS_CLAIMS: Final = ("running", "resuming", "held", "decided")


def claim_live(status: str | None) -> bool:
    """Whether a claim fenced by a turn is still live, from the turn's status as it reads
    now (``effective_status``: a lapsed lease reads as expired; None: no such turn): the
    turn holds its lease, or is held or decided — a hold is a pause, not the end of the
    turn (SPEC §16). Expired, failed, finished or unknown: the claim is in doubt."""
    return status in HOLDS_CLAIMS


def turn_live(row: Row | None, now: float) -> bool:
    """Whether a turn (its row: status at 3, lease_until at 9) holds its lease: running or
    resuming, and not lapsed by the store's clock."""
    return (row is not None and row[3] in ("running", "resuming")
            and (row[9] is None or row[9] >= now))
