"""The PostgreSQL backend: the same store in a server's schema, for agents on many machines.

``store`` holds the pool, transactions, the schema, errors and NOTIFY waiters;
``kv``, ``runs``, ``sessions``, ``feed``, ``tokens`` and ``admin`` are its
repositories, with the same functions, arguments and rows as SQLite's. Needs
the ``postgres`` extra (psycopg 3 and psycopg-pool).
"""

from __future__ import annotations

from ..base import Backend
from ..local import LocalOps
from . import admin, feed, history, kv, runs, sessions, tokens
from .store import Store

__all__ = ["connect"]


def connect(url: str, durability: str, busy_timeout: float) -> LocalOps:
    """Open the store in the URL's database and current schema (created or migrated).

    :raises StorageError: the server cannot be reached, or refuses.
    :raises SchemaTooNew: the store was written by a newer agentstate.
    :raises Damaged: the schema holds other tables of the same names.
    """
    store = Store(url, durability, busy_timeout)  # its writes purge as they go (feed_add)
    return LocalOps(Backend(store=store, kv=kv, runs=runs, sessions=sessions, feed=feed,
                            tokens=tokens, admin=admin, history=history))
