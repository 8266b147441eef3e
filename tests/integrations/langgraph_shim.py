"""A pytest plugin that runs LangGraph's own store tests against AgentStateStore.

Loaded with ``-p tests.integrations.langgraph_shim`` in a run of the
``tests/test_store.py``, ``test_async_store.py`` and ``test_ttl.py`` of the
``langgraph-checkpoint-sqlite`` sdist (see ``test_langgraph_suites.py``). It
puts AgentStateStore where those tests build LangGraph's SQLite stores:

- ``SqliteStore`` is AgentStateStore itself (``from_conn_string(path, ttl=)``,
  ``setup()``, ``sweep_ttl()``, ``start_ttl_sweeper()``/``stop_ttl_sweeper()``).
- ``AsyncSqliteStore`` is AgentStateStore under the async spellings of that
  class: an ``async with`` ``from_conn_string``, and ``setup``, ``sweep_ttl``,
  ``start_ttl_sweeper``, ``stop_ttl_sweeper`` as coroutines (AgentStateStore's
  own async sweep is ``asweep_ttl``).

The tests left out, each with its reason, are ``LEFT_OUT``; they are
deselected (not skipped), so the run reports them, and their names are
written to ``$LANGGRAPH_SHIM_REPORT`` for the calling test to check.
"""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager
from typing import Any

import langgraph.store.sqlite
import langgraph.store.sqlite.aio
import pytest

from agentstate.integrations.langgraph import AgentStateStore
from agentstate.integrations.langgraph._common import conn_string

PRIVATE = "reaches into LangGraph's SQLite store internals"

LEFT_OUT: dict[str, str] = {
    # test_store.py
    "test_store.py::test_vector_store_initialization":
        PRIVATE + " (its connection, store.conn, and the name of its vector table)",
    "test_store.py::test_escape_glob_literal": PRIVATE + " (_escape_glob_literal)",
    "test_store.py::test_namespace_match_pattern": PRIVATE + " (_namespace_match_pattern)",
    "test_store.py::test_list_namespaces_prefix_uses_indexable_condition":
        PRIVATE + " (the SQL text of BaseSqliteStore._get_batch_list_namespaces_queries)",
    "test_store.py::test_nonnull_migrations": PRIVATE + " (SqliteStore.MIGRATIONS)",
    # test_async_store.py
    "test_async_store.py::test_no_running_loop": (
        "asserts that sync calls on the event loop's thread fail: AsyncSqliteStore's sync "
        "methods post to its own loop and would deadlock there; AgentStateStore has no loop "
        "of its own, so its sync methods work from any thread (its async ones never block)"
    ),
}


class AsyncSqliteStore(AgentStateStore):
    """AgentStateStore with AsyncSqliteStore's async spellings (see the module docstring)."""

    @classmethod
    @asynccontextmanager
    async def from_conn_string(cls, path: str, *, ttl: Any = None, index: Any = None):  # type: ignore[override]
        with conn_string(path) as db:
            store = cls(db, ttl=ttl, index=index)
            try:
                yield store
            finally:
                store._stop_sweeper(None)

    async def setup(self) -> None:  # type: ignore[override]
        pass

    async def sweep_ttl(self) -> int:  # type: ignore[override]
        return await self.asweep_ttl()

    async def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> Any:  # type: ignore[override]
        return self._start_sweeper(sweep_interval_minutes)

    async def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        return self._stop_sweeper(timeout)


def pytest_configure(config: pytest.Config) -> None:
    # Bound here, before the test modules import them (and not on a plain import
    # of this module, which the calling test does for LEFT_OUT).
    langgraph.store.sqlite.SqliteStore = AgentStateStore  # type: ignore[misc]
    langgraph.store.sqlite.AsyncSqliteStore = AsyncSqliteStore  # type: ignore[misc]
    langgraph.store.sqlite.aio.AsyncSqliteStore = AsyncSqliteStore  # type: ignore[misc]
    # test_ttl marks its timing tests flaky(retries=3), a marker of pytest-retry.
    # Without that plugin the marker is only registered, so they run once.
    if not config.pluginmanager.hasplugin("pytest_retry"):
        config.addinivalue_line("markers", "flaky(retries): retried by pytest-retry when installed")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        (drop if name in LEFT_OUT else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    report = os.environ.get("LANGGRAPH_SHIM_REPORT")
    if report:
        with open(report, "w", encoding="utf-8") as f:
            json.dump(sorted({f"{i.path.name}::{getattr(i, 'originalname', i.name)}"
                              for i in drop}), f)
