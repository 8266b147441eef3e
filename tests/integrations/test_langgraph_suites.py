"""LangGraph's own tests, run against the adapters exactly as published:

- ``langgraph-checkpoint-conformance`` 0.0.2 (the official checkpointer suite:
  every base capability and every optional one AgentStateSaver implements);
- the store tests of the ``langgraph-checkpoint-sqlite`` 3.1.2 sdist
  (``test_store.py``, ``test_async_store.py``, ``test_ttl.py``, vector search
  included), fetched from PyPI by version into ``tests/integrations/.cache`` and
  run by ``python -m pytest`` with the shim ``langgraph_shim.py``, which names
  what it leaves out;
- the vector-search tests of the ``langgraph-checkpoint-postgres`` 3.2.0 sdist,
  on PostgreSQL, with the shim ``langgraph_pg_shim.py``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate

import agentstate
from agentstate.integrations.langgraph import AgentStateSaver

HERE = Path(__file__).resolve().parent


def _left_out() -> dict[str, str]:
    """The shim's list, read from its file as the pytest subprocess loads it."""
    spec = importlib.util.spec_from_file_location("langgraph_shim", HERE / "langgraph_shim.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LEFT_OUT


LEFT_OUT = _left_out()
CACHE = HERE / ".cache"
SQLITE_SDIST = ("langgraph-checkpoint-sqlite", "3.1.2")
POSTGRES_SDIST = ("langgraph-checkpoint-postgres", "3.2.0")
CONFORMANCE = ("langgraph-checkpoint-conformance", "0.0.2")

# The capabilities AgentStateSaver implements, and how many tests each has in 0.0.2.
CAPABILITIES = {"put": 17, "put_writes": 10, "get_tuple": 10, "list": 16, "delete_thread": 5,
                "delete_for_runs": 7, "copy_thread": 8, "prune": 8}
# Tests the store suites collect once the shim has left out LEFT_OUT: all must pass.
STORE_TESTS = {"store": 135, "ttl": 11}
# The vector-search tests of PostgresStore's suites (langgraph_pg_shim.RUN), as collected.
POSTGRES_VECTOR_TESTS = 124


def test_conformance_suite_passes(tmp_path):
    """Every capability of the official conformance suite is detected and all its tests pass."""
    assert metadata.version(CONFORMANCE[0]) == CONFORMANCE[1]

    @checkpointer_test(name="AgentStateSaver")
    async def saver():
        db = agentstate.open(str(tmp_path / "conformance.db"))
        try:
            yield AgentStateSaver(db)
        finally:
            db.close()

    report = asyncio.run(validate(saver))
    outcome = {name: (r.detected, r.passed, r.tests_passed, r.tests_failed, r.failures)
               for name, r in report.results.items()}
    assert outcome == {name: (True, True, n, 0, []) for name, n in CAPABILITIES.items()}


def sdist(name: str, version: str) -> Path:
    """The unpacked sdist, downloaded once into the git-ignored cache."""
    folder = CACHE / f"{name.replace('-', '_')}-{version}"
    if (folder / "tests").is_dir():
        return folder
    CACHE.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    "--disable-pip-version-check", "-q", f"{name}=={version}", "-d", str(CACHE)],
                   check=True, timeout=300)
    archive = next(CACHE.glob(f"{name.replace('-', '_')}-{version}.tar.gz"))
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return folder


def run_suite(root: Path, files: list[str], out: Path, shim: str = "langgraph_shim",
              **env: str) -> subprocess.Popen[str]:
    # the shim, and the agentstate this process imported (not whatever else is installed)
    path = os.pathsep.join([str(HERE), str(Path(agentstate.__file__).resolve().parents[1])])
    env = {**os.environ, **env, "PYTHONPATH": path,
           "LANGGRAPH_SHIM_REPORT": str(out / "left_out.json")}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", shim, "-p", "no:cacheprovider",
         "-q", "--junitxml", str(out / "junit.xml"), *files],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def outcome(out: Path) -> tuple[dict[str, int], list[str]]:
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    counts = {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")}
    return counts, json.loads((out / "left_out.json").read_text())


# test_ttl.py mostly sleeps (41 s in a row): its tests run in three processes at once,
# beside the store tests. Together the groups are the whole file (the counts say so).
TTL = "tests/test_ttl.py::"
TTL_GROUPS = [
    ["test_async_asearch_refresh_ttl", "test_ttl_sweeper", "test_ttl_basic", "test_search_with_ttl"],
    ["test_ttl_custom_value", "test_async_ttl_refresh", "test_async_ttl_sweeper",
     "test_async_ttl_basic"],
    ["test_ttl_override_default", "test_ttl_refresh", "test_async_search_with_ttl"],
]


@pytest.mark.timeout(1200)  # a download (300 s) then the suites (600 s), each bounded
def test_sqlite_store_suites_pass(tmp_path):
    """LangGraph's store tests, vector search included, pass against AgentStateStore on
    a file; the tests left out are exactly the shim's list (private internals, and one
    with its reason)."""
    root = sdist(*SQLITE_SDIST)
    runs = {}
    groups = {"store": ["tests/test_store.py", "tests/test_async_store.py"]}
    groups.update({f"ttl{i}": [TTL + name for name in names] for i, names in enumerate(TTL_GROUPS)})
    for name, files in groups.items():
        (tmp_path / name).mkdir()
        runs[name] = run_suite(root, files, tmp_path / name)
    left_out, ran = set(), {"store": 0, "ttl": 0}
    for name, proc in runs.items():
        output, _ = proc.communicate(timeout=600)
        counts, dropped = outcome(tmp_path / name)
        assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, output
        ran[name.rstrip("0123456789")] += counts["tests"]
        left_out.update(dropped)
    assert ran == STORE_TESTS
    assert left_out == set(LEFT_OUT)



@pytest.mark.slow  # ~20 s; the same suites run on a file in the default run, this in CI's -m slow
@pytest.mark.timeout(1200)  # a download (300 s) then the suite (600 s), each bounded
def test_postgres_store_vector_suites_pass(tmp_path, pg_admin_url):
    """The vector-search tests of LangGraph's PostgresStore (sync and async, every distance
    and vector type they try) pass against AgentStateStore on PostgreSQL: by pgvector where
    the server has it, else by the exact search (this machine's server has no pgvector)."""
    root = sdist(*POSTGRES_SDIST)
    proc = run_suite(root, ["tests/test_store.py", "tests/test_async_store.py"], tmp_path,
                     "langgraph_pg_shim", LANGGRAPH_PG_URL=pg_admin_url)
    output, _ = proc.communicate(timeout=600)
    counts, dropped = outcome(tmp_path)
    assert counts["failures"] == counts["errors"] == counts["skipped"] == 0, output
    assert counts["tests"] == POSTGRES_VECTOR_TESTS, output
    assert dropped and not any("vector" in name or "embed" in name for name in dropped)
