"""The errors of agentstate (SPEC §6).

Each error also inherits the builtin it resembles, so a plain
``except ValueError`` or ``except LookupError`` keeps working, and carries a
stable ``code`` and the matching HTTP ``status``.
"""

from __future__ import annotations

# The facts an error may carry as attributes, by name: what the State API puts beside
# ``code`` and ``message`` in an error body, and what the clients set again.
FIELDS = ("current_version", "turn_id", "size", "limit", "outcome_unknown", "call_id", "at",
          "error")


class AgentStateError(Exception):
    """Base class of every error agentstate raises."""

    code = "error"
    status = 500


class InvalidKey(AgentStateError, ValueError):
    """A key, scope kind, scope id or name breaks the key rules."""

    code, status = "invalid_key", 400


class InvalidValue(AgentStateError, ValueError, TypeError):
    """A value is not storable JSON (NaN, NUL, a set, too deep, ...)."""

    code, status = "invalid_value", 400


class TooLarge(AgentStateError, ValueError):
    """A value or list is over its size limit; ``.size`` and ``.limit`` in bytes."""

    code, status = "too_large", 413

    def __init__(self, message: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class VersionConflict(AgentStateError):
    """``if_version`` did not match; ``.current_version`` is what is stored (0: absent)."""

    code, status = "version_conflict", 409

    def __init__(self, message: str, current_version: int) -> None:
        super().__init__(message)
        self.current_version = current_version


class NotAList(AgentStateError, TypeError):
    """A list operation on a value that is not a list."""

    code, status = "not_a_list", 409


class HistoryGap(AgentStateError, ValueError):
    """Run entries do not continue right after the last stored seq."""

    code, status = "history_gap", 409


class RunExists(AgentStateError, ValueError):
    """A run with that id exists already."""

    code, status = "already_exists", 409


class NotFound(AgentStateError, LookupError):
    """No such session or turn (or not one this principal may see)."""

    code, status = "not_found", 404


class RunNotFound(NotFound):
    """No run with that id."""


class SessionBusy(AgentStateError):
    """Another turn of the session is queued or running; ``.turn_id`` names it."""

    code, status = "session_busy", 409

    def __init__(self, message: str, turn_id: str) -> None:
        super().__init__(message)
        self.turn_id = turn_id


class InvalidTransition(AgentStateError):
    """A turn state change outside the diagram of SPEC §4."""

    code, status = "invalid_transition", 409


class Forbidden(AgentStateError, PermissionError):
    """The principal may not do this (an admin-only action)."""

    code, status = "forbidden", 403


class Busy(AgentStateError):
    """The database stayed locked by other writers past ``busy_timeout``."""

    code, status = "busy", 503


class Damaged(AgentStateError, ValueError):
    """The file or a stored record is inconsistent or not an agentstate database."""

    code, status = "damaged", 500


class SchemaTooNew(AgentStateError, ValueError):
    """The file was written by a newer agentstate; it is left untouched."""

    code, status = "schema_too_new", 500


class UsageError(AgentStateError, RuntimeError):
    """A call that cannot work where it was made (say, a backup inside ``transaction()``)."""

    code, status = "usage_error", 400


class Closed(AgentStateError):
    """The Database was closed."""

    code, status = "closed", 500


class StorageError(AgentStateError, OSError):
    """The file could not be opened, read or written (permissions, disk full, I/O).

    ``outcome_unknown`` is True when the COMMIT itself failed (for example its
    fsync): the write may or may not be stored, and may appear once the WAL is
    recovered. Read it back before retrying. Any other refusal changed nothing.
    """

    code, status = "storage_error", 500
    outcome_unknown = False


class CursorExpired(AgentStateError, LookupError):
    """The changes after ``since`` are no longer kept (retention): resynchronise from the
    current state and go on from ``last_change()``."""

    code, status = "cursor_expired", 410


class Unauthorized(AgentStateError, PermissionError):
    """No token, or a token the server does not know."""

    code, status = "unauthorized", 401


# -- fenced writes and tool calls that run at most once (SPEC §14) -----------------------

class LeaseLost(AgentStateError):
    """A fenced write's turn no longer holds its lease (it lapsed, or another turn of the
    session took over, or there is no such turn): nothing was written. ``.turn_id``."""

    code, status = "lease_lost", 409

    def __init__(self, message: str, turn_id: str) -> None:
        super().__init__(message)
        self.turn_id = turn_id


class InDoubt(AgentStateError):
    """A tool call was claimed and has no recorded result, and its claim is no longer
    live: it may or may not have run. ``reconcile`` settles it; ``.call_id``, ``.at``
    (when it was claimed, ISO-8601 UTC)."""

    code, status = "in_doubt", 409

    def __init__(self, message: str, call_id: str, at: str | None) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.at = at


class CallInProgress(AgentStateError):
    """Another worker claimed this tool call and its claim is still live. ``.call_id``."""

    code, status = "call_in_progress", 409

    def __init__(self, message: str, call_id: str) -> None:
        super().__init__(message)
        self.call_id = call_id


class CallFailed(AgentStateError):
    """The tool call ran and its error was recorded; it is not run again. ``.call_id``,
    ``.error`` (the recorded text)."""

    code, status = "call_failed", 409

    def __init__(self, message: str, call_id: str, error: str) -> None:
        super().__init__(message)
        self.call_id = call_id
        self.error = error
