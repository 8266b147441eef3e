"""Shared fixtures: real files in tmp_path, WAL on, always closed."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

import agentstate

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "ci", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
    print_blob=True,
)
settings.load_profile("ci" if os.environ.get("CI") else "default")

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def db_path(tmp_path: Path) -> str:
    return str(tmp_path / "agent.db")


@pytest.fixture
def db(db_path: str):
    d = agentstate.open(db_path)
    yield d
    d.close()


def file_digest(path: str) -> str:
    """Hash of the database and its WAL: what a refused call must not change."""
    h = hashlib.sha256()
    for p in (path, path + "-wal"):
        if os.path.exists(p):
            h.update(Path(p).read_bytes())
        h.update(b"|")
    return h.hexdigest()
