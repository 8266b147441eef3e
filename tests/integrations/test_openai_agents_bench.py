"""Smoke run of the openai-agents adapter benchmark (``--quick``): it writes the tables.

No timing is asserted: only that every operation at every history gets a figure for
each session and a ratio, on SQLite and on PostgreSQL (the benchmark starts its own
server; SQLAlchemySession may be reported as not installed), that the pieces' lines,
the Runner's turns and the WAL line are there.
"""

from __future__ import annotations

import pytest

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
TIME = r"[0-9.]+ (?:µs|ms)"
RATIO = r"\*\*[0-9.]+×\*\*"


@pytest.mark.slow  # a smoke run of a benchmark command (seconds of imports): CI's -m slow
def test_quick_benchmark_writes_the_tables(tmp_path: Path) -> None:
    """--quick --out FILE writes a row per operation and history, the pieces, the Runner
    and the WAL frames."""
    out = tmp_path / "ADAPTER-OPENAI-AGENTS.md"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.adapter_openai_agents", "--quick", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    md = out.read_text(encoding="utf-8")
    pg = rf"(?:{TIME} \| {RATIO}|not installed.*\| )"
    for op in ("add_items \\(one turn\\)", "pop_item", "get_items\\(20\\)", "get_items\\(\\) all"):
        for history in ("10", "100"):
            row = rf"^\| {op} \| {history} \| {TIME} \| {TIME} \| {RATIO} \| {TIME} \| {pg} \|$"
            assert re.search(row, md, re.M), (op, history, md)
    assert len(re.findall(rf"^\| [a-z_()0-9 ]+ \| (?:as shipped|the same|0\.2's).* \| {TIME} \|",
                          md, re.M)) == 11
    assert re.search(rf"^\| SQLite \| [0-9.]+ ms \| [0-9.]+ ms \(SQLiteSession\) \| {RATIO} \|$",
                     md, re.M)
    assert re.search(r"^\| PostgreSQL \| [0-9.]+ ms \| ", md, re.M)
    assert re.search(r"WAL frames .*: AgentStateSession [0-9.]+, SQLiteSession [0-9.]+\.", md)
    assert "## Machine" in md
