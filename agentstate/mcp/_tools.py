"""The tools (SPEC §18): one table, ``TOOLS``, of what each is, what it takes, what it says
to a model, and the function that runs it.

Each function is thin: the caller's access checked (``Caller``: grants and the session rule,
as the State API checks them), then one call of the public API (``Scope``, ``RunStore``,
``Sessions``; a remote store's are the same objects), so validation, errors and limits are
the store's. Blocking functions run in a worker thread; ``async`` ones (a wait) on the loop.
Lists are paged with a bounded default and maximum (``_args.PAGE``, ``MAX_PAGE``).

To add a tool: its arguments in ``_args``, a function here, and one ``Tool(...)`` line in
``TOOLS`` (``reads=True`` if it writes nothing: ``--read-only`` serves only those).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from agentstate import _changes
from agentstate._encoding import INT_MAX, encode
from agentstate.backends.base import KEEP
from agentstate.errors import RunNotFound, VersionConflict
import agentstate.server._feedread as _feedread
import agentstate.server._http as h
from agentstate.server._api import change, next_after
from agentstate.server._limits import LIMITS
from agentstate.server.views.past import history_page
from agentstate.server.views.runs import _summary
from agentstate.server.views.sessions import _session, _turn

from . import _args as A
from ._caller import Caller

PAGE_BYTES = 1024 * 1024  # of entries one runs_load page carries (at least one entry)


@dataclass(frozen=True)
class Tool:
    name: str
    args: type[BaseModel]
    run: Callable[..., Any]  # (Caller, args) -> the answer: blocking, or async
    description: str
    reads: bool = False  # writes nothing: served with --read-only too
    destructive: bool = False  # may overwrite or remove what is stored (a hint to clients)


# -- keys of scopes (SPEC §2) ------------------------------------------------------------

def state_get(c: Caller, a: A.StateGet) -> dict[str, Any]:
    v = c.scope(a.scope, write=False).get_versioned(a.key)
    return {"value": v.value, "version": v.version}


def state_put(c: Caller, a: A.StatePut) -> dict[str, Any]:
    s = c.scope(a.scope, write=True)
    return {"version": s.put(a.key, a.value, if_version=a.if_version, ttl=a.ttl)}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396: ``patch`` applied to ``target`` (neither is changed). Recursion as deep as
    the patch, which the store's own check has bounded (``encode``: 512 levels)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            out.pop(name, None)
        else:
            out[name] = merge_patch(out.get(name), value)
    return out


def state_update(c: Caller, a: A.StateUpdate) -> dict[str, Any]:
    """One compare-and-set: the patch is applied to the value read at ``if_version`` and
    written only while the key is still at that version (the store's put decides)."""
    s = c.scope(a.scope, write=True)
    encode(a.patch)  # the store's rules for the patch itself (depth, NaN, size) before merging
    now = s.get_versioned(a.key)
    if now.version != a.if_version:  # the put would refuse it too: say so without merging
        raise VersionConflict(f"{a.key!r} is at version {now.version}, not {a.if_version}: read "
                              "it again and apply your change to what is stored now",
                              now.version)
    new = merge_patch(now.value, a.patch)
    keep: Any = KEEP  # its expiry kept, as update() keeps it
    version = s.put(a.key, new, if_version=a.if_version, ttl=keep)
    return {"value": new, "version": version}


def state_append(c: Caller, a: A.StateAppend) -> dict[str, Any]:
    r = c.scope(a.scope, write=True).append(a.key, a.items)
    return {"length": r.length, "version": r.version}


def state_slice(c: Caller, a: A.StateSlice) -> dict[str, Any]:
    """Python's slice semantics, at most ``limit`` items read. Negative indexes are made
    absolute by the list's length first (a second read: a list that grows meanwhile shifts
    that page, as it would between two pages anyway)."""
    s = c.scope(a.scope, write=False)
    start, stop = a.start, a.stop
    if start < 0 or (stop is not None and stop < 0):
        start, stop, _ = slice(start, stop).indices(s.length(a.key))
    end = start + a.limit + 1 if stop is None else min(stop, start + a.limit + 1)
    items = s.slice(a.key, start, min(end, INT_MAX))  # one more than asked: are there more?
    more = len(items) > a.limit
    return {"items": items[:a.limit], "next": start + a.limit if more else None}


def state_delete(c: Caller, a: A.StateDelete) -> dict[str, Any]:
    return {"deleted": c.scope(a.scope, write=True).delete(a.key, if_version=a.if_version)}


def state_list(c: Caller, a: A.StateList) -> dict[str, Any]:
    keys = c.scope(a.scope, write=False).list(a.prefix, after=a.after, limit=a.limit)
    return {"keys": keys, "next": keys[-1] if len(keys) == a.limit else None}


def state_history(c: Caller, a: A.StateHistory) -> dict[str, Any]:
    """The key's kept revisions (SPEC §17), as the API's history route gives them: a page
    that ends early once its values pass ``PAGE_BYTES`` (a model reads it)."""
    s = c.scope(a.scope, write=False)
    return history_page(s, a.key, None, a.before, a.limit, PAGE_BYTES)


# -- the change feed (SPEC §9) -------------------------------------------------------------

async def changes_wait(c: Caller, a: A.ChangesWait) -> dict[str, Any]:
    """The API's long poll (``GET /v1/changes?wait=``), for a tool: what the caller may see
    (grants, the session rule), and the cursor past everything scanned."""
    flt = _changes.filters(a.topic, a.kind, a.scope_id, a.key)  # checked before any wait
    db = c.db
    since = a.since if a.since is not None else await h.blocking(db.last_change)
    if c.remote:  # its server applies the caller's rules, and waits
        head = await h.blocking(db.last_change)  # scanned by the watch below if it finds nothing
        found = await h.blocking(db.watch, since, timeout=a.wait, limit=a.limit, **flt)
        return {"changes": [change(x) for x in found],
                "last": found[-1].seq if found else max(since, head)}
    assert c.notifier is not None and c.waits is not None
    notifier, deadline = c.notifier, time.monotonic() + a.wait
    with c.waits.hold(c.principal()) if a.wait else contextlib.nullcontext():  # Busy past its limit
        while True:
            event = notifier.event  # before the read: a change during it is not missed
            shown, since, more = await h.blocking(_feedread.read, db, c.rule, c.p, since, a.limit,
                                                  flt, c.rules)
            left = deadline - time.monotonic()
            if shown or left <= 0 or notifier.closing:
                return {"changes": [change(x) for x in shown], "last": since}
            if not more:
                await notifier.wait(min(left, LIMITS.stream_recheck), event)
            c = await c.again()  # its token revoked meanwhile: Unauthorized, nothing shown


# -- runs (SPEC §3) and calls made at most once (§14) --------------------------------------

def runs_write(c: Caller, a: A.RunsWrite) -> dict[str, Any]:
    c.run(a.run_id, write=True)
    c.db.runs.write(a.run_id, a.entries, a.snapshot, create=a.create)
    return {"written": True}


def runs_load(c: Caller, a: A.RunsLoad) -> dict[str, Any]:
    """``runs.load`` (the run ready to resume: open calls get their synthetic result at the
    end), one page of it: entries by seq, the synthetic ones counted after the last seq."""
    c.run(a.run_id, write=False)
    head = c.db.runs.head(a.run_id)  # where a write goes on, whatever the page
    if head is None:
        raise RunNotFound(f"no run {a.run_id!r}")
    rec = c.db.runs.load(a.run_id)
    real = next((i for i, e in enumerate(rec.entries) if "seq" not in e), len(rec.entries))
    first = rec.entries[0]["seq"] if real else head.first_seq
    next_seq = max(head.next_seq, rec.entries[real - 1]["seq"] + 1) if real else head.next_seq
    pos = max(0, a.since - first)
    page: list[Any] = []
    size = 0
    for entry in rec.entries[pos:pos + a.limit]:
        size += len(h.dumps(entry))
        if page and size > PAGE_BYTES:
            break
        page.append(entry)
    end = pos + len(page)
    return {"snapshot": rec.snapshot, "entries": page,
            "next": first + end if end < len(rec.entries) else None,
            "first_seq": first, "next_seq": next_seq}


def runs_list(c: Caller, a: A.RunsList) -> dict[str, Any]:
    if c.limited:  # a token with grants sees the runs its rules cover, as GET /v1/runs shows
        if a.after is not None:
            c.run(a.after, write=False)
        found = c.db.runs._list(a.after, a.limit, c.rules)
    else:
        found = c.db.runs.list(after=a.after, limit=a.limit)
    return {"runs": [_summary(r) for r in found], "next": next_after(found, a.limit)}


def call_claim(c: Caller, a: A.CallClaim) -> dict[str, Any]:
    c.run(a.run_id, write=True)
    got = c.db.runs.claim(a.run_id, a.call_id, call=a.call, lease=a.lease, retry=a.retry)
    out: dict[str, Any] = {"status": got.status, "entry": got.entry}
    if got.status == "done":
        out["result"] = got.result
    elif got.status == "failed":
        out["error"] = got.error
    return out


def call_settle(c: Caller, a: A.CallSettle) -> dict[str, Any]:
    c.run(a.run_id, write=True)
    c.db.runs.settle(a.run_id, a.call_id, result=a.result, error=a.error, retry=a.retry)
    return {"settled": True}


# -- sessions and turns (SPEC §4): the owner rule is the store's -------------------------

def session_create(c: Caller, a: A.SessionCreate) -> dict[str, Any]:
    return _session(c.db.sessions.create(c.principal(), metadata=a.metadata))


def turn_start(c: Caller, a: A.TurnStart) -> dict[str, Any]:
    return _turn(c.db.sessions.start_turn(a.session_id, c.principal(), input=a.input,
                                          lease=a.lease, queued=a.queued))


def turn_finish(c: Caller, a: A.TurnFinish) -> dict[str, Any]:
    return _turn(c.db.sessions.get_turn(a.turn_id, c.principal()).finish(a.result))


def turn_fail(c: Caller, a: A.TurnFail) -> dict[str, Any]:
    return _turn(c.db.sessions.get_turn(a.turn_id, c.principal()).fail(a.error))


def turn_heartbeat(c: Caller, a: A.TurnHeartbeat) -> dict[str, Any]:
    return _turn(c.db.sessions.get_turn(a.turn_id, c.principal()).heartbeat(a.lease))


CONFLICT = ("A version_conflict error carries current_version: read the key again "
            "(state_get), redo your change on what is stored now, and retry with that version.")

TOOLS: tuple[Tool, ...] = (
    Tool("state_get", A.StateGet, state_get, reads=True, description=(
        "Read a key of a scope: its value and its version (version 0 and value null: the key is "
        "absent). Pass the version as if_version to state_put, state_update or state_delete to "
        "write only if nobody wrote the key in between.")),
    Tool("state_put", A.StatePut, state_put, destructive=True, description=(
        "Write a key's value (any JSON value, at most 1 MiB) and return its new version. "
        "Without if_version the value replaces whatever is stored (the last writer wins). When "
        "the new value depends on what you read (a counter, a list or object you edit), pass "
        "if_version (the version you read; 0: create only if absent): a concurrent write by "
        "another agent then makes this call fail instead of being lost. " + CONFLICT)),
    Tool("state_update", A.StateUpdate, state_update, destructive=True, description=(
        "Change part of a key's value as one compare-and-set: a JSON merge patch (RFC 7396) is "
        "applied to the value stored at if_version (members replaced, null members removed, "
        "nested objects merged) and written only if the key is still at that version. Returns "
        "the new value and version; the key's expiry is kept. Use it to change some fields of "
        "an object, or to increment a counter field (read it, patch it with the new number). "
        + CONFLICT)),
    Tool("state_append", A.StateAppend, state_append, description=(
        "Add items at the end of a list key, atomically, creating the list if absent; returns "
        "its length and version. Appends by several agents at once never overwrite each "
        "other, so use this (not state_put) for logs, messages and events. not_a_list: the key "
        "holds something other than a list.")),
    Tool("state_slice", A.StateSlice, state_slice, reads=True, description=(
        "Read items of a list key with Python's slice semantics (start, stop; negatives count "
        "from the end: start -10 for the last ten). At most limit items come back; next is the "
        "start to pass (with the same stop) for the following ones, null when there are no "
        "more. An absent key reads as []; not_a_list: it holds something else.")),
    Tool("state_delete", A.StateDelete, state_delete, destructive=True, description=(
        "Delete a key; deleted says whether it existed. With if_version, only if the key is "
        "still at that version. " + CONFLICT)),
    Tool("state_list", A.StateList, state_list, reads=True, description=(
        "List the keys of a scope in ascending order, a page at a time: pass next as after for "
        "the next page (next is null on the last page). prefix keeps the keys that start with "
        "it.")),
    Tool("state_history", A.StateHistory, state_history, reads=True, description=(
        "See what a key held before: its revisions, newest first, each with seq (the change "
        "in the feed), version, op (put, append, pop, delete, expire, touch), at (when) and "
        "value (what the key held right after that change; null after a delete or an expiry; "
        "type bytes: the value was written as bytes and is base64 here). Use it to find what "
        "an earlier step saw or what a bad write replaced, then put a value back with "
        "state_put. Revisions are kept for a while (history_retention, a day by default); "
        "next, when not null, is the before to pass for older ones.")),
    Tool("changes_wait", A.ChangesWait, changes_wait, reads=True, description=(
        "Wait for writes by other agents and processes: the changes after since that match the "
        "filters (each with seq, topic kv/run/session, op, kind, scope_id, key, version), "
        "waiting up to wait seconds when there is none yet. Pass last as since in your next "
        "call to go on without missing or repeating a change. Values are not included: read "
        "them (state_get). cursor_expired: since is older than the store keeps; read the state "
        "again and call without since.")),
    Tool("runs_write", A.RunsWrite, runs_write, destructive=True, description=(
        "Add history entries to a run and/or replace its snapshot, in one transaction. Entries "
        "the run already has are skipped when equal, so a retry is safe; a different entry at a "
        "stored seq, or a gap, fails with history_gap and writes nothing (runs_load tells its "
        "next_seq). create true makes a new run.")),
    Tool("runs_load", A.RunsLoad, runs_load, reads=True, description=(
        "Read a run to resume it: its snapshot, and its history entries in seq order from "
        "since, a page at a time (next: the since of the following page, null at the end; "
        "next_seq: where the next write continues). A tool_call entry without a tool_result "
        "gets a synthetic result with status unknown at the end: that call may or may not "
        "have run.")),
    Tool("runs_list", A.RunsList, runs_list, reads=True, description=(
        "List runs, most recently updated first (id, task, turn, stopped_by, finished, "
        "created_at, updated_at, pinned), a page at a time: pass next as after.")),
    Tool("call_claim", A.CallClaim, call_claim, description=(
        "Make a call with an effect in the world (a payment, an e-mail, an order) at most once, "
        "whoever crashes or retries: claim it first, under a run and a call id that stay the "
        "same on every retry. status claimed: do it now, then record the outcome with "
        "call_settle. done: it ran already (result): do not do it again. failed: it ran and "
        "failed (error). in_progress: another worker holds the claim: wait and claim again. "
        "in_doubt: a claim lapsed without an outcome, so it may have happened: find out, then "
        "call_settle what happened (retry true claims it again: only if it did not happen). "
        "The run must exist (runs_write with create true).")),
    Tool("call_settle", A.CallSettle, call_settle, description=(
        "Record the outcome of a call claimed with call_claim: result (if it succeeded) or "
        "error (if it failed), exactly one. Later claims of the same call answer done or "
        "failed, and it never runs again. invalid_transition: the call is not claimed, or was "
        "settled already.")),
    Tool("session_create", A.SessionCreate, session_create, description=(
        "Create a session, owned by you: nobody else (but admins) can see or use it. Its state "
        "lives in the scope session:<id>; its turns run one at a time (turn_start).")),
    Tool("turn_start", A.TurnStart, turn_start, description=(
        "Start a turn of a session. One turn runs at a time, across every agent and process: "
        "session_busy (turn_id: the turn that runs) means wait for it (changes_wait with topic "
        "session and scope_id the session id) and try again. The turn holds a lease: call "
        "turn_heartbeat before it lapses, and turn_finish or turn_fail when done. A turn whose "
        "lease lapsed no longer blocks the session.")),
    Tool("turn_finish", A.TurnFinish, turn_finish, description=(
        "Finish a running turn, with an optional result: the session is free for the next "
        "turn. invalid_transition: the turn is not running (it lapsed and another took over).")),
    Tool("turn_fail", A.TurnFail, turn_fail, description=(
        "End a running turn as failed, with what went wrong, when it cannot complete: the "
        "session is free for the next turn. invalid_transition: the turn no longer runs.")),
    Tool("turn_heartbeat", A.TurnHeartbeat, turn_heartbeat, description=(
        "Renew a running turn's lease. invalid_transition: the turn no longer runs (its lease "
        "lapsed and another turn started): stop working on it.")),
)
BY_NAME = {t.name: t for t in TOOLS}
