"""openai-agents' own session tests, run against AgentStateSession.

The installed openai-agents version's source distribution is downloaded from
PyPI once (``pip download``) into ``tests/integrations/.cache/`` (git-ignored),
unpacked, and its session tests run in a subprocess with the shim plugin
``openai_agents_shim`` swapping AgentStateSession in for SQLiteSession.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from .openai_agents_shim import LEFT_OUT

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".cache"
SUITE = [
    "tests/memory/test_session.py",
    "tests/memory/test_session_limit.py",
    "tests/memory/test_session_context_wrapper.py",
]


def openai_agents_sdist() -> Path:
    """The unpacked sdist of the installed openai-agents, fetched on first use."""
    version = importlib.metadata.version("openai-agents")
    root = CACHE / f"openai_agents-{version}"
    if (root / SUITE[0]).is_file():
        return root
    CACHE.mkdir(exist_ok=True)
    archive = CACHE / f"openai_agents-{version}.tar.gz"
    if not archive.is_file():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"openai-agents=={version}", "-d", str(CACHE)],
            check=True, capture_output=True, timeout=600,
        )
    unpack = Path(tempfile.mkdtemp(dir=CACHE))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(unpack, filter="data")
        try:
            os.replace(unpack / root.name, root)  # whole or not at all: a half tree is never used
        except OSError:
            if not (root / SUITE[0]).is_file():  # not another run that won the race
                raise
    finally:
        shutil.rmtree(unpack, ignore_errors=True)
    return root


@pytest.mark.timeout(1500)  # a download then the suite (600 s each), each bounded
def test_openai_agents_own_session_tests_pass(tmp_path: Path) -> None:
    """Every collected test of openai-agents' session suite passes against
    AgentStateSession; exactly the tests named in the shim's LEFT_OUT are left out."""
    root = openai_agents_sdist()
    report = tmp_path / "report.json"
    env = {**os.environ, "OPENAI_AGENTS_SHIM_REPORT": str(report),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "openai_agents_shim",
         "--basetemp", str(tmp_path / "t"), *SUITE],
        cwd=root, env=env, capture_output=True, text=True, timeout=600,
    )
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-3000:]
    outcome = json.loads(report.read_text(encoding="utf-8"))
    results, left_out = outcome["results"], outcome["left_out"]
    assert results and {k: v for k, v in results.items() if v != "passed"} == {}
    assert {nodeid.split("::")[-1].split("[")[0] for nodeid in left_out} == set(LEFT_OUT)
    # the one that calls add_items from 5 threads, each with its own event loop
    assert results["tests/memory/test_session.py::test_sqlite_session_concurrent_access"] == "passed"
    print(f"openai-agents {importlib.metadata.version('openai-agents')}: {len(results)} passed, "
          f"{len(left_out)} left out")
