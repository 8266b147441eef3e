"""The LangGraph benchmark's smoke mode runs on SQLite and PostgreSQL and writes its tables
(speed is not asserted)."""

from __future__ import annotations

import pytest

import os
import subprocess
import sys
from pathlib import Path

import agentstate

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a smoke run of a benchmark command (seconds of imports): CI's -m slow
@pytest.mark.timeout(900)  # the command's own bound is 600 s
def test_quick_benchmark_writes_its_tables(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(agentstate.__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.adapter_langgraph", "--quick", "--repeats", "1",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "ADAPTER-LANGGRAPH.md").read_text()
    for backend in ("## SQLite", "## PostgreSQL"):
        assert backend in report
    for heading in ("### Checkpoints", "### A growing chat", "### Store", "### A graph's turn"):
        assert report.count(heading) == 2
    rows = [line for line in report.splitlines() if line.startswith("| ") and line.endswith("x |")]
    # per backend: saver ops at 2 sizes, chat put and get at 2, store ops at 2, two graph runs
    assert len(rows) == 2 * (12 + 4 + 8 + 2)


@pytest.mark.slow  # a smoke run of a benchmark command: CI's -m slow
@pytest.mark.timeout(900)
def test_search_benchmark_writes_its_table(tmp_path):
    """``python -m benchmarks.search`` on a small store: a row per operation, with
    SqliteStore's ratio where this Python can load sqlite-vec into it (speed not asserted)."""
    env = {**os.environ, "PYTHONPATH": str(Path(agentstate.__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.search", "--items", "300", "--dims", "8,16",
         "--rounds", "1", "--out", str(tmp_path / "SEARCH.md")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    report = (tmp_path / "SEARCH.md").read_text()
    assert report.count("### 300 items") == 2
    rows = [line for line in report.splitlines() if line.startswith(("| search", "| put"))]
    assert len(rows) == 2 * 3 and all(line.endswith(("×** |", "here) |")) for line in rows)
