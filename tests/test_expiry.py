"""Expiry, trim and prune (SPEC §10): the store forgets on purpose, never by accident."""

from __future__ import annotations

import itertools
import time

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate.cli import cli

from .conftest import RawSQL, digest, target

ADMIN = agentstate.Principal("ops", admin=True)
ALICE = agentstate.Principal("alice")


@pytest.fixture
def db(any_db):
    """Every test here runs on both backends: an SQLite file and a PostgreSQL schema
    (vacuum, a file's own, uses ``file_db``)."""
    return any_db


@pytest.fixture
def file_db(db_path):
    d = agentstate.open(db_path)
    yield d
    d.close()


def _expired(db, kv, key, ttl=0.05):
    kv.put(key, {"v": 1}, ttl=ttl)
    time.sleep(ttl + 0.05)


def test_an_expired_key_is_absent_to_every_reader(db):
    kv = db.scope("thread", "t1")
    kv.put("keep", 1)
    kv.append("list", [1, 2], ttl=0.05)
    _expired(db, kv, "k")
    assert kv.get("k", "dflt") == "dflt" and kv.get_versioned("k") == (None, 0)
    assert kv.get_bytes("k") is None and kv.expires_at("k") is None
    assert kv.list() == ["keep"] and kv.slice("list") == [] and kv.length("list") == 0
    assert kv.pop("list") == [] and kv.touch("k") is False
    assert agentstate.ThreadStateStore("t1", db).get_json("k") is None
    assert agentstate.ThreadStateClient("t1", db).list() == ["keep"]
    with db.transaction():
        assert kv.get("k") is None
    with RawSQL(db) as c:
        assert c.execute("SELECT key FROM state") == [("keep",)]
    r = CliRunner().invoke(cli, ["--db", target(db), "get", "thread:t1", "k"])
    assert r.exit_code == 1 and "not_found" in r.stderr
    r = CliRunner().invoke(cli, ["--db", target(db), "--json", "keys", "thread:t1"])
    assert r.stdout.strip() == '["keep"]'


def test_a_recreated_key_continues_above_the_expired_version(db):
    kv = db.scope("app", "a")
    kv.put("k", 1)
    kv.put("k", 2, ttl=0.05)  # version 2
    time.sleep(0.1)
    with pytest.raises(agentstate.VersionConflict) as e:
        kv.put("k", 3, if_version=2)
    assert e.value.current_version == 0
    v = kv.put("k", 3, if_version=0)
    assert v > 2
    assert [(c.op, c.version) for c in db.changes(0, key="k")][-2:] == [("expire", 2), ("put", v)]
    kv.append("l", [1], ttl=0.05)
    time.sleep(0.1)
    assert kv.append("l", [2]) == (1, 3) and kv.slice("l") == [2]  # a new list, not the old one
    assert db.check() == []


def test_ttl_rules_for_put_append_touch_and_update(db):
    kv = db.scope("app", "a")
    kv.put("k", 1, ttl=60)
    at = kv.expires_at("k")
    assert at is not None and at.tzinfo is not None and 50 < at.timestamp() - time.time() <= 60
    kv.update("k", lambda v: v + 1)  # an update keeps the expiry (like INCR, not SET)
    assert kv.expires_at("k") == at and kv.get("k") == 2
    kv.put("k", 3)  # a put without ttl: does not expire
    assert kv.expires_at("k") is None
    kv.append("l", [1], ttl=60)
    kv.append("l", [2])  # an append without ttl keeps it
    assert kv.expires_at("l") is not None
    version = kv.get_versioned("l").version
    assert kv.touch("l", None) is True and kv.expires_at("l") is None
    assert kv.touch("l", 0.05) is True and kv.get_versioned("l").version == version
    time.sleep(0.1)
    assert kv.get("l") is None and kv.touch("l", 10) is False


EXAMPLES = itertools.count()


@settings(max_examples=50)
@given(ttl=st.one_of(st.floats(allow_nan=True), st.integers(-5, 5), st.booleans(), st.text(max_size=3),
                     st.just(float("inf")), st.just(1e12)))
def test_bad_ttls_are_refused_and_change_nothing(db, ttl):
    kv = db.scope("app", f"a{next(EXAMPLES)}")  # a new scope per example
    kv.put("k", 1)
    good = not isinstance(ttl, (bool, str)) and ttl == ttl and 0 < ttl <= 1e11
    before = digest(db)
    calls = (lambda: kv.put("k", 2, ttl=ttl), lambda: kv.append("l", [1], ttl=ttl),
             lambda: kv.touch("k", ttl), lambda: kv.put_bytes("b", b"1", ttl=ttl))
    for call in calls:
        if good:
            call()
        else:
            with pytest.raises(agentstate.InvalidValue):
                call()
            assert digest(db) == before


def test_expired_rows_are_purged_as_writes_happen(db):
    kv = db.scope("agent", "churn")
    for i in range(200):
        kv.put(f"scratch{i}", i, ttl=0.01)
    time.sleep(0.05)
    for i in range(200):  # steady churn: the purge keeps up, a few rows per write
        kv.put(f"new{i}", i, ttl=0.01)
    with RawSQL(db) as c:  # the rows that hold a value: a purged key leaves its version behind
        # (in kv_deleted on a file, as a tombstone row on PostgreSQL: expires_at '-infinity')
        rows = c.execute("SELECT count(*) FROM kv WHERE expires_at IS NULL OR expires_at <> '-infinity'")[0][0]
    assert rows < 100, rows  # not 400: expired rows go as writes happen
    assert sum(1 for ch in db.changes(0, limit=10_000) if ch.op == "expire") >= 200
    assert db.check() == []


def test_vacuum_purges_everything_expired(file_db, db_path):
    """agentstate vacuum rebuilds a file (a server vacuums itself: see test_postgres.py)."""
    db = file_db
    kv = db.scope("app", "a")
    for i in range(50):
        kv.put(f"k{i}", "x" * 1000, ttl=0.01)
    time.sleep(0.05)
    db.vacuum()
    with RawSQL(db) as c:
        assert c.execute("SELECT count(*) FROM kv") == [(0,)]


# -- runs ---------------------------------------------------------------------

def test_trim_keeps_a_contiguous_history(db):
    db.runs.write("r", [{"seq": i, "type": "tool_call" if i == 4 else "x", "call_id": "c"}
                        for i in range(6)], {"turn": 1}, create=True)
    assert db.runs.trim("r", before=3) == 3
    assert db.runs.trim("r", before=2) == 0  # already gone
    assert [e["seq"] for e in db.runs.read("r").entries] == [3, 4, 5]
    assert [e["seq"] for e in db.runs.entries("r", since=0)] == [3, 4, 5]
    assert db.runs.load("r").entries[-1]["status"] == "unknown"  # the call at seq 4 is open
    db.runs.write("r", [{"seq": 5, "type": "x", "call_id": "c"}, {"seq": 6}], None)  # retry + new
    with pytest.raises(agentstate.HistoryGap):
        db.runs.write("r", [{"seq": 9}], None)
    with pytest.raises(agentstate.HistoryGap):
        db.runs.fork("r", "f", upto=2)
    db.runs.fork("r", "f", upto=4)
    assert [e["seq"] for e in db.runs.read("f").entries] == [3, 4]
    db.runs.write("f", [{"seq": 5}], None)
    assert db.runs.trim("r", before=100) == 4  # all: the history starts after the last seq
    assert db.runs.read("r").entries == [] and db.runs.read("r").snapshot == {"turn": 1}
    db.runs.write("r", [{"seq": 7}], None)
    assert [e["seq"] for e in db.runs.read("r").entries] == [7]
    with pytest.raises(agentstate.RunNotFound):
        db.runs.trim("nope", before=1)
    with pytest.raises(agentstate.InvalidValue):
        db.runs.trim("r", before=-1)
    assert db.check() == []


def test_check_finds_a_hole_made_by_hand(db):
    db.runs.write("r", [{"seq": i} for i in range(4)], None, create=True)
    db.runs.trim("r", before=1)
    with RawSQL(db) as c:
        c.execute("DELETE FROM run_entry WHERE run_id = 'r' AND seq = 2")
        with pytest.raises(c.refused):  # the trigger: no entry below the first kept one
            c.execute("INSERT INTO run_entry VALUES ('r', 0, '{\"seq\":0}')")
    assert any("run r" in p for p in db.check())


def test_prune_runs_by_age_and_finished(db):
    db.runs.write("old-done", [], {"finished": True}, create=True)
    db.runs.write("old-open", [], {"finished": False}, create=True)
    db.runs.write("old-1", [], {"finished": 1}, create=True)  # not a bool: not finished
    time.sleep(1.5)  # the old ones are 1.5 s old; the new one a few ms (1 s of margin)
    db.runs.write("new-done", [], {"finished": True}, create=True)
    assert db.runs.prune(older_than=1.0) == ["old-done"]
    assert sorted(db.runs.prune(older_than=1.0, finished_only=False)) == ["old-1", "old-open"]
    assert [r.id for r in db.runs.list()] == ["new-done"]
    assert [c.op for c in db.changes(0, topic="run")][-3:] == ["delete"] * 3
    with pytest.raises(agentstate.InvalidValue):
        db.runs.prune(older_than=-1)


def test_prune_sessions_only_idle_ones_and_only_for_admins(db):
    idle = db.sessions.create(ALICE)
    db.sessions.state(idle.id, ALICE).put("k", 1)
    db.sessions.start_turn(idle.id, ALICE).finish()
    busy = db.sessions.create(ALICE)
    db.sessions.start_turn(busy.id, ALICE, lease=600)
    time.sleep(1.5)
    fresh = db.sessions.create(ALICE)
    with pytest.raises(agentstate.Forbidden):
        db.sessions.prune(ALICE, idle_for=1.0)
    assert db.sessions.prune(ADMIN, idle_for=1.0) == [idle.id]
    assert {s.id for s in db.sessions.list(ADMIN)} == {busy.id, fresh.id}
    assert db.scope("session", idle.id).get("k") is None
    assert db.check() == []


def test_command_prune_trim_settings(db):
    db_path = target(db)
    db.runs.write("done", [{"seq": 0}, {"seq": 1}], {"finished": True}, create=True)
    time.sleep(1.1)
    run = lambda *a: CliRunner().invoke(cli, ["--db", db_path, *a])  # noqa: E731
    r = run("prune", "--runs-older-than", "1s", "--dry-run")
    assert r.exit_code == 0 and "would remove run done" in r.stdout
    r = run("--json", "runs", "trim", "done", "--before", "1")
    assert r.exit_code == 0 and r.stdout.strip() == '{"removed": 1}'
    r = run("--json", "prune", "--runs-older-than", "1s")
    assert r.exit_code == 0 and '"runs": ["done"]' in r.stdout
    assert run("prune").exit_code == 2 and run("prune", "--runs-older-than", "soon").exit_code == 2
    assert run("--json", "settings").stdout.strip() == \
        '{"feed_retention": 604800, "history_retention": 86400}'
    assert run("settings", "feed_retention", "60").exit_code == 0
    assert run("settings", "feed_retention").stdout.strip() == "feed_retention = 60"
    r = run("settings", "feed_retention", "-1")
    assert r.exit_code == 1 and r.stderr.startswith("Error: invalid_value:")
    assert run("settings", "nope").exit_code == 1
