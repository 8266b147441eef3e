"""agentstate: an embedded, transactional state store for AI agents.

One SQLite file in WAL mode; many local processes share it safely.
"""

from ._batch import Batch
from ._calls import NOT_RUN, Claim
from ._changes import Change
from ._database import Database, open
from ._past import Diff, Past
from .backends.base import KEEP
from .backends.remote import connect
from ._runs import Record, RunHead, RunStore, SavedState
from ._sessions import Principal, SessionInfo, Sessions, Turn
from ._scope import Appended, Revision, Scope, State, Versioned
from ._thread import ThreadStateClient, ThreadStateStore
from .errors import (
    AgentStateError,
    Busy,
    CallFailed,
    CallInProgress,
    Closed,
    CursorExpired,
    Damaged,
    Forbidden,
    HistoryGap,
    InDoubt,
    InvalidKey,
    InvalidTransition,
    InvalidValue,
    LeaseLost,
    NotAList,
    NotFound,
    RunExists,
    RunNotFound,
    SchemaTooNew,
    SessionBusy,
    StorageError,
    TooLarge,
    Unauthorized,
    UsageError,
    VersionConflict,
)

__version__ = "0.4.0"

__all__ = [
    "AgentStateError",
    "Appended",
    "Batch",
    "Busy",
    "CallFailed",
    "CallInProgress",
    "Change",
    "Claim",
    "CursorExpired",
    "Unauthorized",
    "Closed",
    "Damaged",
    "Database",
    "Diff",
    "Forbidden",
    "Past",
    "Principal",
    "SessionInfo",
    "Sessions",
    "Turn",
    "Record",
    "Revision",
    "RunHead",
    "RunStore",
    "SavedState",
    "HistoryGap",
    "InDoubt",
    "InvalidKey",
    "KEEP",
    "InvalidTransition",
    "InvalidValue",
    "LeaseLost",
    "NOT_RUN",
    "NotAList",
    "NotFound",
    "RunExists",
    "RunNotFound",
    "SchemaTooNew",
    "Scope",
    "SessionBusy",
    "State",
    "StorageError",
    "ThreadStateClient",
    "ThreadStateStore",
    "TooLarge",
    "UsageError",
    "VersionConflict",
    "Versioned",
    "connect",
    "open",
]
