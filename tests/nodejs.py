"""Node and npm for the tests that need them (the TypeScript client, a browser page, PostgreSQL
with pgvector on PGlite): skipped on a machine without them, failed in CI, which installs them
(.ci/run)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest


def npm(what: str) -> str:
    """npm's path; without node or npm a skip here and a failure in CI."""
    node, found = shutil.which("node"), shutil.which("npm")
    if node is None or found is None:
        if os.environ.get("CI"):  # .ci/run installs nodejs and npm
            pytest.fail(f"node and npm are needed for {what}", pytrace=False)
        pytest.skip(f"node or npm is not installed here: {what} did not run")
    return found


def install(npm_path: str, package: Path) -> None:
    """`npm ci` in `package` unless its node_modules came from this package-lock.json."""
    stamp = package / "node_modules" / ".agentstate-lock.sha256"
    digest = hashlib.sha256((package / "package-lock.json").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    r = subprocess.run([npm_path, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                       cwd=package, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"npm ci in {package} failed:\n{r.stdout}\n{r.stderr}"
    stamp.write_text(digest)
