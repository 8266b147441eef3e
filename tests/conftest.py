"""Shared fixtures: real files in tmp_path, WAL on, always closed."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
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


@contextlib.contextmanager
def sigint_as_in_a_terminal():
    """Children started inside get SIGINT's default, as a command typed in a terminal
    does: a test run started as a shell's background job ignores SIGINT, children
    inherit that, and Python then installs no KeyboardInterrupt (Ctrl-C does nothing).
    A handler set here (main thread) is reset to the default by exec."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def file_digest(path: str) -> str:
    """Hash of the database and its WAL: what a refused call must not change."""
    h = hashlib.sha256()
    for p in (path, path + "-wal"):
        if os.path.exists(p):
            h.update(Path(p).read_bytes())
        h.update(b"|")
    return h.hexdigest()


# -- PostgreSQL (SPEC §11): one server per test run, a fresh schema per test ------

def pg_unavailable(reason: str):
    """In CI a missing server is a failure; elsewhere the PostgreSQL tests say why they did not run."""
    if os.environ.get("CI"):
        pytest.fail(f"PostgreSQL is required in CI: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL tests not run: {reason}")


@pytest.fixture(scope="session")
def pg_admin_url():
    """A superuser URL of the run's server: $DATABASE_URL, else a throwaway server."""
    from . import pgserver

    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        pg_unavailable("psycopg is not installed (pip install 'agentstate-db[postgres]')")
    if os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
        return
    bin_dir = pgserver.bindir()
    if bin_dir is None:
        pg_unavailable("no initdb/pg_ctl here: apt-get install postgresql, or set DATABASE_URL")
    pgserver.sweep(bin_dir)
    server = pgserver.Server(bin_dir).start()
    yield server.admin_url
    server.stop()


@pytest.fixture
def pg_url(pg_admin_url: str):
    """The URL of a fresh, empty store: a new schema named in search_path."""
    from . import pgserver

    schema = pgserver.new_schema(pg_admin_url)
    yield pgserver.schema_url(pg_admin_url, schema)
    if os.environ.get("DATABASE_URL"):  # a throwaway server is deleted whole instead
        pgserver.drop_schema(pg_admin_url, schema)


@pytest.hookimpl(tryfirst=True)  # before -m 'not slow' deselects
def pytest_collection_modifyitems(config, items):
    """A test marked slow_on_postgres is slow (run by CI's -m slow) on PostgreSQL only
    (its parameters' id names postgres): its SQLite case stays in the default run."""
    for item in items:
        params = getattr(item, "callspec", None)
        if item.get_closest_marker("slow_on_postgres") and params is not None \
                and "postgres" in params.id.split("-"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(params=["sqlite", "postgres"])
def any_db(request, tmp_path: Path):
    """One store on each backend: an SQLite file in tmp_path, or a PostgreSQL schema."""
    if request.param == "sqlite":
        d = agentstate.open(str(tmp_path / "agent.db"))
    else:
        d = agentstate.open(request.getfixturevalue("pg_url"))
    yield d
    d.close()


def served(db):
    """The store behind a remote test client (tests/test_remote.py sets ``served``), else db."""
    return getattr(db, "served", db)


def on_postgres(db) -> bool:
    return served(db).path.startswith(("postgresql://", "postgres://"))


PG_TABLES = ("kv", "list_item", "run", "run_entry", "run_call", "session", "turn", "change",
             "feed_head", "change_new", "setting", "token", "signin", "kv_history", "list_gone",
             "list_base", "list_dead", "history_head")


def digest(db) -> str:
    """What a refused call must not change: the file and its WAL, or every table of the store."""
    db = served(db)
    if not on_postgres(db):
        return file_digest(db.path)
    db._store.query("SELECT feed_sequence()")  # as a read does: what is committed, numbered
    parts = [db._store.query(f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) "
                             f"FROM {table} t")[0][0] for table in PG_TABLES]
    parts.append(str(db._store.query("SELECT last_value FROM list_seq")[0][0]))
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def target(db) -> str:
    """What agentstate.open() takes to open the same store again (in another process too)."""
    db = served(db)
    return db._store.url if on_postgres(db) else db.path


class RawSQL:
    """A plain driver connection to the store, as the sqlite3 shell or psql would be.

    ``execute`` takes SQLite's ``?`` placeholders on both; ``refused`` is the
    driver's error for a broken constraint (or trigger).
    """

    def __init__(self, db) -> None:
        db = served(db)
        self.pg = on_postgres(db)
        if self.pg:
            import psycopg

            self.c = psycopg.connect(target(db), autocommit=True)
            self.refused = psycopg.errors.IntegrityError
        else:
            import apsw

            self.c = apsw.Connection(db.path)
            self.refused = apsw.ConstraintError

    def execute(self, sql: str, args=()) -> list:
        if not self.pg:
            return self.c.execute(sql, args).fetchall()
        cur = self.c.execute(sql.replace("?", "%s"), args or None)
        return cur.fetchall() if cur.description else []

    def __enter__(self) -> RawSQL:
        return self

    def __exit__(self, *exc) -> None:
        self.c.close()
