"""What the pages read: bounded reads of the public objects, for one principal.

Every function reads a page, never a table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import agentstate
from agentstate.errors import CursorExpired

from .._access import SessionRule

PAGE = 50


def size_of(value: Any) -> int:
    """A value's size as SPEC §2 counts it: its compact UTF-8 JSON."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))
               .encode("utf-8", "surrogatepass"))


def scope(db: agentstate.Database, rule: SessionRule, kind: str, scope_id: str,
          p: agentstate.Principal) -> agentstate.Scope:
    """A scope, after the session rule: what the API's key routes would let ``p`` read."""
    s = db.scope(kind, scope_id)
    rule.check(p, s.kind, s.id)
    return s


def changes_window(db: agentstate.Database, upto: int, n: int, **filters: Any) -> tuple[list[Any], bool]:
    """The changes with seq in (upto - n, upto], oldest first, and whether older ones were purged
    (retention, §9) from that range."""
    since = max(0, upto - n)
    try:
        return db.changes(since, limit=n, **filters), False
    except CursorExpired:
        pass
    lo, hi = since, upto  # find the oldest cursor the feed still answers: a few probes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            db.changes(mid, limit=1)
            hi = mid
        except CursorExpired:
            lo = mid
    try:
        return db.changes(hi, limit=n, **filters), True
    except CursorExpired:
        return [], True


SECTIONS = {"active": ("queued", "running"), "held": ("held",), "expired": ("expired",)}
CAP = 100  # the overview counts up to this many of each thing (it reads pages, not tables)
SHOWN = 20  # turns of each kind the overview lists (the rest: /ui/turns/<kind>)


@dataclass
class Overview:
    counts: dict[str, int]
    turns: dict[str, list[agentstate.Turn]]  # per section, up to CAP + 1
    runs: list[agentstate.SavedState]
    changes: list[Any]
    cap: int = CAP
    shown: int = SHOWN


def overview(db: agentstate.Database, rule: SessionRule, p: agentstate.Principal) -> Overview:
    """Counts (up to CAP), the turns that need eyes, the newest runs and changes: each a
    bounded read (the paged lists of SPEC §3/§4), whatever the size of the store."""
    head = db.last_change()
    turns = {name: db.sessions.turns_by_status(p, statuses, limit=CAP + 1)
             for name, statuses in SECTIONS.items()}
    runs = db.runs.list(limit=CAP + 1)
    sessions = db.sessions.list(p, limit=CAP + 1)
    latest = rule.visible(p, changes_window(db, head, 200)[0])[-20:]
    counts = {"sessions": len(sessions), "runs": len(runs), "changes": head,
              "active turns": len(turns["active"]), "held turns": len(turns["held"]),
              "expired leases": len(turns["expired"])}
    return Overview(counts, turns, runs[:10], list(reversed(latest)))


@dataclass
class RunPage:
    run_id: str
    summary: agentstate.SavedState  # from runs.head(): task, turn, stopped_by, finished, times
    entries: list[dict[str, Any]]  # this page, in seq order
    first: int | None  # the run's first and last seq (None: no entries)
    last: int | None
    older: int | None  # the ``before`` of the next older page, or None
    newer: int | None  # the ``before`` of the next newer page; None: the newest is next or shown
    newest: bool  # this is the newest page
    snapshot: Any


def run_page(db: agentstate.Database, run_id: str, before: int | None, size: int = PAGE) -> RunPage:
    """One page of a run's entries, the newest by default: ``tail`` and ``entries``
    read only the page (and the first entry), whatever the run's length."""
    rh = db.runs.head(run_id)
    if rh is None:
        raise agentstate.RunNotFound(f"no run {run_id!r}")
    first, last = (rh.first_seq, rh.next_seq - 1) if rh.next_seq > rh.first_seq else (None, None)
    newest = before is None or last is None or before > last
    if last is None:
        entries = []
    elif newest:
        entries = db.runs.tail(run_id, size)
    else:
        since = max(first, before - size)
        entries = db.runs.entries(run_id, since, max(0, before - since))
    lo = entries[0]["seq"] if entries else None
    older = lo if lo is not None and first is not None and lo > first else None
    newer = None if newest or before is None or before + size > last else before + size
    return RunPage(run_id, rh.summary, entries, first, last, older, newer, newest, rh.snapshot)


def snapshot_page(db: agentstate.Database, run_id: str) -> Any:
    """A run's snapshot on a page of its own (``runs.head``: the history is not read)."""
    rh = db.runs.head(run_id)
    if rh is None:
        raise agentstate.RunNotFound(f"no run {run_id!r}")
    return rh.snapshot
