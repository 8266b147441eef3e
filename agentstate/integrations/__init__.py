"""Adapters that put agent frameworks' own state interfaces on agentstate.

Each lives in its own module behind an optional extra, so the embedded store
keeps its three dependencies: ``agentstate.integrations.openai_agents``
(``pip install 'agentstate-db[openai-agents]'``), and so on.
"""

from __future__ import annotations

import agentstate
from agentstate.backends.sqlite.store import Store


def on_a_file(db: agentstate.Database) -> bool:
    """Whether ``db`` is a SQLite file, where (in WAL mode) a read never waits for a
    writer: an adapter's async reads may then run on the event loop's own thread, which
    costs less than the hop to a worker thread. (A PostgreSQL read is a round trip.)"""
    return isinstance(getattr(db._ops, "store", None), Store)
