"""A page of a run's history as a timeline: tool calls paired with their results,
and the calls that ``runs.load()`` would mark unknown picked out.

Only the page is read, plus (for calls whose result is not on it) the entries
after it, in chunks, up to LATER_CAP: the newest page, where an interrupted call
usually is, costs nothing more.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentstate.backends.leases import call_state

LATER_CAP = 10_000  # entries after the page searched for a call's result
CHUNK = 20  # entries read at a time: each may be 16 MiB (the store's limit)


class Exhausted(Exception):
    """``later`` has read as much as it may (bytes, say): the calls still open are unsure."""


@dataclass
class Item:
    entry: dict[str, Any]
    kind: str  # "message", "call", "result", "other"
    result: dict[str, Any] | None = None  # a call's result, when paired
    unknown: bool = False  # a call load() would give a synthetic "unknown" result
    unsure: bool = False  # no result within LATER_CAP entries after the page
    claim: str | None = None  # a claim of once() with no result: "in_progress" or "in_doubt"
    paired_above: bool = False  # a result shown with its call on this page
    fields: dict[str, Any] = field(default_factory=dict)


def _key(call_id: Any) -> str:
    return json.dumps(call_id, sort_keys=True)  # call ids may be any JSON value, as in load()


def _kind(e: dict[str, Any]) -> str:
    t = e.get("type")
    if t == "tool_call" and e.get("call_id") is not None:
        return "call"
    if t == "tool_result" and e.get("call_id") is not None:
        return "result"
    if t == "message" or "role" in e:
        return "message"
    return "other"


def timeline(entries: list[dict[str, Any]],
             later: Callable[[int, int], list[dict[str, Any]]]) -> list[Item]:
    """``entries``: one page, in seq order. ``later(since, limit)``: entries from a seq on
    (or Exhausted: no more may be read)."""
    items = [Item(e, _kind(e)) for e in entries]
    open_calls: dict[str, Item] = {}
    for it in items:
        if it.kind == "call":
            open_calls[_key(it.entry["call_id"])] = it  # a repeated id: the last call is open, as in load()
        elif it.kind == "result":
            call = open_calls.pop(_key(it.entry["call_id"]), None)
            if call is not None:
                call.result, it.paired_above = it.entry, True
    if open_calls and entries:
        since, seen = entries[-1]["seq"] + 1, 0
        while open_calls and seen < LATER_CAP:
            try:
                chunk = later(since, CHUNK)
            except Exhausted:
                break
            for e in chunk:
                if _kind(e) == "result":
                    call = open_calls.pop(_key(e["call_id"]), None)
                    if call is not None:
                        call.result = e
            if len(chunk) < CHUNK:
                for call in open_calls.values():
                    call.unknown = True
                open_calls = {}
                break
            since, seen = chunk[-1]["seq"] + 1, seen + len(chunk)
        for call in open_calls.values():
            call.unsure = True
    return items


def mark_claims(items: list[Item], fence_live: Callable[[str], bool], now: float) -> None:
    """Name the calls with no result that ``runs.once()`` claimed (SPEC §14): in progress
    while their claim is live, else in doubt, by the rule once() applies."""
    for it in items:
        if it.kind == "call" and (it.unknown or it.unsure) and "at" in it.entry:
            fence = it.entry.get("fence")
            live = fence_live(fence) if isinstance(fence, str) else None
            it.claim = call_state(it.entry, live, now)
