"""A pytest plugin that runs the vector-search tests of LangGraph's PostgresStore against
AgentStateStore on PostgreSQL (SPEC §19).

Loaded with ``-p langgraph_pg_shim`` in a run of ``tests/test_store.py`` and
``tests/test_async_store.py`` of the ``langgraph-checkpoint-postgres`` sdist (see
``test_langgraph_suites.py``). The tests make a database per test on the server at
their ``DEFAULT_URI`` and open a store on it with ``from_conn_string``; here:

- ``DEFAULT_URI`` is ``$LANGGRAPH_PG_URL`` (the test run's server), set on the
  suite's conftest as it is registered, before the test modules import it;
- ``PostgresStore`` and ``AsyncPostgresStore`` are AgentStateStore on
  ``agentstate.open(conn_string)`` (the sync or async spelling of
  ``from_conn_string`` and ``setup``); the sync fixture drops PostgresStore's
  migration table through ``store._cursor()`` to show ``setup()`` runs twice:
  ``_cursor`` is a cursor on the same database (there is no such table here).

Only the vector-search tests run (``RUN``); the others are deselected (not
skipped), and the names of both are written to ``$LANGGRAPH_SHIM_REPORT``. The
store's other behaviour is what LangGraph's SQLite store suite checks, on a file
(``langgraph_shim.py``), and tests/integrations/test_adapters_postgres.py on
PostgreSQL.
"""

from __future__ import annotations

import json
import os
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import langgraph.store.postgres
import langgraph.store.postgres.aio
import psycopg
import pytest

import agentstate
from agentstate.integrations.langgraph import AgentStateStore

RUN = {f"test_store.py::{name}" for name in (
    "test_vector_store_initialization", "test_vector_insert_with_auto_embedding",
    "test_vector_update_with_embedding", "test_vector_search_with_filters",
    "test_vector_search_pagination", "test_vector_search_edge_cases",
    "test_embed_with_path_sync", "test_embed_with_path_operation_config", "test_scores",
    "test_non_ascii")} | {f"test_async_store.py::{name}" for name in (
    "test_vector_store_initialization", "test_vector_insert_with_auto_embedding",
    "test_vector_update_with_embedding", "test_vector_search_with_filters",
    "test_vector_search_pagination", "test_vector_search_edge_cases", "test_embed_with_path",
    "test_search_sorting")}


@contextmanager
def _open(cls: type, conn_string: str, index: Any, ttl: Any):
    db = agentstate.open(conn_string)
    store = cls(db, ttl=ttl, index=index)
    store._url = conn_string
    try:
        yield store
    finally:
        store._stop_sweeper(None)
        db.close()


class PostgresStore(AgentStateStore):
    """AgentStateStore under PostgresStore's spellings (see the module docstring)."""

    @classmethod
    def from_conn_string(cls, conn_string: str, *, pipeline: bool = False,  # type: ignore[override]
                         pool_config: Any = None, index: Any = None, ttl: Any = None):
        return _open(cls, conn_string, index, ttl)

    @contextmanager
    def _cursor(self):
        with psycopg.connect(self._url, autocommit=True) as c, c.cursor() as cur:
            yield cur


class AsyncPostgresStore(PostgresStore):
    """The same under AsyncPostgresStore's async spellings."""

    @classmethod
    @asynccontextmanager
    async def from_conn_string(cls, conn_string: str, *, pipeline: bool = False,  # type: ignore[override]
                               pool_config: Any = None, index: Any = None, ttl: Any = None):
        with _open(cls, conn_string, index, ttl) as store:
            yield store

    async def setup(self) -> None:  # type: ignore[override]
        pass


def pytest_configure(config: pytest.Config) -> None:
    langgraph.store.postgres.PostgresStore = PostgresStore  # type: ignore[misc]
    langgraph.store.postgres.AsyncPostgresStore = AsyncPostgresStore  # type: ignore[misc]
    langgraph.store.postgres.aio.AsyncPostgresStore = AsyncPostgresStore  # type: ignore[misc]


def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
    if getattr(plugin, "__name__", "") == "tests.conftest":  # the suite's conftest
        url = os.environ["LANGGRAPH_PG_URL"]
        plugin.DEFAULT_URI = plugin.DEFAULT_POSTGRES_URI = url


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        name = f"{item.path.name}::{getattr(item, 'originalname', item.name)}"
        (keep if name in RUN else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
    report = os.environ.get("LANGGRAPH_SHIM_REPORT")
    if report:
        with open(report, "w", encoding="utf-8") as f:
            json.dump(sorted({f"{i.path.name}::{getattr(i, 'originalname', i.name)}"
                              for i in drop}), f)
