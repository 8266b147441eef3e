"""The past as a user reads it (SPEC §17): ``db.as_of``, ``scope.history``, ``db.diff``,
``scope.restore``, ``sessions.fork``. Written on the ``db`` fixture, so that
tests/test_remote.py runs every one again through ``agentstate.connect()``."""

from __future__ import annotations

import time

import pytest

import agentstate
from agentstate import Principal

ALICE, BOB = Principal("alice"), Principal("bob")


def test_as_of_reads_a_scope_as_it_was_and_refuses_writes(db):
    s = db.scope("user", "u-7")
    s.put("settings", {"theme": "dark"}, ttl=3600)
    s.append("log", [1, 2])
    s.put_bytes("raw", b"\xff\x00")
    then = db.last_change()
    s.put("settings", {"theme": "light"})
    s.append("log", [3])
    s.put_bytes("raw", b"new")
    s.put("later", 1)
    s.delete("log")
    with db.as_of(then) as past:
        p = past.scope("user", "u-7")
        assert p.get("settings") == {"theme": "dark"}
        assert p.get_versioned("settings") == ({"theme": "dark"}, 1)
        assert p.get("later") is None and p.get("later", "absent") == "absent"
        assert p.get_versioned("later") == (None, 0)
        assert p.get_bytes("raw") == b"\xff\x00"
        assert p.list() == ["log", "raw", "settings"] and p.list("s") == ["settings"]
        assert p.slice("log") == [1, 2] and p.slice("log", -1) == [2] and p.length("log") == 2
        assert p.expires_at("settings") is not None
        assert p.get_many(["settings", "later"]) == {"settings": ({"theme": "dark"}, 1),
                                                     "later": (None, 0)}
        assert p.items("s") == [("settings", ({"theme": "dark"}, 1))]
        assert p.list(limit=0) == [] and p.items(limit=0) == [] and p.list(limit=1) == ["log"]
        assert p.list(after="log") == ["raw", "settings"] and p.list(after="zz") == []
        assert past.state(user="u-7").user.get("settings") == {"theme": "dark"}
        before = db.last_change()
        for write in (lambda: p.put("k", 1), lambda: p.delete("settings"),
                      lambda: p.append("log", [9]), lambda: p.pop("log"), lambda: p.clear(),
                      lambda: p.update("k", lambda v: 1, default=0),
                      lambda: p.put_bytes("raw", b"x"), lambda: p.touch("settings", 1)):
            with pytest.raises(agentstate.UsageError):
                write()
        assert db.last_change() == before
    assert s.get("settings") == {"theme": "light"} and s.get("log") is None
    assert s.expires_at("settings") is None


def test_as_of_checks_its_seq(db):
    s = db.scope("app", "a")
    s.put("k", 1)
    s.put("k", 2)
    head = db.last_change()
    for bad in (head + 1, -1, 2**63, "1", 1.0, True):
        with pytest.raises(agentstate.InvalidValue):
            with db.as_of(bad):
                pass
    with db.as_of(head) as past:
        assert past.scope("app", "a").get("k") == 2
    db.set_setting("history_retention", 0)
    with pytest.raises(agentstate.CursorExpired):
        with db.as_of(head - 1):
            pass
    with pytest.raises(agentstate.CursorExpired):
        db.diff(head - 1)
    with pytest.raises(agentstate.CursorExpired):
        s.restore(head - 1)


def test_history_lists_a_key_s_revisions_newest_first_and_pages(db):
    s = db.scope("agent", "a")
    for i in range(6):
        s.put("k", i)
    s.delete("k")
    s.put_bytes("k", b"\x00\xff")
    revs = s.history("k")
    assert [(r.op, r.value) for r in revs] == [
        ("put", b"\x00\xff"), ("delete", None), *[("put", i) for i in (5, 4, 3, 2, 1, 0)]]
    assert [r.seq for r in revs] == sorted((r.seq for r in revs), reverse=True)
    assert all(isinstance(r, agentstate.Revision) and r.at.tzinfo is not None for r in revs)
    assert s.history("k", limit=3) == revs[:3]
    assert s.history("k", before=revs[2].seq, limit=2) == revs[3:5]
    assert s.history("k", since=revs[3].seq) == revs[:3]
    assert s.history("never") == []
    with db.as_of(revs[4].seq) as past:
        assert past.scope("agent", "a").get("k") == revs[4].value


def test_history_of_a_list_holds_the_list_of_each_moment(db):
    s = db.scope("session", "plain")
    s.append("h", [1])
    s.append("h", [2, 3])
    s.pop("h")
    assert [(r.op, r.value) for r in s.history("h")] == [("pop", [1, 2]), ("append", [1, 2, 3]),
                                                        ("append", [1])]


def test_diff_lists_each_key_changed_with_what_it_was_and_became(db):
    a, b = db.scope("user", "u-1"), db.scope("thread", "t-1")
    a.put("x", 1)
    b.put("gone", 1)
    since = db.last_change()
    a.put("x", 2)
    a.put("new", [1])
    b.delete("gone")
    b.put("same", 1)
    b.delete("same")
    until = db.last_change()
    a.put("x", 3)
    got = db.diff(since, until)
    assert [(d.kind, d.scope_id, d.key) for d in got] == [
        ("thread", "t-1", "gone"), ("thread", "t-1", "same"), ("user", "u-1", "new"),
        ("user", "u-1", "x")]
    assert got[0].before == (1, 1) and got[0].after == (None, 0)
    assert got[1].before.value == got[1].after.value is None  # made and deleted in between
    assert got[3].before == (1, 1) and got[3].after == (2, 2)
    assert [d.after.value for d in db.diff(since, kind="user", key="x")] == [3]
    assert [d.key for d in db.diff(since, scope_id="t-1")] == ["gone", "same"]
    assert db.diff(until, until) == []
    with pytest.raises(agentstate.InvalidValue):
        db.diff(until, since)
    with pytest.raises(agentstate.InvalidValue):
        db.diff(0, db.last_change() + 1)


def test_restore_puts_the_scope_back_as_new_versions(db):
    s = db.scope("app", "cfg")
    s.put("x", {"a": 1})
    s.append("l", [1, 2])
    then = db.last_change()
    s.put("x", {"a": 2})
    s.append("l", [3])
    s.put("made", 1)
    assert s.restore(then, keys=["x"]) == 1
    assert s.get_versioned("x") == ({"a": 1}, 3) and s.get("l") == [1, 2, 3]
    head = db.last_change()
    assert s.restore(then) == 2
    assert (s.get("l"), s.list()) == ([1, 2], ["l", "x"])
    assert [(c.op, c.key) for c in db.changes(head)] == [("put", "l"), ("delete", "made")]
    s.append("l", [4])
    assert s.get("l") == [1, 2, 4]
    with db.as_of(then) as past:
        assert past.scope("app", "cfg").get("l") == [1, 2]


def test_a_fenced_restore_under_a_lapsed_turn_writes_nothing(db):
    s = db.scope("app", "cfg")
    s.put("x", 1)
    then = db.last_change()
    s.put("x", 2)
    turn = db.sessions.start_turn(db.sessions.create(ALICE).id, ALICE, lease=0.05)
    time.sleep(0.2)
    head = db.last_change()
    with pytest.raises(agentstate.LeaseLost):
        s.restore(then, fence=turn)
    assert db.last_change() == head and s.get("x") == 2
    live = db.sessions.start_turn(db.sessions.create(ALICE).id, ALICE, lease=600)
    assert db.scope("app", "cfg", fence=live).restore(then) == 1 and s.get("x") == 1


def test_a_fork_is_a_new_session_with_the_state_then_and_independent_after(db):
    sid = db.sessions.create(ALICE, metadata={"who": "a"}).id
    st = db.sessions.state(sid, ALICE)
    st.append("history", [1, 2])
    st.put("plan", "a")
    then = db.last_change()
    st.append("history", [3])
    st.put("plan", "b")
    f = db.sessions.fork(sid, ALICE, at=then)
    assert f.id != sid and f.owner == "alice" and f.metadata == {"who": "a"}
    fst = db.sessions.state(f.id, ALICE)
    assert (fst.get("history"), fst.get("plan")) == ([1, 2], "a")
    assert db.sessions.turns(f.id, ALICE) == []
    fst.append("history", [9])
    st.pop("history")
    assert (fst.get("history"), st.get("history")) == ([1, 2, 9], [1, 2])
    now = db.sessions.fork(sid, ALICE, metadata={"who": "b"})
    assert now.metadata == {"who": "b"}
    assert db.sessions.state(now.id, ALICE).get("plan") == "b"
    with pytest.raises(agentstate.NotFound):
        db.sessions.fork(sid, BOB)
    with pytest.raises(agentstate.InvalidValue):
        db.sessions.fork(sid, ALICE, at=db.last_change() + 1)


def test_a_revision_never_says_a_key_held_nothing_when_it_held_a_value(db):
    """With history turned off, a write keeps no before-image: the revision of the change
    before it must not claim the key then held None (a put of 2 listed with value None)."""
    s = db.scope("app", "a")
    s.put("k", 1)
    s.put("k", 2)
    db.set_setting("history_retention", 0)
    s.put("k", 3)
    for r in s.history("k"):
        assert r.op in ("delete", "expire") or r.value is not None, r


def test_a_second_restore_to_the_same_change_changes_nothing(db):
    """restore returns "the number of keys changed" and leaves a key whose value is the
    same again as it is: restoring twice to one change changes nothing the second time,
    lists included (a list was written again, a new version of the same items)."""
    s = db.scope("app", "cfg")
    s.put("x", 1)
    s.append("l", [1, 2])
    then = db.last_change()
    s.put("x", 2)
    s.append("l", [3])
    assert s.restore(then) == 2
    head = db.last_change()
    assert s.restore(then) == 0
    assert db.last_change() == head
