"""Smoke run of the ADK benchmark (``python -m benchmarks.adapter_adk --quick``).

Checks that it writes its tables: a figure for every operation and history length
for agentstate and each of ADK's services with their ratio, on SQLite and on
PostgreSQL (the benchmark starts its own server), the pieces' lines and the Runner
turns. DatabaseSessionService may be reported as not installed. No speed is asserted.
"""

from __future__ import annotations

import pytest

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MS = r"[0-9.]+ \([0-9.]+-[0-9.]+\)"
RATIO = r"\*\*[0-9.]+×\*\*"


@pytest.mark.slow  # a smoke run of a benchmark command (seconds of imports): CI's -m slow
def test_quick_run_writes_the_tables(tmp_path: Path) -> None:
    """--quick --out DIR writes every row, on both backends, with the machine."""
    p = subprocess.run([sys.executable, "-m", "benchmarks.adapter_adk", "--quick",
                        "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    md = (tmp_path / "ADAPTER-ADK.md").read_text(encoding="utf-8")
    assert "## Machine" in md and "cores" in md and "google-adk 2.13" in md
    for op in ("append_event", "get_session", "get_session, last 50"):
        for events in ("10", "50"):
            row = re.search(rf"^\| {re.escape(op)} \| {events} \| (.*)\|$", md, re.M)
            assert row, (op, events, md)
            cells = [c.strip() for c in row.group(1).split("|")]
            # SQLite: ours, SqliteSessionService + ratio, DatabaseSessionService + ratio;
            # PostgreSQL: ours, DatabaseSessionService + ratio
            assert len(cells) == 8, cells
            for i in (0, 1, 5):
                assert re.fullmatch(MS, cells[i]), cells
            assert re.fullmatch(RATIO, cells[2]), cells
            for i in (3, 6):
                assert (re.fullmatch(MS, cells[i]) and re.fullmatch(RATIO, cells[i + 1])
                        or cells[i].startswith("not installed")), cells
    assert len(re.findall(rf"^\| (?:as shipped|the same reads|0\.2's).* \| {MS} \| {MS} \|$",
                          md, re.M)) == 3
    assert re.search(rf"^\| SQLite \| [0-9.]+ ms \| [0-9.]+ ms \(SqliteSessionService\) \| "
                     rf"{RATIO} \|$", md, re.M)
    assert re.search(r"^\| PostgreSQL \| [0-9.]+ ms \| ", md, re.M)
