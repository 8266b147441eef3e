"""psycopg errors translated where they enter the library: none reaches the caller."""

from __future__ import annotations

import psycopg
from psycopg import errors as pgerr

from ... import errors
from ..._encoding import MAX_VALUE
from ...errors import AgentStateError, Busy, Damaged, StorageError, UsageError

_BUSY = (pgerr.LockNotAvailable, pgerr.DeadlockDetected, pgerr.SerializationFailure,
         pgerr.QueryCanceled)
_RETRY = (pgerr.DeadlockDetected, pgerr.SerializationFailure)


def lost_connection(e: BaseException) -> bool:
    """The connection broke (server restart, network): not an answer to the statement."""
    if isinstance(e, (pgerr.AdminShutdown, pgerr.CrashShutdown, pgerr.CannotConnectNow)):
        return True
    return isinstance(e, psycopg.OperationalError) and (e.sqlstate is None
                                                         or e.sqlstate.startswith("08"))


def is_fallback(e: psycopg.Error) -> bool:
    """The error a lean statement raises when it leaves the write to a function (lean.py)."""
    return e.diag is not None and e.diag.message_hint == "agentstate:Fallback"


def translate(e: psycopg.Error, outcome_unknown: bool = False) -> AgentStateError:
    """The agentstate error for a psycopg error; ``outcome_unknown`` when a lost
    connection leaves a write's fate unknown (a COMMIT, or a lone statement)."""
    hint = e.diag.message_hint or "" if e.diag is not None else ""
    if hint.startswith("agentstate:"):
        cls = getattr(errors, hint[len("agentstate:"):])
        msg = e.diag.message_primary or str(e)
        detail = e.diag.message_detail or ""
        if cls is errors.VersionConflict:
            return cls(msg, int(detail))
        if cls is errors.SessionBusy or cls is errors.LeaseLost:
            return cls(msg, detail)
        if cls is errors.TooLarge:
            return cls(msg, int(detail), MAX_VALUE)
        return cls(msg)
    if isinstance(e, _BUSY):
        return Busy(f"the server kept the rows locked by other writers: {e.sqlstate}: "
                    f"{first_line(e)}")
    if isinstance(e, (pgerr.UndefinedTable, pgerr.UndefinedFunction)):
        return Damaged(f"the store's tables or functions are missing (dropped outside agentstate?): "
                       f"{first_line(e)}")
    if isinstance(e, pgerr.InFailedSqlTransaction):
        return UsageError("an earlier error aborted this transaction(): leave the block")
    if lost_connection(e):
        err = StorageError(f"lost the connection to the server: {first_line(e)}")
        err.outcome_unknown = outcome_unknown
        return err
    return StorageError(f"the server refused: {e.sqlstate or type(e).__name__}: {first_line(e)}")


def first_line(e: BaseException) -> str:
    return str(e).strip().split("\n", 1)[0]
