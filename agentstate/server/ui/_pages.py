"""What the pages read: bounded reads of the public objects, for one principal.

Every function reads a page, never a table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import agentstate
from agentstate._encoding import check_key
from agentstate._past import Past
from agentstate._runs import RunHead, parse_time
from agentstate.backends.leases import claim_live
from agentstate.errors import CursorExpired

from .. import _json
from .._access import SEE_ALL, Rules, SessionRule, need, readable
from .._api import raw_object
from .._api import stored as stored_text
from .._limits import LIMITS
from ._timeline import Exhausted

PAGE = 50


def size_of(value: Any) -> int:
    """A value's size as SPEC §2 counts it: its compact UTF-8 JSON."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))
               .encode("utf-8", "surrogatepass"))


def scope(db: agentstate.Database, rule: SessionRule, kind: str, scope_id: str,
          p: agentstate.Principal, rules: Rules = None,
          as_of: int | None = None) -> agentstate.Scope:
    """A scope, after the grants and the session rule: what the API's key routes would let
    ``p`` (with ``rules``, its token's grants) read; ``as_of``: as it was right after that
    change (SPEC §17: the same rules)."""
    s = db.scope(kind, scope_id)
    need(p, rules, s.kind, s.id, False)
    rule.check(p, s.kind, s.id)
    return s if as_of is None else Past(db._ops, as_of).scope(s.kind, s.id)


def moment(db: agentstate.Database, seq: int) -> Any:
    """When change ``seq`` was committed, or None (purged, or 0)."""
    try:
        found = db.changes(seq - 1, limit=1) if seq > 0 else []
    except CursorExpired:
        return None
    return found[0].at if found and found[0].seq == seq else None


def run_grants(p: agentstate.Principal, rules: Rules) -> Rules:
    """The rules a list of runs must keep to: None for an admin or a token without grants."""
    return None if readable(p, rules) is None else rules


@dataclass
class Stored:
    """A key's value as the store holds it: JSON text (``text``), or bytes (``data``, and
    ``text`` empty)."""

    version: int
    text: str
    data: bytes | None
    is_list: bool = False

    @property
    def size(self) -> int:
        return len(self.data) if self.data is not None else len(self.text.encode("utf-8"))


def stored(db: agentstate.Database, sc: agentstate.Scope, key: str,
           as_of: int | None = None) -> Stored | None:
    """A key's row (``as_of``: right after that change, SPEC §17), not decoded (the store's
    C decoder holds the GIL for a whole value: a hostile 1 MiB of nested lists stalled every
    request; the pages parse with _json)."""
    row = db._ops.kv_get(sc.kind, sc.id, key, raw=True, as_of=as_of)
    if row is None:
        return None
    type_, value, version, items = row
    if type_ == "bytes":
        if _json.is_json(value):  # bytes that are UTF-8 JSON show as JSON, as get() reads them
            return Stored(version, value.decode("utf-8"), None)
        return Stored(version, "", value)
    if type_ == "list":
        return Stored(version, "[" + (items or "") + "]", None, True)
    return Stored(version, value, None)


SHOWN_VALUES = 50_000  # values parsed for a page: past them a value is cut (a page shows fewer)


def parse(text: str) -> tuple[Any, bool]:
    """Stored JSON text as a value for a page, and whether it was cut: parsed a piece at a
    time, and only as far as a page could show (_json.parse_prefix)."""
    return _json.parse_prefix(text, SHOWN_VALUES)


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


def overview(db: agentstate.Database, rule: SessionRule, p: agentstate.Principal,
             rules: Rules = None) -> Overview:
    """Counts (up to CAP), the turns that need eyes, the newest runs and changes: each a
    bounded read (the paged lists of SPEC §3/§4), whatever the size of the store."""
    head = db.last_change()
    turns = {name: db.sessions.turns_by_status(p, statuses, limit=CAP + 1)
             for name, statuses in SECTIONS.items()}
    runs = db.runs._list(None, CAP + 1, run_grants(p, rules))
    sessions = db.sessions.list(p, limit=CAP + 1)
    latest = rule.visible(p, changes_window(db, head, 200)[0], rules)[-20:]
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
    raw: bytes  # the page's entries and the snapshot, as stored: its ?format=json


def _raw_page(rows: list[tuple[int, str]], snapshot: str | None) -> bytes:
    return raw_object(entries=b"[" + b",".join(stored_text(t) for _, t in rows) + b"]",
                      snapshot=stored_text(snapshot))


def _head(db: agentstate.Database, run_id: str) -> tuple[RunHead, str | None]:
    """``runs.head()``, its snapshot parsed by _json (see ``stored``), and as stored."""
    got = db._ops.run_head(check_key(run_id, "run id"))
    if got is None:
        raise agentstate.RunNotFound(f"no run {run_id!r}")
    snapshot, next_seq, fmt, first, created, updated, pinned = got
    return RunHead(run_id, None if snapshot is None else _shown(snapshot), first, next_seq, fmt,
                   parse_time(created), parse_time(updated), bool(pinned)), snapshot


def _shown(text: str, seq: int | None = None) -> Any:
    """An entry or a snapshot for a page: cut past what a page shows (its JSON link has all)."""
    value, cut = parse(text)
    if cut and isinstance(value, dict) and seq is not None:
        value.setdefault("seq", seq)  # the timeline needs it, wherever it was in the text
    return value


def entries(db: agentstate.Database, run_id: str, since: int, n: int | None,
            budget: list[int] | None = None) -> list[dict[str, Any]]:
    """``runs.entries()``, parsed by _json; ``budget``: bytes that may still be read (spent
    here; Exhausted once none is left: entries may be 16 MiB each)."""
    if budget is not None and budget[0] <= 0:
        raise Exhausted(f"read {LIMITS.run_page_search:,} bytes of entries after the page")
    rows = db._ops.run_entries(run_id, since, n)
    if budget is not None:
        budget[0] -= sum(len(text) for _, text in rows)
    return [_shown(text, seq) for seq, text in rows]


def run_page(db: agentstate.Database, run_id: str, before: int | None, size: int = PAGE) -> RunPage:
    """One page of a run's entries, the newest by default: ``tail`` and ``entries``
    read only the page (and the first entry), whatever the run's length."""
    rh, snapshot = _head(db, run_id)
    first, last = (rh.first_seq, rh.next_seq - 1) if rh.next_seq > rh.first_seq else (None, None)
    newest = before is None or last is None or before > last
    if first is None or last is None:
        raw_rows = []
    elif newest or before is None:
        raw_rows = db._ops.run_tail(run_id, size)
    else:
        since = max(first, before - size)
        raw_rows = db._ops.run_entries(run_id, since, max(0, before - since))
    rows = [_shown(text, seq) for seq, text in raw_rows]
    lo = rows[0]["seq"] if rows else None
    older = lo if lo is not None and first is not None and lo > first else None
    newer = None if newest or before is None or last is None or before + size > last \
        else before + size
    return RunPage(run_id, rh.summary, rows, first, last, older, newer, newest, rh.snapshot,
                   _raw_page(raw_rows, snapshot))


def snapshot_page(db: agentstate.Database, run_id: str) -> tuple[Any, bytes]:
    """A run's snapshot on a page of its own (the history is not read), and as stored."""
    rh, snapshot = _head(db, run_id)
    return rh.snapshot, stored_text(snapshot)


def fence_holds(db: agentstate.Database, turn_id: str) -> bool:
    """Whether a once() claim fenced by the turn is still live (``claim_live``: the turn
    holds its lease, or is held or decided); whoever asks, as runs have no owner and only
    the claim's state is shown."""
    try:
        return claim_live(db.sessions.get_turn(turn_id, SEE_ALL).status)
    except agentstate.AgentStateError:
        return False
