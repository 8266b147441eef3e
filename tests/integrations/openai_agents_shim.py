"""pytest plugin: openai-agents' own session tests, run against AgentStateSession.

Loaded as ``-p openai_agents_shim`` inside the unpacked openai-agents sdist
(``tests/integrations/test_openai_agents_suite.py`` does it). It rebinds
``SQLiteSession`` wherever the tests import it from, leaves out the tests
named in ``LEFT_OUT`` (each reaches into SQLiteSession's private internals)
and writes every test's outcome to the JSON file named by
``$OPENAI_AGENTS_SHIM_REPORT``.

The class bound is ``SQLiteSession(AgentStateSession)``: AgentStateSession
itself under the name the tests import, nothing added. SQLiteSession's
constructor takes ``(session_id, db_path)``; AgentStateSession takes a path
in that place too. A session made with no path opens ``agentstate.open()``,
that is ``$AGENTSTATE_DB``: each test gets its own file below.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import agents
import agents.memory
import agents.memory.sqlite_session
from agentstate.integrations.openai_agents import AgentStateSession

_INTERNALS = "reaches into SQLiteSession's private internals: "
LEFT_OUT = {
    "test_sqlite_session_close_closes_worker_thread_connections":
        _INTERNALS + "its per-thread sqlite3 connection set (session._connections)",
    "test_sqlite_session_reaps_connections_from_exited_worker_threads":
        _INTERNALS + "session._connections of exited worker threads",
    "test_sqlite_session_closes_retired_connections_before_the_next_allocation":
        _INTERNALS + "session._connections and a monkeypatched sqlite3.connect",
    "test_sqlite_session_keeps_connections_of_live_worker_threads":
        _INTERNALS + "session._connections of a live worker thread",
    "test_sqlite_session_pop_item_skips_corrupt_most_recent":
        _INTERNALS + "writes invalid JSON through session._locked_connection() into its "
        "messages table (agentstate refuses invalid JSON, so no corrupt item can exist)",
    "test_sqlite_session_pop_item_returns_none_after_dropping_only_corrupt_rows":
        _INTERNALS + "writes invalid JSON through session._locked_connection()",
    "test_sqlite_session_get_items_limit_skips_corrupt_newest_rows":
        _INTERNALS + "writes invalid JSON through session._locked_connection()",
    "test_sqlite_session_get_items_session_settings_limit_skips_corrupt_rows":
        _INTERNALS + "writes invalid JSON through session._locked_connection()",
    "test_sqlite_session_file_lock_is_shared_across_instances":
        _INTERNALS + "its process-local file lock (session._lock, SQLiteSession._file_lock_counts)",
    "test_sqlite_session_failed_add_items_releases_write_lock":
        _INTERNALS + "probes the lock by inserting into its agent_sessions table "
        "(our counterpart: test_failed_add_items_writes_nothing_and_keeps_no_lock)",
    "test_sqlite_session_failed_clear_session_rolls_back":
        _INTERNALS + "drops its agent_sessions table and reads session._connections",
    "test_sqlite_session_failed_pop_item_releases_write_lock":
        _INTERNALS + "drops its agent_messages table and reads session._connections",
    "test_sqlite_session_rollback_failure_evicts_connection":
        _INTERNALS + "injects a sqlite3.Connection subclass via session._get_connection",
    "test_sqlite_session_close_retries_quarantined_connection":
        _INTERNALS + "injects a sqlite3.Connection subclass via session._get_connection "
        "and reads session._quarantined_connections",
    "test_sqlite_session_post_commit_cancellation_propagates_after_known_outcome":
        _INTERNALS + "pauses a sqlite3.Connection.commit injected via session._get_connection "
        "(our counterpart: test_cancelled_add_items_settles_before_it_raises)",
}


class SQLiteSession(AgentStateSession):
    """AgentStateSession, under the name the openai-agents tests import.

    Its closed-session error names the class, so here it reads "SQLiteSession
    is closed", the text test_sqlite_session_closed_rejects_empty_add_items
    matches (a user sees "AgentStateSession is closed"; both are RuntimeErrors).
    """


# What this run saw: test id -> outcome, and the ids left out.
_results: dict[str, str] = {}
_left_out: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    for module in (agents, agents.memory, agents.memory.sqlite_session):
        module.SQLiteSession = SQLiteSession  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, drop = [], []
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        (drop if name in LEFT_OUT else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    _left_out.extend(item.nodeid for item in drop)


@pytest.fixture(autouse=True)
def _own_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session made without a path opens $AGENTSTATE_DB: one file per test."""
    monkeypatch.setenv("AGENTSTATE_DB", str(tmp_path / "agentstate.db"))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test's outcome: its call's, or the first setup/teardown that did not pass."""
    if report.when == "call" or report.outcome != "passed":
        if _results.get(report.nodeid, "passed") == "passed":
            _results[report.nodeid] = report.outcome


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("OPENAI_AGENTS_SHIM_REPORT")
    if path:
        Path(path).write_text(json.dumps(
            {"exitstatus": int(exitstatus), "results": _results, "left_out": _left_out},
            indent=1), encoding="utf-8")
