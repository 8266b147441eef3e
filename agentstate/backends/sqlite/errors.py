"""Driver errors translated where they enter the library: none reaches the caller."""

from __future__ import annotations

import apsw

from ...errors import AgentStateError, Busy, Closed, Damaged, StorageError


def translate(e: apsw.Error) -> AgentStateError:
    """The agentstate error for a driver error."""
    if isinstance(e, (apsw.BusyError, apsw.LockedError)):
        return Busy(f"the database stayed locked by other writers: {e}")
    if isinstance(e, (apsw.CorruptError, apsw.NotADBError)):
        return Damaged(f"the database file is damaged or not SQLite: {e}")
    if isinstance(e, apsw.ConnectionClosedError):
        return Closed("the database is closed")
    return StorageError(f"storage error: {type(e).__name__}: {e}")


def outcome_unknown(e: apsw.Error) -> bool:
    """Whether a failed COMMIT may still have reached the disk: its WAL frames may be
    written before the fsync that failed, and recovery can replay them."""
    return isinstance(e, (apsw.IOError, apsw.FullError))
