"""The PostgreSQL backend: the server's connection manager and its repository modules.

``agentstate.open("postgresql://...")`` builds ``LocalOps(Store(...), repos)``
where ``repos`` holds the modules ``kv``, ``runs``, ``sessions``, ``feed`` and
``admin`` (the same functions, arguments and rows as the SQLite ones) and
``clock``, the server's clock. Needs the ``postgres`` extra (psycopg 3 and
psycopg-pool).
"""

from __future__ import annotations

from types import SimpleNamespace

from .._ops import LocalOps
from . import admin, feed, kv, runs, sessions, tokens
from .store import Store

__all__ = ["connect"]


def connect(url: str, durability: str, busy_timeout: float) -> LocalOps:
    """Open the store in the URL's database and current schema (created or migrated).

    :raises StorageError: the server cannot be reached, or refuses.
    :raises SchemaTooNew: the store was written by a newer agentstate.
    :raises Damaged: the schema holds other tables of the same names.
    """
    store = Store(url, durability, busy_timeout)  # its writes purge as they go (feed_add)
    repos = SimpleNamespace(kv=kv, runs=runs, sessions=sessions, feed=feed, admin=admin, tokens=tokens,
                            clock=store.clock)
    return LocalOps(store, repos)  # type: ignore[arg-type]
