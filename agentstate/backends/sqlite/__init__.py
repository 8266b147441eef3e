"""The SQLite backend: the file's connection manager and its repository modules.

``open()`` of a path builds ``LocalOps(Store(...), this module)``; the
PostgreSQL backend supplies a module of the same shape.
"""

from __future__ import annotations

import time

from . import _admin as admin
from . import _feed as feed
from . import _kv as kv
from . import _runs_repo as runs
from . import _sessions_repo as sessions
from . import _tokens as tokens
from ._connection import Store
from ._ops import LocalOps

__all__ = ["admin", "clock", "connect", "feed", "kv", "runs", "sessions", "tokens"]

clock = time.time  # the store's clock is this machine's


def connect(path: str, durability: str, busy_timeout: float, vfs: str | None = None) -> LocalOps:
    import sys

    store = Store(path, durability, busy_timeout, vfs)
    store.housekeeping = feed.purge
    return LocalOps(store, sys.modules[__name__])
