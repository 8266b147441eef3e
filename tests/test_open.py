"""Opening a database: files, modes, schema versions, busy, close, threads, fork (SPEC §1)."""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
import threading
import time

import apsw
import pytest

import agentstate
from agentstate.backends.sqlite import schema as _schema
from agentstate.backends.sqlite import store as _store

from .conftest import REPO, file_digest


def mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o077])
def test_files_are_owner_only_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = str(tmp_path / "sub" / "dir" / "a.db")
        with agentstate.open(path) as db:
            db.scope("app", "a").put("k", 1)
            for p in (path, path + "-wal", path + "-shm"):
                assert mode(p) == 0o600, p
    finally:
        os.umask(old)


def test_default_path_from_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTSTATE_DB", raising=False)
    with agentstate.open() as db:
        assert db.path == str(tmp_path / "agentstate.db")
    monkeypatch.setenv("AGENTSTATE_DB", str(tmp_path / "env.db"))
    with agentstate.open() as db:
        assert db.path == str(tmp_path / "env.db")


def test_pragmas(db_path):
    for durability, sync in (("full", 2), ("normal", 1)):
        with agentstate.open(db_path, durability=durability) as db:
            c = db._store.conn()
            assert c.pragma("journal_mode") == "wal"
            assert c.pragma("synchronous") == sync
            assert c.pragma("foreign_keys") == 1
            assert c.pragma("user_version") == _schema.SCHEMA_VERSION


def test_bad_options(db_path):
    with pytest.raises(agentstate.InvalidValue):
        agentstate.open(db_path, durability="fast")
    with pytest.raises(agentstate.InvalidValue):
        agentstate.open(db_path, busy_timeout=-1)


def test_schema_comes_from_the_top_level_file():
    assert _schema.SCHEMA == (REPO / "schema.sql").read_text()
    assert _schema.SCHEMA_VERSION >= 1


def test_every_table_is_strict(db):
    rows = db._store.query("SELECT name, sql FROM sqlite_schema WHERE type = 'table'")
    assert {r[0] for r in rows} >= {"kv", "list_item", "kv_deleted"}
    for name, sql in rows:
        if name.startswith("sqlite_"):  # SQLite's own (sqlite_sequence, for AUTOINCREMENT)
            continue
        assert "STRICT" in sql, name


def test_newer_schema_is_refused_untouched(db_path):
    with agentstate.open(db_path) as db:
        db.scope("app", "a").put("k", 1)
    c = apsw.Connection(db_path)
    c.pragma("user_version", _schema.SCHEMA_VERSION + 1)
    c.close()
    before = file_digest(db_path)
    with pytest.raises(agentstate.SchemaTooNew) as e:
        agentstate.open(db_path)
    assert e.value.code == "schema_too_new"
    assert file_digest(db_path) == before


def test_migration_ladder_runs_in_one_transaction(db_path, monkeypatch):
    """An older file is upgraded step by step; a failing step leaves it untouched."""
    with agentstate.open(db_path) as db:
        db.scope("app", "a").put("k", 1)
    v = _schema.SCHEMA_VERSION
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", v + 2)
    monkeypatch.setattr(_schema, "MIGRATIONS", {
        v: lambda c, schema: c.execute("CREATE TABLE extra (x INTEGER) STRICT;"),
        v + 1: lambda c, schema: c.execute("INSERT INTO nonexistent VALUES (1);"),
    })
    before = file_digest(db_path)
    with pytest.raises(agentstate.AgentStateError):
        agentstate.open(db_path)
    assert file_digest(db_path) == before
    monkeypatch.setitem(_schema.MIGRATIONS, v + 1,
                        lambda c, schema: c.execute("INSERT INTO extra VALUES (1);"))
    with agentstate.open(db_path) as db:
        c = db._store.conn()
        assert c.pragma("user_version") == v + 2
        assert c.execute("SELECT x FROM extra").fetchall() == [(1,)]
        assert db.scope("app", "a").get("k") == 1


def test_foreign_files_are_refused(tmp_path):
    other = str(tmp_path / "other.db")
    c = apsw.Connection(other)
    c.execute("CREATE TABLE t (x)")
    c.close()
    with pytest.raises(agentstate.Damaged):
        agentstate.open(other)
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a database at all" * 100)
    with pytest.raises(agentstate.Damaged):
        agentstate.open(str(junk))
    with pytest.raises(agentstate.StorageError, match="is a directory"):
        agentstate.open(str(tmp_path))


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise on this OS")
def test_opening_a_file_asks_the_os_for_its_first_pages(db_path, monkeypatch):
    """An existing file's first PREFETCH bytes (header, schema, root pages) are asked
    for in one read-ahead before SQLite reads them one page at a time; a new file is not."""
    asked = []
    monkeypatch.setattr(_store, "_fadvise", lambda fd, off, n, advice: asked.append((off, n, advice)))
    agentstate.open(db_path).close()
    assert asked == []  # the file was empty
    with agentstate.open(db_path) as db:
        assert db.scope("app", "a").get("k") is None
    assert asked == [(0, _store.PREFETCH, os.POSIX_FADV_WILLNEED)]


def test_schema_and_root_pages_lie_within_the_prefetch(db_path):
    """What opening and a first read need before any data page, the schema's pages and
    every table's and index's root page, lies in the bytes asked for at open."""
    agentstate.open(db_path).close()
    c = apsw.Connection(db_path)
    page_size = c.pragma("page_size")
    last = max(c.execute("SELECT max(pageno) FROM dbstat WHERE name = 'sqlite_schema'").get,
               c.execute("SELECT max(rootpage) FROM sqlite_schema").get)
    c.close()
    assert last * page_size <= _store.PREFETCH


def _open_as_other_user(path, q):
    if os.geteuid() == 0:  # root ignores file permissions: become an unprivileged user
        import pwd

        nobody = pwd.getpwnam("nobody")
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
    try:
        agentstate.open(path).scope("app", "a").put("k", 1)
        q.put("opened")
    except agentstate.StorageError as e:
        q.put(f"StorageError: {e}")
    except BaseException as e:  # anything else is the failure under test
        q.put(f"{type(e).__name__}: {e}")


def test_file_another_process_cannot_write_is_a_clear_error():
    """A second process without write permission gets StorageError, not a crash."""
    import tempfile

    folder = tempfile.mkdtemp()
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "a.db")
    agentstate.open(path).close()
    ctx = mp.get_context("fork")
    for file_mode in (0o644, 0o600, 0o400):
        os.chmod(path, file_mode)
        if os.geteuid() != 0 and file_mode & 0o200:
            continue  # as a normal user only the owner-read-only mode denies writing
        q = ctx.Queue()
        p = ctx.Process(target=_open_as_other_user, args=(path, q))
        p.start()
        got = q.get(timeout=60)
        p.join(60)
        assert got.startswith("StorageError:"), (oct(file_mode), got)


def test_busy_after_timeout(db_path):
    """A writer that cannot get the lock within busy_timeout raises Busy, not a driver error."""
    agentstate.open(db_path).close()
    holder = apsw.Connection(db_path)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with agentstate.open(db_path, busy_timeout=0.2) as db:
            t0 = time.monotonic()
            with pytest.raises(agentstate.Busy) as e:
                db.scope("app", "a").put("k", 1)
            assert time.monotonic() - t0 >= 0.15
            assert e.value.code == "busy" and e.value.status == 503
            assert db.scope("app", "a").get("k") is None  # reads are not blocked
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_writers_wait_for_each_other_within_timeout(db_path):
    agentstate.open(db_path).close()
    holder = apsw.Connection(db_path)
    holder.execute("BEGIN IMMEDIATE")
    threading.Timer(0.3, lambda: holder.execute("COMMIT")).start()
    with agentstate.open(db_path, busy_timeout=5) as db:
        assert db.scope("app", "a").put("k", 1) == 1
    holder.close()


def test_close_is_idempotent_and_later_calls_raise_closed(db_path):
    db = agentstate.open(db_path)
    s = db.scope("app", "a")
    s.put("k", 1)
    db.close()
    db.close()
    for call in (lambda: s.get("k"), lambda: s.put("k", 2), lambda: s.list(),
                 lambda: s.list("%"), lambda: db.scope("app", "a"), lambda: db.state(app="a"),
                 lambda: db.transaction().__enter__()):
        with pytest.raises(agentstate.Closed):
            call()


def test_close_from_another_thread(db_path):
    db = agentstate.open(db_path)
    s = db.scope("app", "a")
    t = threading.Thread(target=lambda: s.put("k", 1))
    t.start()
    t.join()
    db.close()
    with pytest.raises(agentstate.Closed):
        s.get("k")


def _child_uses_parent_db(db, q):
    try:
        s = db.scope("app", "fork")
        s.append("l", ["child"])
        q.put(("ok", s.slice("l")))
    except agentstate.AgentStateError as e:
        q.put(("error", type(e).__name__))


def test_fork_child_gets_a_fresh_connection(db_path):
    """A fork()ed child that uses its parent's Database works on its own connection."""
    db = agentstate.open(db_path)
    s = db.scope("app", "fork")
    s.append("l", ["parent"])
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_uses_parent_db, args=(db, q))
    p.start()
    got = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert got == ("ok", ["parent", "child"])
    s.append("l", ["parent-again"])
    assert s.slice("l") == ["parent", "child", "parent-again"]
    db.close()
    with agentstate.open(db_path) as db2:
        assert db2._store.conn().execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_errors_have_codes_and_builtin_bases():
    e = agentstate
    table = [
        (e.InvalidKey, ValueError, "invalid_key", 400),
        (e.InvalidValue, (ValueError, TypeError), "invalid_value", 400),
        (e.TooLarge, ValueError, "too_large", 413),
        (e.VersionConflict, e.AgentStateError, "version_conflict", 409),
        (e.NotAList, TypeError, "not_a_list", 409),
        (e.HistoryGap, ValueError, "history_gap", 409),
        (e.RunExists, ValueError, "already_exists", 409),
        (e.RunNotFound, LookupError, "not_found", 404),
        (e.NotFound, LookupError, "not_found", 404),
        (e.SessionBusy, e.AgentStateError, "session_busy", 409),
        (e.InvalidTransition, e.AgentStateError, "invalid_transition", 409),
        (e.Forbidden, PermissionError, "forbidden", 403),
        (e.Busy, e.AgentStateError, "busy", 503),
        (e.Damaged, ValueError, "damaged", 500),
        (e.SchemaTooNew, ValueError, "schema_too_new", 500),
        (e.Closed, e.AgentStateError, "closed", 500),
    ]
    for cls, base, code, status in table:
        assert issubclass(cls, e.AgentStateError)
        assert issubclass(cls, base)
        assert (cls.code, cls.status) == (code, status)


def test_thread_clients(db_path, monkeypatch):
    with agentstate.open(db_path) as db:
        a = agentstate.ThreadStateClient("t-1", db=db)
        b = agentstate.ThreadStateClient("t-2", db=db)
        a.put("k", b"\x01")
        assert a.get("k") == b"\x01" and b.get("k") is None
        assert a.list() == ["k"] and b.list() == []
        a.delete("k")
        a.delete("k")
        assert a.get("k") is None
        j = agentstate.ThreadStateStore("t-1", db=db)
        j.put_json("cfg", {"x": [1]})
        assert j.get_json("cfg") == {"x": [1]} and j.list("c") == ["cfg"]
        with pytest.raises(TypeError):
            j.put_json("bad", {1, 2})
        a.put("raw", b"\xff")
        import json

        with pytest.raises(json.JSONDecodeError):
            j.get_json("raw")
        assert j.get_json("absent") is None
        with pytest.raises(TypeError):
            a.put("s", "not bytes")
    monkeypatch.setenv("AGENTSTATE_DB", db_path)
    monkeypatch.setenv("AGENTSTATE_THREAD_ID", "t-env")
    with agentstate.ThreadStateStore() as env_store:
        env_store.put_json("x", 1)
    with agentstate.open(db_path) as db:
        assert db.scope("thread", "t-env").get("x") == 1


def test_an_immediate_busy_at_open_is_waited_out(db_path, monkeypatch):
    """While another process creates the file, switches it to WAL or recovers it, SQLite
    can answer SQLITE_BUSY at once, without its busy handler: open() tries again
    (within busy_timeout) instead of failing."""
    import apsw

    agentstate.open(db_path).close()
    calls = []
    real = _schema.check_header

    def busy_twice(c, path):
        calls.append(1)
        if len(calls) <= 2:
            raise apsw.BusyError("database is locked")
        return real(c, path)

    monkeypatch.setattr(_schema, "check_header", busy_twice)
    with agentstate.open(db_path) as db:
        assert db.scope("app", "a").put("k", 1) == 1
    assert len(calls) == 3


def test_open_stays_busy_no_longer_than_busy_timeout(db_path, monkeypatch):
    """The retries at open are bounded: a file that stays busy is Busy after about
    busy_timeout, not sooner and not never."""
    import time

    import apsw

    agentstate.open(db_path).close()

    def always_busy(c, path):
        raise apsw.BusyError("database is locked")

    monkeypatch.setattr(_schema, "check_header", always_busy)
    t0 = time.monotonic()
    with pytest.raises(agentstate.Busy):
        agentstate.open(db_path, busy_timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 3.0
