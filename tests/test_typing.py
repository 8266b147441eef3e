"""The package is typed (it ships py.typed): mypy passes on agentstate/ with the settings of
pyproject.toml (every function annotated, no `type: ignore` that is not needed)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .conftest import REPO


@pytest.mark.timeout(1200)  # mypy's own bound is 900 s
def test_mypy_passes_on_the_package(tmp_path):
    # A cache of its own: a stale shared cache cannot hide an error, and runs in parallel
    # checkouts do not share one.
    r = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache"),
                        "--no-error-summary", "agentstate"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-20000:] + r.stderr[-5000:]
