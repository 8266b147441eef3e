"""What the pages read: bounded reads of the public objects, for one principal.

Every function reads a page, never a table — except where the public API has no
paged form yet (``sessions.list``, ``sessions.turns``, ``runs.list``): those are
read once and cut into pages here (see the report of issue 16).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import agentstate
from agentstate.errors import CursorExpired, NotFound

PAGE = 50
FEED_WINDOW = 10_000  # the overview looks at the turns touched in the newest changes this many
MAX_TURNS = 300  # distinct turns the overview reads


def size_of(value: Any) -> int:
    """A value's size as SPEC §2 counts it: its compact UTF-8 JSON."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))
               .encode("utf-8", "surrogatepass"))


def cut(items: list[Any], page: int, size: int = PAGE) -> tuple[list[Any], bool]:
    """Page ``page`` (from 0) of ``items``, and whether there is a next one."""
    return items[page * size:(page + 1) * size], len(items) > (page + 1) * size


def scope(db: agentstate.Database, kind: str, scope_id: str, p: agentstate.Principal) -> agentstate.Scope:
    """A scope; a session's only after the access check, as the API's session routes do."""
    if kind == "session":
        return db.sessions.state(scope_id, p)
    return db.scope(kind, scope_id)


class Visible:
    """Which changes a principal may see: for a non-admin, session changes (and keys of
    session scopes) only of its own sessions — the pages' answer to "a principal sees only
    its own sessions". The set of own sessions is read again when a session is created."""

    def __init__(self, db: agentstate.Database, p: agentstate.Principal) -> None:
        self.db, self.p = db, p
        self.own: set[str] | None = None if p.admin else self._read()

    def _read(self) -> set[str]:
        return {s.id for s in self.db.sessions.list(self.p)}

    def __call__(self, c: Any) -> bool:
        if self.own is None or not (c.topic == "session" or c.kind == "session"):
            return True
        if c.scope_id not in self.own and c.topic == "session" and c.op == "create":
            self.own = self._read()
        return c.scope_id in self.own


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


@dataclass
class Overview:
    counts: dict[str, int]
    active: list[agentstate.Turn]  # queued or running
    held: list[agentstate.Turn]
    expired: list[agentstate.Turn]
    runs: list[agentstate.SavedState]
    changes: list[Any]
    window: int


def overview(db: agentstate.Database, p: agentstate.Principal) -> Overview:
    """Counts, the turns that need eyes, the newest runs and changes.

    Turns are found through the feed: those touched by the newest FEED_WINDOW
    changes, read one by one with the principal's rights (others' are skipped),
    so the cost does not grow with the store.
    """
    head = db.last_change()
    recent, _ = changes_window(db, head, FEED_WINDOW, topic="session")
    turn_ids: list[str] = []
    seen: set[str] = set()
    for c in reversed(recent):
        if c.key and c.key not in seen and len(turn_ids) < MAX_TURNS:
            seen.add(c.key)
            turn_ids.append(c.key)
    turns = []
    for tid in turn_ids:
        try:
            turns.append(db.sessions.get_turn(tid, p))
        except NotFound:  # not this principal's, or deleted since
            pass
    runs = db.runs.list()
    sessions = db.sessions.list(p)
    visible = Visible(db, p)
    latest = [c for c in changes_window(db, head, 200)[0] if visible(c)][-20:]
    by = {s: [t for t in turns if t.status in s] for s in (("queued", "running"), ("held",), ("expired",))}
    counts = {"sessions": len(sessions), "runs": len(runs), "changes": head,
              "active turns": len(by[("queued", "running")]), "held turns": len(by[("held",)]),
              "expired leases": len(by[("expired",)])}
    return Overview(counts, by[("queued", "running")], by[("held",)], by[("expired",)], runs[:10],
                    list(reversed(latest)), FEED_WINDOW)


SNAPSHOT_INLINE = 5000  # runs up to this many entries show their snapshot on the page


@dataclass
class RunPage:
    run_id: str
    summary: agentstate.SavedState  # from runs.list(): task, turn, stopped_by, finished, times
    entries: list[dict[str, Any]]  # this page, in seq order
    first: int | None  # the run's first and last seq (None: no entries)
    last: int | None
    older: int | None  # the ``before`` of the next older page, or None
    newer: int | None  # the ``before`` of the next newer page; None: the newest is next or shown
    newest: bool  # this is the newest page
    snapshot: Any  # None when not read (a long run: see ``snapshot_page``)
    snapshot_read: bool


def run_page(db: agentstate.Database, run_id: str, before: int | None, size: int = PAGE) -> RunPage:
    """One page of a run's entries, the newest by default: ``tail`` and ``entries``
    read only the page (and the first entry), whatever the run's length."""
    summary = next((r for r in db.runs.list() if r.id == run_id), None)
    if summary is None:
        raise agentstate.RunNotFound(f"no run {run_id!r}")
    tail = db.runs.tail(run_id, 1)
    head = db.runs.entries(run_id, 0, 1)
    first, last = (head[0]["seq"], tail[0]["seq"]) if tail and head else (None, None)
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
    small = last is None or last - first < SNAPSHOT_INLINE
    snapshot = db.runs.read(run_id).snapshot if small else None
    return RunPage(run_id, summary, entries, first, last, older, newer, newest, snapshot, small)


def snapshot_page(db: agentstate.Database, run_id: str) -> Any:
    """A long run's snapshot: the public API reads it only with every entry (``runs.read``),
    so it is a page of its own, read on request (see the report of issue 16)."""
    rec = db.runs.read(run_id)
    if rec is None:
        raise agentstate.RunNotFound(f"no run {run_id!r}")
    return rec.snapshot
