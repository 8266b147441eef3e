"""A PostgreSQL server for the adapter benchmarks, and what they share about it.

``Postgres()`` is a context manager: a throwaway server started as the tests
start theirs (``tests/pgserver.py``), with its durable defaults (fsync on,
``synchronous_commit`` on: every commit on disk, as agentstate's ``full``), or
the server of ``$DATABASE_URL`` when set. Each system gets a schema of its
own: ``url(schema)`` for agentstate, ``sqlalchemy_url(schema)`` for the
frameworks' SQLAlchemy backends, on psycopg 3's async driver. Schemas made here
are dropped at the end.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/ of this checkout
from tests import pgserver  # noqa: E402


def missing_sqlalchemy() -> str | None:
    """Why the SQLAlchemy comparisons cannot run, or None."""
    try:
        import greenlet  # noqa: F401  (SQLAlchemy's async engine needs it)
        import sqlalchemy  # noqa: F401
    except ImportError:
        return "not installed (pip install 'agentstate-db[bench]')"
    return None


class Postgres:
    """A server for one benchmark run (see the module docstring)."""

    def __init__(self) -> None:
        self.server: Any = None
        self.admin = os.environ.get("DATABASE_URL", "")
        self.schemas: list[str] = []

    def __enter__(self) -> Postgres:
        if not self.admin:
            bin_dir = pgserver.bindir()
            if bin_dir is None:
                raise SystemExit("no PostgreSQL binaries (apt-get install postgresql) "
                                 "and no DATABASE_URL")
            pgserver.sweep(bin_dir)
            self.server = pgserver.Server(bin_dir, settings=pgserver.DURABLE).start()
            self.admin = self.server.admin_url
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for name in self.schemas:
                pgserver.drop_schema(self.admin, name)
        finally:
            if self.server is not None:
                self.server.stop()

    def schema(self) -> str:
        self.schemas.append(pgserver.new_schema(self.admin))
        return self.schemas[-1]

    def url(self, schema: str) -> str:
        """agentstate's URL of a store in ``schema``."""
        return pgserver.schema_url(self.admin, schema)

    def sqlalchemy_url(self, schema: str) -> str:
        """An async SQLAlchemy URL (psycopg 3) whose connections use ``schema``."""
        base = self.admin.replace("postgresql://", "postgresql+psycopg://", 1)
        return pgserver.schema_url(base, schema)

    def version(self) -> str:
        import psycopg

        with psycopg.connect(self.admin) as c:
            return c.execute("SHOW server_version").fetchone()[0]
