"""Smoke run of the openai-agents adapter benchmark (``--quick``): it writes the table.

No timing is asserted: only that every operation at every history gets a figure
for each session and a ratio, and the WAL line is there.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
TIME = r"[0-9.]+ (?:µs|ms)"


def test_quick_benchmark_writes_the_table(tmp_path: Path) -> None:
    """--quick --out FILE writes a row per operation and history, and the WAL frames."""
    out = tmp_path / "ADAPTER-OPENAI-AGENTS.md"
    p = subprocess.run(
        [sys.executable, "-m", "benchmarks.adapter_openai_agents", "--quick", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    md = out.read_text(encoding="utf-8")
    for op in ("add_items \\(one turn\\)", "pop_item", "get_items\\(20\\)", "get_items\\(\\) all"):
        for history in ("10", "100"):
            row = rf"^\| {op} \| {history} \| {TIME} \| {TIME} \| \*\*[0-9.]+×\*\* \| {TIME} \|$"
            assert re.search(row, md, re.M), (op, history, md)
    assert re.search(r"WAL frames .*: AgentStateSession [0-9.]+, with the feed off [0-9.]+, "
                     r"SQLiteSession [0-9.]+\.", md)
    assert "## Machine" in md
