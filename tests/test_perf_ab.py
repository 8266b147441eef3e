"""Smoke run of ``python -m benchmarks.ab`` (the in-process A/B of two versions behind PYTHON-COST.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent


def test_ab_compares_two_versions_in_one_process():
    p = subprocess.run([sys.executable, "-m", "benchmarks.ab", "HEAD", "--rounds", "2", "--calls", "5",
                        "--ops", "put,get"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    for line in ("| put |", "| put, Python only (SQLite stubbed) |", "| get |"):
        assert line in p.stdout
