"""One regression test per bug found in review, named after what broke."""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import threading

import apsw
import pytest
from click.testing import CliRunner

import agentstate
from agentstate.cli import cli

from .conftest import file_digest


def _child_writes_around_parent_close(path, q, parent_closed):
    db = agentstate.open(path)
    s = db.scope("app", "fork")
    s.put("c1", 1)
    q.put("c1")
    assert parent_closed.wait(60)
    s.put("c2", 2)
    db.close()
    q.put("c2")


def test_fork_child_writes_survive_the_parent_closing(db_path):
    """A fork()ed child's acknowledged write is not lost when the parent closes its connection."""
    db = agentstate.open(db_path)
    db.scope("app", "fork").put("parent", 0)
    ctx = mp.get_context("fork")
    q, parent_closed = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_child_writes_around_parent_close, args=(db_path, q, parent_closed))
    p.start()
    assert q.get(timeout=60) == "c1"
    db.close()
    parent_closed.set()
    assert q.get(timeout=60) == "c2"
    p.join(60)
    assert p.exitcode == 0
    with agentstate.open(db_path) as fresh:
        assert fresh.scope("app", "fork").list() == ["c1", "c2", "parent"]
        assert fresh.check() == []


def _child_tries(path, q):
    try:
        agentstate.open(path).scope("app", "a").get("k")
        q.put("opened")
    except agentstate.StorageError as e:
        q.put(f"StorageError: {e}")


def test_fork_during_a_transaction_is_refused_in_the_child(db_path):
    """A file whose connection was mid-transaction at fork() is a clear error in the child."""
    db = agentstate.open(db_path)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    with db.transaction():
        db.scope("app", "a").put("k", 1)
        p = ctx.Process(target=_child_tries, args=(db_path, q))
        p.start()
        got = q.get(timeout=60)
    p.join(60)
    assert got.startswith("StorageError:") and "forked" in got
    assert db.scope("app", "a").get("k") == 1
    db.close()


def test_thread_connections_close_when_threads_end(db):
    """A thread per request does not leave a connection (and its file handles) behind."""
    s = db.scope("app", "a")
    s.put("k", 1)
    for _ in range(50):
        t = threading.Thread(target=lambda: s.get("k"))
        t.start()
        t.join()
    gc.collect()
    assert len(db._store._conns) <= 2


def test_foreign_sqlite_file_is_refused_byte_for_byte_unchanged(tmp_path):
    other = str(tmp_path / "other.db")
    c = apsw.Connection(other)
    c.execute("CREATE TABLE t (x)")
    c.close()
    before = file_digest(other)
    with pytest.raises(agentstate.Damaged):
        agentstate.open(other)
    assert file_digest(other) == before


def test_get_of_deeply_nested_bytes_is_a_decode_error(db):
    s = db.scope("app", "a")
    s.put_bytes("k", b"[" * 100_000)
    with pytest.raises(json.JSONDecodeError):
        s.get("k")


@pytest.mark.parametrize("call", [
    lambda db: agentstate.open(db.path, busy_timeout=3e6),
    lambda db: db.runs.entries("r", since=2**64),
    lambda db: db.runs.tail("r", 2**64),
    lambda db: db.runs.fork("r", "f", upto=2**64),
    lambda db: db.scope("app", "a").slice("k", 2**64),
    lambda db: db.scope("app", "a").slice("k", 0, -(2**64)),
    lambda db: db.scope("app", "a").list(limit=2**64),
    lambda db: db.scope("app", "a").put("k", 1, if_version=2**64),
    lambda db: db.runs.write("r", [{"seq": 2**63}], None, create=True),
])
def test_huge_integers_are_invalid_value_not_overflow_error(db, call):
    with pytest.raises(agentstate.InvalidValue):
        call(db)


def test_cli_never_prints_a_traceback_for_deep_or_non_utf8_input(tmp_path):
    p = str(tmp_path / "x.db")
    for args, stdin in ((["put", "app:a", "k", "[" * 100_000], None),
                        (["put", "app:a", "k", "-"], b"\xff\xfe"),
                        (["append", "app:a", "k", "-"], b"[" * 100_000)):
        r = CliRunner().invoke(cli, ["--db", p, *args], input=stdin)
        assert r.exit_code == 1, r.output
        assert r.stderr.startswith("Error: invalid_value:") and len(r.stderr.splitlines()) == 1
        assert r.exception is None or isinstance(r.exception, SystemExit)
    assert not os.path.exists(p)  # refused before anything was created


def test_cli_refused_put_creates_no_file(tmp_path):
    p = str(tmp_path / "new.db")
    r = CliRunner().invoke(cli, ["--db", p, "put", "app:a", "bad key", "1"])
    assert r.exit_code == 1 and not os.path.exists(p)
    r = CliRunner().invoke(cli, ["--db", p, "append", "app:a", "k", "[NaN]"])
    assert r.exit_code == 1 and not os.path.exists(p)


def test_thread_client_with_a_bad_id_creates_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENTSTATE_DB", raising=False)
    with pytest.raises(agentstate.InvalidKey):
        agentstate.ThreadStateClient("bad id!")
    assert not os.path.exists(tmp_path / "agentstate.db")


def test_export_refuses_run_ids_that_are_not_folder_names(db, tmp_path):
    db.runs.write("..", [{"seq": 0}], None, create=True)
    with pytest.raises(agentstate.InvalidKey):
        db.runs.export("..", tmp_path / "inner")
    assert not (tmp_path / "log.jsonl").exists()


def test_cli_release_without_a_terminal_is_one_clear_line(db_path):
    alice = agentstate.Principal("alice")
    with agentstate.open(db_path) as db:
        s = db.sessions.create(alice)
        db.sessions.start_turn(s.id, alice)
    r = CliRunner().invoke(cli, ["--db", db_path, "sessions", "release", s.id], input="")
    assert r.exit_code == 1 and r.stderr.startswith("Error: aborted:")


def test_update_runs_fn_outside_the_write_lock(db):
    """While fn runs, other writers are not blocked (fn here waits for one)."""
    s = db.scope("app", "a")
    other = agentstate.open(db.path, busy_timeout=0.5)
    done = []

    def fn(v):
        if not done:  # the first call: another connection writes meanwhile
            other.scope("app", "b").put("x", 1)
            done.append(True)
        return (v or 0) + 1

    assert s.update("n", fn) == 1
    s.put("n", 10)
    calls = []

    def racing(v):
        calls.append(v)
        if len(calls) == 1:
            other.scope("app", "a").put("n", 100)  # changes the key between read and write
        return v + 1

    assert s.update("n", racing) == 101
    assert calls == [10, 100] and s.get("n") == 101
    other.close()
