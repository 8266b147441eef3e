"""Smoke run of the ADK benchmark (``python -m benchmarks.adapter_adk --quick``).

Checks that it writes its table with a figure for every operation and history
length, for agentstate and for ADK's SqliteSessionService with their ratio, and
that DatabaseSessionService has figures or is reported as not installed. No
speed is asserted.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MS = r"[0-9.]+ \([0-9.]+-[0-9.]+\)"


def test_quick_run_writes_the_table(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, "-m", "benchmarks.adapter_adk", "--quick",
                        "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    md = (tmp_path / "ADAPTER-ADK.md").read_text(encoding="utf-8")
    assert "## Machine" in md and "cores" in md and "google-adk 2.13" in md
    for op in ("append_event", "get_session", "get_session, last 50"):
        for events in ("10", "100"):
            row = re.search(rf"^\| {re.escape(op)} \| {events} \| (.*)\|$", md, re.M)
            assert row, (op, events, md)
            cells = [c.strip() for c in row.group(1).split("|")]
            assert re.fullmatch(MS, cells[0]) and re.fullmatch(MS, cells[1]), cells
            assert re.fullmatch(r"\*\*[0-9.]+×\*\*", cells[2]), cells
            assert re.fullmatch(MS, cells[3]) or cells[3].startswith("not installed"), cells
