"""Tool calls that run at most once (SPEC §14): ``runs.claim``, ``runs.settle``, ``runs.once``.

The store is the arbiter: a claim is a ``tool_call`` entry appended at the run's
next seq in one transaction with the lookup of the call id (an index probe), and
committed — on disk at durability full — before the tool runs; the outcome is a
``tool_result`` entry. Whatever crashes when, a later ``once`` finds the result,
a live claim (``CallInProgress``), or a claim in doubt (``InDoubt``, until
``reconcile`` says what happened); it never runs the tool a second time unless
``reconcile`` answers ``NOT_RUN``. The entries are ordinary run entries, so
``load()``, ``runs show``, the run page and SQL show them.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, NoReturn

from . import _batch
from ._encoding import check_fence, check_key, decode, encode, storable_text
from .backends.leases import RESERVED, claim_count
from .errors import CallFailed, CallInProgress, InDoubt, InvalidValue, TooLarge, UsageError

if TYPE_CHECKING:
    from .backends.base import Ops

MAX_RECORD = 16 * 1024 * 1024  # a run entry (SPEC §3)
STATUSES = ("claimed", "done", "failed", "in_progress", "in_doubt")


class _NotRun:
    """``reconcile``'s answer when the call's effect did not happen: it runs again."""

    _instance: _NotRun | None = None

    def __new__(cls) -> _NotRun:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "agentstate.NOT_RUN"

    def __reduce__(self) -> str:
        return "NOT_RUN"


NOT_RUN: Any = _NotRun()


class Claim(NamedTuple):
    """What ``runs.claim`` found or did: ``status`` one of claimed, done, failed,
    in_progress, in_doubt; ``result`` (done) or ``error`` (failed) as recorded; ``entry``,
    the call's newest entry (the claim, or its result)."""

    status: str
    result: Any
    error: str | None
    entry: dict[str, Any]


def _lease(lease: Any) -> float:
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease < 1e9:
        raise InvalidValue(f"lease must be a positive number of seconds, got {lease!r}")
    return float(lease)


def _ops(ops: Ops, fence: Any) -> Ops:
    turn_id = check_fence(fence)
    return ops if turn_id is None else ops.fenced(turn_id)


def _outside_blocks(ops: Ops, what: str) -> None:
    """A claim must be committed before the call runs (SPEC §16): inside a block it would
    commit with the block, or vanish with its rollback and the call run again."""
    where = ops.in_block() or ("batch()" if _batch.inside() else None)
    if where is not None:
        raise UsageError(f"{what} inside {where}: a claim must be committed before the call "
                         f"runs, and the block could roll it back (the call would run again): "
                         f"call it outside the block")


def _check_fn(fn: Any, reconcile: Any, sync: bool) -> None:
    """fn (and reconcile) must be callable, and not async for the sync once (whose result
    would be an unawaited coroutine): checked before anything is claimed."""
    for name, f in (("fn", fn), ("reconcile", reconcile)):
        if f is None and name == "reconcile":
            continue
        if not callable(f):
            raise UsageError(f"once() needs {name} to be a function to call, got "
                             f"{type(f).__name__} (pass the function, not its result)")
        if sync and (inspect.iscoroutinefunction(f)
                     or inspect.iscoroutinefunction(vars(type(f)).get("__call__"))):
            raise UsageError(f"{name} is an async function: use aonce(), which awaits it")


def claim(ops: Ops, run_id: str, call_id: str, call: Any, fence: Any, lease: Any,
          retry: Any) -> Claim:
    _outside_blocks(ops, "claim()")
    check_key(run_id, "run id")
    check_key(call_id, "call id")
    if call is not None:
        if not isinstance(call, dict):
            raise InvalidValue(f"call must be a dict of what the call was (its name, its "
                               f"arguments), got {type(call).__name__}")
        taken = sorted(set(call) & set(RESERVED))
        if taken:
            raise InvalidValue(f"call may not use the keys {', '.join(taken)}: the tool_call "
                               "entry sets them")
    text = None if call is None else encode(call, MAX_RECORD - 1024)[0]
    if type(retry) is not bool:
        raise InvalidValue(f"retry must be True or False, got {retry!r}")
    status, entry_text = _ops(ops, fence).run_claim(run_id, call_id, text, _lease(lease), retry)
    entry = decode(entry_text)
    return Claim(status, entry.get("result") if status == "done" else None,
                 entry.get("error") if status == "failed" else None, entry)


def outcome(result: Any = None, error: Any = None) -> str:
    """The JSON text of a recorded outcome: ``{"status": "ok", "result"}`` or
    ``{"status": "error", "error"}``.

    :raises InvalidValue: both given, the error not a text, the result not a JSON value.
    :raises TooLarge: over a run entry's limit.
    """
    if error is not None and result is not None:
        raise InvalidValue("settle takes the call's result or its error, not both")
    if error is not None:
        if not isinstance(error, str):
            raise InvalidValue(f"error must be the error's text, got {type(error).__name__}")
        return '{"status":"error","error":' + encode(error, MAX_RECORD - 1024)[0] + "}"
    return '{"status":"ok","result":' + encode(result, MAX_RECORD - 1024)[0] + "}"


def settle(ops: Ops, run_id: str, call_id: str, result: Any, error: Any, fence: Any,
           retry: Any = None) -> str:
    """Record the outcome; the tool_result entry written, as JSON text. ``retry`` names
    the claim settled (its entry's count; None: the open one)."""
    check_key(run_id, "run id")
    check_key(call_id, "call id")
    if retry is not None and (type(retry) is not int or not 0 <= retry < 2**31):
        raise InvalidValue(f"retry must name a claim (0 for the first, else its entry's retry), "
                           f"got {retry!r}")
    return _ops(ops, fence).run_settle(run_id, call_id, outcome(result, error), retry)


def _record(ops: Ops, run_id: str, call_id: str, result: Any, fence: Any, c: Claim) -> None:
    """Record what the call returned, as the claim ``c``'s outcome. A result that cannot
    be recorded (not a JSON value, too large) settles the call as failed instead, with
    ``ResultNotRecorded: <why>`` (SPEC §16: nothing runs again), and its error is raised."""
    try:
        text = outcome(result)
    except (InvalidValue, TooLarge) as e:
        if inspect.iscoroutine(result):
            result.close()  # never awaited: nothing of it ran
        _record_error(ops, run_id, call_id, fence, e, c, "ResultNotRecorded")
        raise
    check_key(run_id, "run id")
    _ops(ops, fence).run_settle(run_id, call_id, text, claim_count(c.entry))


def error_text(e: BaseException) -> str:
    return storable_text(f"{type(e).__name__}: {e}")


def _refuse(c: Claim, call_id: str) -> NoReturn:
    """The error for a claim that may not run the call (done is not one)."""
    if c.status == "failed":
        raise CallFailed(f"call {call_id!r} ran and failed: {c.error}", call_id, c.error or "")
    if c.status == "in_progress":
        raise CallInProgress(f"call {call_id!r} is claimed by a worker whose claim is still live",
                             call_id)
    at = c.entry.get("at")
    raise InDoubt(f"call {call_id!r} was claimed{f' at {at}' if at else ''} and has no result: "
                  "it may or may not have run; pass reconcile= to settle it", call_id,
                  at if isinstance(at, str) else None)


def once(ops: Ops, run_id: str, call_id: str, fn: Callable[[], Any], call: Any,
         reconcile: Callable[[str, dict[str, Any]], Any] | None, fence: Any, lease: Any) -> Any:
    _outside_blocks(ops, "once()")
    _check_fn(fn, reconcile, True)
    c = claim(ops, run_id, call_id, call, fence, lease, False)
    while True:
        if c.status == "done":
            return c.result
        if c.status != "in_doubt" or reconcile is None:
            if c.status == "claimed":
                break
            _refuse(c, call_id)
        found = reconcile(call_id, c.entry)
        if found is not NOT_RUN:
            _record(ops, run_id, call_id, found, fence, c)
            return found
        c = claim(ops, run_id, call_id, call, fence, lease, True)
    try:
        result = fn()
    except Exception as e:  # an interrupt (KeyboardInterrupt, a cancel) leaves it in doubt
        _record_error(ops, run_id, call_id, fence, e, c)
        raise
    _record(ops, run_id, call_id, result, fence, c)
    return result


async def aonce(ops: Ops, run_id: str, call_id: str, fn: Callable[[], Any], call: Any,
                reconcile: Callable[[str, dict[str, Any]], Any] | None, fence: Any,
                lease: Any) -> Any:
    import asyncio

    _outside_blocks(ops, "aonce()")
    _check_fn(fn, reconcile, False)
    c = await asyncio.to_thread(claim, ops, run_id, call_id, call, fence, lease, False)
    while True:
        if c.status == "done":
            return c.result
        if c.status != "in_doubt" or reconcile is None:
            if c.status == "claimed":
                break
            _refuse(c, call_id)
        found = await _maybe_await(reconcile(call_id, c.entry))
        if found is not NOT_RUN:
            await asyncio.to_thread(_record, ops, run_id, call_id, found, fence, c)
            return found
        c = await asyncio.to_thread(claim, ops, run_id, call_id, call, fence, lease, True)
    try:
        result = await _maybe_await(fn())
    except Exception as e:  # a cancel leaves the call in doubt: it may have happened
        await asyncio.to_thread(_record_error, ops, run_id, call_id, fence, e, c)
        raise
    await asyncio.to_thread(_record, ops, run_id, call_id, result, fence, c)
    return result


async def _maybe_await(v: Any | Awaitable[Any]) -> Any:
    return await v if inspect.isawaitable(v) else v


def _record_error(ops: Ops, run_id: str, call_id: str, fence: Any, e: BaseException,
                  c: Claim, kind: str | None = None) -> None:
    """fn raised (or its result cannot be recorded: ``kind``): record the error as the
    claim ``c``'s outcome, so the call is failed, not in doubt. If that cannot be recorded
    the caller still gets the original exception, with a note (the call stays in doubt
    for whoever resumes)."""
    text = storable_text(f"{kind}: {e}") if kind else error_text(e)
    try:
        settle(ops, run_id, call_id, None, text, fence, claim_count(c.entry))
    except Exception as inner:
        e.add_note(f"agentstate: the error of call {call_id!r} could not be recorded "
                   f"({type(inner).__name__}: {inner}); the call stays in doubt")
