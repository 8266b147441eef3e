"""The SQLite backend: one file in WAL mode that many processes share.

``store`` holds the file's connections and transactions (split by job:
``schema``, ``transactions``, ``group_commit``, ``busy``, ``waiter``,
``errors``); ``kv``, ``runs``, ``sessions``, ``feed``, ``tokens`` and
``admin`` are its repositories, with the same functions as PostgreSQL's.
"""

from __future__ import annotations

from ..base import Backend
from ..local import LocalOps
from . import admin, feed, history, kv, runs, sessions, tokens
from .store import Store

__all__ = ["connect"]


def connect(path: str, durability: str, busy_timeout: float, vfs: str | None = None) -> LocalOps:
    """Open (creating or upgrading) the file at ``path``.

    :raises SchemaTooNew, Damaged, StorageError: see ``agentstate.open``.
    """
    store = Store(path, durability, busy_timeout, vfs)
    store.housekeeping = admin.purge
    return LocalOps(Backend(store=store, kv=kv, runs=runs, sessions=sessions, feed=feed,
                            tokens=tokens, admin=admin, history=history))
