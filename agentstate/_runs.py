"""Runs (SPEC §3): an append-only history of entries and one snapshot per run."""

from __future__ import annotations

import builtins
import os
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from pydantic.dataclasses import dataclass

from . import _calls, _runfiles
from ._calls import Claim
from ._twins import async_twin
from ._encoding import canonical, check_fence, check_int, check_key, decode, encode
from .errors import Damaged, InvalidValue, RunNotFound, SchemaTooNew

if TYPE_CHECKING:
    from .backends.base import Ops

MAX_RECORD = 16 * 1024 * 1024  # an entry (with its seq) or a snapshot
RUN_FORMAT = 1  # what run.format this agentstate writes and reads
UNKNOWN_RESULT = (
    "The run stopped after this tool call was made and before its result was saved: "
    "the call may or may not have run. Check its effects before calling it again."
)


class RunHead(NamedTuple):
    """A run without its history: the snapshot, the seqs kept, the store's times."""

    id: str
    snapshot: dict[str, Any] | None
    first_seq: int  # the oldest entry kept (trim() moves it up)
    next_seq: int  # the seq the next entry takes; first_seq == next_seq: no entries
    format: int
    created_at: datetime
    updated_at: datetime
    pinned: bool = False  # runs.pin(): prune() leaves it

    @property
    def summary(self) -> SavedState:
        return SavedState.from_snapshot(self.id, self.snapshot, created_at=self.created_at,
                                        updated_at=self.updated_at, pinned=self.pinned)


class Record(NamedTuple):
    """A run: all entries in seq order, and the snapshot (or None)."""

    entries: list[dict[str, Any]]
    snapshot: dict[str, Any] | None


@dataclass(frozen=True)
class SavedState:
    """A run's summary: the store's own UTC times, the rest from the snapshot."""

    id: str
    task: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    turn: int = 0
    stopped_by: str | None = None
    finished: bool = False
    pinned: bool = False  # the store's, not the snapshot's: runs.pin()

    @classmethod
    def from_snapshot(
        cls,
        run_id: str,
        snapshot: dict[str, Any] | None,
        *,
        created_at: datetime | None = None,
        updated_at: datetime | None = None,
        pinned: bool = False,
    ) -> SavedState:
        """Build a summary from a snapshot dict; fields of the wrong type take their defaults."""
        snap = snapshot if isinstance(snapshot, dict) else {}
        task, turn = snap.get("task"), snap.get("turn")
        stopped_by, finished = snap.get("stopped_by"), snap.get("finished")
        return cls(
            id=run_id,
            task=task if isinstance(task, str) else "",
            created_at=created_at,
            updated_at=updated_at,
            turn=turn if isinstance(turn, int) and not isinstance(turn, bool) else 0,
            stopped_by=stopped_by if isinstance(stopped_by, str) else None,
            finished=finished if isinstance(finished, bool) else False,
            pinned=pinned,
        )


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)


def _check_count(name: str, v: Any, allow_none: bool = False) -> None:
    if v is None and allow_none:
        return
    check_int(name, v)


def encode_entries(entries: Any) -> list[tuple[int, str]]:
    """Validate entries (dicts with an int seq, consecutive) into (seq, JSON text)."""
    if not isinstance(entries, (list, tuple)):
        raise InvalidValue(f"entries must be a list of dicts, got {type(entries).__name__}")
    out = []
    for e in entries:
        if not isinstance(e, dict):
            raise InvalidValue(f"an entry must be a dict, got {type(e).__name__}")
        seq = e.get("seq")
        if type(seq) is not int or not 0 <= seq < 2**63 - 1:
            raise InvalidValue(f"an entry needs an integer seq >= 0, got {seq!r}")
        out.append((seq, encode(e, MAX_RECORD)[0]))
    return out


def encode_snapshot(snapshot: Any) -> str | None:
    if snapshot is None:
        return None
    if not isinstance(snapshot, dict):
        raise InvalidValue(f"a snapshot must be a dict or None, got {type(snapshot).__name__}")
    return encode(snapshot, MAX_RECORD)[0]


def _decode_entries(rows: list[tuple[int, str]]) -> list[dict[str, Any]]:
    try:
        return decode("[" + ",".join(r[1] for r in rows) + "]") if rows else []
    except ValueError as e:  # stored as JSON by us: someone changed it by hand
        raise Damaged(f"a stored run entry is not valid JSON (changed outside agentstate?): {e}") from None


class RunStore:
    """``db.runs``: agent runs kept outside the process."""

    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    def write(
        self, run_id: str, entries: list[dict[str, Any]], snapshot: dict[str, Any] | None,
        *, create: bool = False, fence: Any = None,
    ) -> None:
        """Add history entries and replace the snapshot, in one transaction.

        Entries whose seq the run has are skipped; the rest must continue right
        after the last stored seq. ``snapshot=None`` keeps the current one.

        :raises InvalidValue: checked first, before anything is read.
        :raises TooLarge: checked first, before anything is read.
        :raises RunExists: ``create=True`` and the run exists.
        :raises RunNotFound: ``create=False`` and the run does not exist.
        :raises HistoryGap: the entries leave a gap; nothing is written.
        :raises LeaseLost: ``fence`` (a Turn or turn id, SPEC §14) no longer holds its lease.
        """
        check_key(run_id, "run id")
        rows = encode_entries(entries)
        snap = encode_snapshot(snapshot)
        turn_id = check_fence(fence)
        ops = self._ops if turn_id is None else self._ops.fenced(turn_id)
        ops.run_write(run_id, rows, snap, create)

    def read(self, run_id: str) -> Record | None:
        """All entries from seq 0 and the snapshot; None if there is no such run."""
        check_key(run_id, "run id")
        got = self._ops.run_read(run_id)
        if got is None:
            return None
        head, rows = got
        return Record(_decode_entries(rows), decode(head[0]) if head[0] is not None else None)

    def head(self, run_id: str) -> RunHead | None:
        """The run's snapshot, seqs and times without reading its history; None if absent."""
        check_key(run_id, "run id")
        got = self._ops.run_head(run_id)
        if got is None:
            return None
        snapshot, next_seq, fmt, first, created, updated, pinned = got
        return RunHead(run_id, decode(snapshot) if snapshot is not None else None, first, next_seq,
                       fmt, parse_time(created), parse_time(updated), bool(pinned))

    def pin(self, run_id: str, pinned: bool = True) -> bool:
        """Keep a run from ``prune()`` (``pinned=False``: let it go again), for runs an
        adapter or a person keeps; an explicit ``delete`` or ``trim`` still acts on it.
        Returns whether the run is pinned now.

        :raises RunNotFound: no such run.
        """
        check_key(run_id, "run id")
        if type(pinned) is not bool:
            raise InvalidValue(f"pinned must be True or False, got {pinned!r}")
        return self._ops.run_pin(run_id, pinned)

    def trim(self, run_id: str, *, before: int) -> int:
        """Remove the entries with seq < ``before``; return how many.

        The history then starts at that seq and stays contiguous to the last
        (``before`` past the last entry removes them all; ``write`` goes on
        after the last seq as before).

        :raises RunNotFound: no such run.
        """
        check_key(run_id, "run id")
        check_int("before", before)
        return self._ops.run_trim(run_id, before)

    def prune(self, *, older_than: float, finished_only: bool = True) -> list[str]:
        """Delete the runs not written for ``older_than`` seconds (only those whose
        snapshot says ``finished``, unless ``finished_only=False``; never a pinned one);
        return their ids."""
        if isinstance(older_than, bool) or not isinstance(older_than, (int, float)) \
                or not 0 <= older_than < 1e11:
            raise InvalidValue(f"older_than must be a number of seconds >= 0, got {older_than!r}")
        if type(finished_only) is not bool:
            raise InvalidValue(f"finished_only must be True or False, got {finished_only!r}")
        return self._ops.run_prune(older_than, finished_only)

    def entries(self, run_id: str, since: int = 0, limit: int | None = None, *,
                raw: bool = False) -> list[Any]:
        """Entries with seq >= since, at most ``limit``; [] for an unknown run.

        ``raw=True``: each entry as its stored JSON text, not decoded (for a caller
        that passes entries on as they are).
        """
        check_key(run_id, "run id")
        _check_count("since", since)
        _check_count("limit", limit, allow_none=True)
        if type(raw) is not bool:
            raise InvalidValue(f"raw must be True or False, got {raw!r}")
        rows = self._ops.run_entries(run_id, since, limit)
        return [text for _seq, text in rows] if raw else _decode_entries(rows)

    def tail(self, run_id: str, n: int) -> list[dict[str, Any]]:
        """The last ``n`` entries, in seq order; [] for an unknown run."""
        check_key(run_id, "run id")
        _check_count("n", n)
        return _decode_entries(self._ops.run_tail(run_id, n))

    def delete(self, run_id: str) -> bool:
        """Remove the run, its history and snapshot; nothing if absent. True if it existed."""
        check_key(run_id, "run id")
        return self._ops.run_delete(run_id)

    def list(self, *, after: str | None = None, limit: int | None = None) -> list[SavedState]:
        """Every run, most recently updated first (their histories are not read).

        Paged: ``after`` (the id of a page's last run) returns the runs listed after
        it, ``limit`` caps the count. A run written since moves to the front.

        :raises RunNotFound: ``after`` names no run (deleted since: list from the start).
        """
        return self._list(after, limit)

    def _list(self, after: str | None, limit: int | None,
              grants: tuple[Any, ...] | None = None) -> builtins.list[SavedState]:
        """``list()``; with ``grants`` (a token's rules, SPEC §15) only the runs they cover."""
        if after is not None:
            check_key(after, "run id")
        _check_count("limit", limit, allow_none=True)
        rows = self._ops.run_list(after, limit, grants)
        out = []
        for run_id, created, updated, *fields, pinned in rows:
            task, turn, stopped_by, finished = (decode(f) if f is not None else None for f in fields)
            out.append(SavedState.from_snapshot(
                run_id, {"task": task, "turn": turn, "stopped_by": stopped_by, "finished": finished},
                created_at=parse_time(created), updated_at=parse_time(updated), pinned=bool(pinned),
            ))
        return out

    def load(self, run_id: str) -> Record:
        """The run ready to resume: interrupted tool calls get a synthetic result.

        Every ``{"type": "tool_call", "call_id": X}`` entry with no later
        ``tool_result`` for X gets ``{"type": "tool_result", "call_id": X,
        "status": "unknown", "content": ...}`` appended (not saved).

        :raises RunNotFound: no such run.
        :raises Damaged: the stored run is inconsistent.
        :raises SchemaTooNew: the run was written by a newer agentstate.
        """
        check_key(run_id, "run id")
        got = self._ops.run_read(run_id)
        if got is None:
            raise RunNotFound(f"no run {run_id!r}")
        head, rows = got
        snapshot_text, next_seq, fmt, first = head[:4]
        if fmt > RUN_FORMAT:
            raise SchemaTooNew(f"run {run_id!r} has format {fmt}; this agentstate reads {RUN_FORMAT}")
        entries = self._verify(run_id, rows, first, next_seq)
        try:
            snapshot = decode(snapshot_text) if snapshot_text is not None else None
        except ValueError as e:
            raise Damaged(f"run {run_id!r}: the snapshot is not JSON: {e}") from None
        if snapshot is not None and not isinstance(snapshot, dict):
            raise Damaged(f"run {run_id!r}: the snapshot is not an object")
        open_calls: dict[Any, Any] = {}  # insertion-ordered: calls in history order
        for entry in entries:
            kind, call_id = entry.get("type"), entry.get("call_id")
            if call_id is None:
                continue
            if kind == "tool_call":
                open_calls[_hashable(call_id)] = call_id
            elif kind == "tool_result":
                open_calls.pop(_hashable(call_id), None)
        synthetic = [
            {"type": "tool_result", "call_id": call_id, "status": "unknown", "content": UNKNOWN_RESULT}
            for call_id in open_calls.values()
        ]
        return Record(entries + synthetic, snapshot)

    @staticmethod
    def _verify(run_id: str, rows: builtins.list[tuple[int, str]], first: int,
                next_seq: int) -> builtins.list[dict[str, Any]]:
        entries = []
        for i, (seq, text) in enumerate(rows, first):
            try:
                e = decode(text)
            except ValueError as err:
                raise Damaged(f"run {run_id!r}: entry {seq} is not JSON: {err}") from None
            if seq != i or not isinstance(e, dict) or e.get("seq") != seq:
                raise Damaged(f"run {run_id!r}: entry at position {i} has seq {seq} / {e!r:.60}")
            entries.append(e)
        if len(entries) != next_seq - first:
            raise Damaged(f"run {run_id!r}: {len(entries)} entries stored, seqs {first}.."
                          f"{next_seq - 1} recorded")
        return entries

    def fork(self, run_id: str, new_id: str, *, upto: int | None = None) -> None:
        """A new run with the entries up to and including seq ``upto`` and the snapshot.

        :raises RunNotFound: no run ``run_id``. :raises RunExists: ``new_id`` exists.
        """
        check_key(run_id, "run id")
        check_key(new_id, "run id")
        _check_count("upto", upto, allow_none=True)
        self._ops.run_fork(run_id, new_id, upto)

    # -- tool calls that run at most once (SPEC §14) ---------------------------

    def claim(self, run_id: str, call_id: str, *, call: dict[str, Any] | None = None,
              fence: Any = None, lease: float = 300.0, retry: bool = False) -> Claim:
        """Claim the tool call ``call_id`` of the run, or say where it stands, in one
        transaction (the lookup is an index probe, whatever the run's length).

        ``claimed``: nobody had; a ``tool_call`` entry (``call``'s keys merged in, with
        ``at``, ``fence`` and ``lease``) is now committed at the next seq — run the call
        and :meth:`settle` it. ``done``/``failed``: a result is recorded. ``in_progress``:
        another claim is live (its fence's turn holds its lease, or without a fence less
        than its ``lease`` seconds passed). ``in_doubt``: a claim with no result that is
        no longer live — it may have run; ``retry=True`` claims it again (``"retry": n``).

        :raises RunNotFound: no such run.
        :raises LeaseLost: ``fence`` lapsed (nothing appended).
        :raises InvalidKey: a bad run or call id.
        :raises InvalidValue: a bad ``call``, ``lease`` or ``retry``.
        """
        return _calls.claim(self._ops, run_id, call_id, call, fence, lease, retry)

    def settle(self, run_id: str, call_id: str, *, result: Any = None, error: str | None = None,
               fence: Any = None, retry: int | None = None) -> None:
        """Record the outcome of a claimed call: ``result`` (``"status": "ok"``), or the
        ``error``'s text (``"status": "error"``), as a ``tool_result`` entry. ``retry``
        names the claim settled (its entry's ``retry``, 0 for the first claim; ``once``
        passes it): a claimer whose claim a retry superseded records nothing.

        :raises InvalidTransition: the call is not claimed, settled already, or (``retry``)
            claimed again since.
        :raises InvalidValue: both ``result`` and ``error``; a result that is not a JSON value.
        :raises RunNotFound: as for :meth:`claim`.
        :raises LeaseLost: as for :meth:`claim`.
        """
        _calls.settle(self._ops, run_id, call_id, result, error, fence, retry)

    def once(self, run_id: str, call_id: str, fn: Callable[[], Any], *,
             call: dict[str, Any] | None = None,
             reconcile: Callable[[str, dict[str, Any]], Any] | None = None,
             fence: Any = None, lease: float = 300.0) -> Any:
        """Run ``fn()`` at most once for ``(run_id, call_id)``, however often the process
        crashes and resumes and however many workers race, and return its result.

        The claim is on disk before ``fn`` runs; its result (a JSON value) or its error
        is recorded after. A recorded result is returned without calling anything; a
        recorded error raises ``CallFailed``. A claim with no result whose worker may
        still run is ``CallInProgress``; one that is no longer live is in doubt:
        ``reconcile(call_id, entry)`` asks the outside world (say, the payment provider,
        by the idempotency key the call was made with) and returns the call's result
        (recorded and returned) or ``agentstate.NOT_RUN`` (then ``fn`` runs); without
        ``reconcile``, ``InDoubt``. If ``fn`` raises, its error is recorded and it
        propagates; an interrupt (Ctrl-C, a cancel) leaves the call in doubt.

        :raises InDoubt: as above.
        :raises CallInProgress: as above.
        :raises CallFailed: as above.
        :raises LeaseLost: as above.
        :raises RunNotFound: as above.
        """
        return _calls.once(self._ops, run_id, call_id, fn, call, reconcile, fence, lease)

    async def aonce(self, run_id: str, call_id: str, fn: Callable[[], Any], *,
                    call: dict[str, Any] | None = None,
                    reconcile: Callable[[str, dict[str, Any]], Any] | None = None,
                    fence: Any = None, lease: float = 300.0) -> Any:
        """The async twin of :meth:`once`: ``fn`` and ``reconcile`` may be async."""
        return await _calls.aonce(self._ops, run_id, call_id, fn, call, reconcile, fence, lease)

    def export(self, run_id: str, folder: str | os.PathLike[str]) -> Path:
        """Write the run to ``folder/{run_id}/log.jsonl`` and ``snapshot.json``."""
        return _runfiles.export_run(self, run_id, folder)

    def import_runs(self, folder: str | os.PathLike[str]) -> builtins.list[_runfiles.ImportResult]:
        """Import every run folder below ``folder``; see ``_runfiles.import_runs``."""
        return _runfiles.import_runs(self, folder)

    def _next_seq(self, run_id: str) -> int | None:
        head = self._ops.run_head(run_id)
        return None if head is None else head[1]

    awrite = async_twin(write)
    aread = async_twin(read)
    ahead = async_twin(head)
    aentries = async_twin(entries)
    atail = async_twin(tail)
    adelete = async_twin(delete)
    alist = async_twin(list)
    aload = async_twin(load)
    afork = async_twin(fork)
    atrim = async_twin(trim)
    aprune = async_twin(prune)
    apin = async_twin(pin)
    aclaim = async_twin(claim)
    asettle = async_twin(settle)


def _hashable(v: Any) -> str:
    """call_ids match when they are the same JSON value (objects in any key order)."""
    return canonical(v)
