"""Older files upgraded in one transaction, every value kept: schema 1 (agentstate 0.1.0),
schema 2 (the change feed and expiry), to the current one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import apsw
import pytest

import agentstate
import agentstate.backends.sqlite.schema

V1 = (Path(__file__).parent / "fixtures" / "schema_v1.sql").read_text()
V2 = (Path(__file__).parent / "fixtures" / "schema_v2.sql").read_text()
CURRENT = agentstate.backends.sqlite.schema.SCHEMA_VERSION
T = "2026-11-30T12:00:00.000000Z"


def make_v1_file(path: str) -> None:
    """A file as 0.1.0 left it: keys (JSON, bytes, a list), a deleted key's version, a run,
    a session with a finished and a running turn."""
    c = apsw.Connection(path)
    c.pragma("journal_mode", "wal")
    c.execute(V1)
    c.execute("BEGIN")
    c.execute("INSERT INTO kv VALUES ('session', 's-1', 'settings', 3, 'json', '{\"model\":\"small\"}', "
              "NULL, NULL, 17, ?)", (T,))
    c.execute("INSERT INTO kv VALUES ('app', 'a', 'blob', 1, 'bytes', X'00FF', NULL, NULL, 2, ?)", (T,))
    c.execute("UPDATE list_seq SET last = 1")
    c.execute("INSERT INTO kv VALUES ('session', 's-1', 'history', 2, 'list', NULL, 1, 2, 20, ?)", (T,))
    c.execute("INSERT INTO list_item VALUES (1, 0, '{\"a\":1}'), (1, 1, '[true,1.5]')")
    c.execute("INSERT INTO kv_deleted VALUES ('user', 'u', 'gone', 4)")
    c.execute("INSERT INTO run (id, snapshot, next_seq, created_at, updated_at) "
              "VALUES ('run-1', '{\"task\":\"t\",\"turn\":2}', 2, ?, ?)", (T, T))
    c.execute("INSERT INTO run_entry VALUES ('run-1', 0, '{\"seq\":0,\"type\":\"user\"}'), "
              "('run-1', 1, '{\"seq\":1,\"type\":\"tool_call\",\"call_id\":\"c1\"}')")
    c.execute("INSERT INTO session VALUES ('s-1', 'alice', ?, '{}')", (T,))
    c.execute("INSERT INTO turn (id, session_id, n, status, created_at, updated_at) "
              "VALUES ('t-1', 's-1', 1, 'finished', ?, ?)", (T, T))
    c.execute("INSERT INTO turn (id, session_id, n, status, lease, lease_until, created_at, updated_at) "
              "VALUES ('t-2', 's-1', 2, 'running', 60, 9e9, ?, ?)", (T, T))
    c.execute("COMMIT")
    c.close()


def content(path: str) -> dict:
    c = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    out = {t: c.execute(f"SELECT * FROM {t} ORDER BY 1, 2, 3").fetchall()
           for t in ("list_item", "kv_deleted", "run_entry", "session", "turn")}
    out["kv"] = c.execute("SELECT kind, scope_id, key, version, type, value, list_id, length, size "
                          "FROM kv ORDER BY 1, 2, 3").fetchall()
    out["run"] = c.execute("SELECT id, snapshot, next_seq FROM run").fetchall()
    out["user_version"] = c.pragma("user_version")
    c.close()
    return out


def test_a_010_file_is_upgraded_keeping_every_value(tmp_path):
    path = str(tmp_path / "old.db")
    make_v1_file(path)
    before = content(path)
    assert before["user_version"] == 1
    alice = agentstate.Principal("alice")
    with agentstate.open(path) as db:
        after = content(path)
        assert after["user_version"] == CURRENT
        assert {k: v for k, v in after.items() if k != "user_version"} == \
            {k: v for k, v in before.items() if k != "user_version"}
        s = db.scope("session", "s-1")
        assert s.get_versioned("settings") == ({"model": "small"}, 3)
        assert s.slice("history") == [{"a": 1}, [True, 1.5]]
        assert db.scope("app", "a").get_bytes("blob") == b"\x00\xff"
        assert db.scope("user", "u").put("gone", 1) == 5  # versions never reused
        assert db.runs.load("run-1").entries[-1]["status"] == "unknown"
        assert db.sessions.get_turn("t-2", alice).status == "running"
        with pytest.raises(agentstate.SessionBusy):
            db.sessions.start_turn("s-1", alice)
        assert db.check() == []
        # what schema 2 adds works on the upgraded file
        s.append("history", [3], ttl=60)
        assert db.runs.trim("run-1", before=1) == 1
        assert [(c.op, c.key or c.scope_id) for c in db.changes(0)] == \
            [("put", "gone"), ("append", "history"), ("trim", "run-1")]
        assert db.check() == []


def test_a_crash_during_the_upgrade_leaves_the_v1_file_intact(tmp_path):
    path = str(tmp_path / "old.db")
    make_v1_file(path)
    before = content(path)
    child = subprocess.run([sys.executable, "-c", """
import os, sys
import agentstate
from agentstate.backends.sqlite import schema as _migrations
upgrade = _migrations.MIGRATIONS[1]
def upgrade_then_die(c, schema):
    upgrade(c, schema)   # every statement of the upgrade ran...
    os.kill(os.getpid(), 9)  # ...and the process dies before its COMMIT
_migrations.MIGRATIONS[1] = upgrade_then_die
agentstate.open(sys.argv[1])
""", path])
    assert child.returncode == -9
    assert content(path) == before  # still version 1, every row as it was
    c = apsw.Connection(path)
    assert c.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'change'").get == 0
    c.close()
    with agentstate.open(path) as db:  # and it upgrades fine next time
        assert db.info()["schema_version"] == CURRENT and db.check() == []


def schema_objects(path: str) -> list[tuple[str, str, str]]:
    c = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    rows = c.execute("SELECT type, name, tbl_name FROM sqlite_schema ORDER BY 1, 2").fetchall()
    c.close()
    return rows


def test_a_v2_file_gains_the_paging_indexes_and_matches_a_new_file(tmp_path):
    old, new = str(tmp_path / "v2.db"), str(tmp_path / "new.db")
    c = apsw.Connection(old)
    c.pragma("journal_mode", "wal")
    c.execute(V2)
    c.execute("INSERT INTO run (id, snapshot, next_seq, created_at, updated_at) "
              "VALUES ('run-1', '{\"task\":\"t\"}', 0, ?, ?)", (T, T))
    c.execute("INSERT INTO session VALUES ('s-1', 'alice', ?, '{}')", (T,))
    c.execute("INSERT INTO turn (id, session_id, n, status, created_at, updated_at) "
              "VALUES ('t-1', 's-1', 1, 'held', ?, ?)", (T, T))
    c.close()
    assert "run_by_update" not in {name for _, name, _ in schema_objects(old)}
    agentstate.open(new).close()
    with agentstate.open(old) as db:
        assert db.info()["schema_version"] == CURRENT
        assert [r.id for r in db.runs.list(limit=1)] == ["run-1"]
        alice = agentstate.Principal("alice")
        assert [t.id for t in db.sessions.turns_by_status(alice, "held")] == ["t-1"]
        assert db.check() == []
    assert schema_objects(old) == schema_objects(new)
