"""Same inputs, same answers on both backends (issue 26): the feed's retention purge, and
the extreme values the API accepts."""

from __future__ import annotations

import pytest

import agentstate

from .conftest import RawSQL

ADMIN = agentstate.Principal("ops", admin=True)
BIG = 2**63 - 1


@pytest.fixture
def db(any_db):
    return any_db


def test_the_purge_removes_only_a_prefix_of_the_feed(db):
    """Seqs follow commit order, not time: a commit that waited gets a higher seq with an
    older time. The purge keeps the feed a suffix by seq, so a reader from 0 either gets
    every change kept after its cursor or CursorExpired, never a silent gap."""
    kv = db.scope("app", "a")
    for key in ("a", "b", "c"):
        kv.put(key, 1)
    first, late = (c.seq for c in db.changes(0)[:2])
    db.set_setting("feed_retention", 3600)
    with RawSQL(db) as raw:  # b's commit waited (a slow flush): its time is older than a's
        raw.execute("UPDATE change SET at = ? WHERE seq = ?", ("2000-01-01T00:00:00.000000Z", late))
    for i in range(64):  # enough writes for the bounded purge to run
        kv.put("k", i)
    try:
        seen = [c.seq for c in db.changes(0)]
    except agentstate.CursorExpired:
        pytest.fail("a change newer than the retention was purged before it")
    assert seen[:2] == [first, late]
    with RawSQL(db) as raw:  # the old prefix goes once the newer change before it is old too
        raw.execute("UPDATE change SET at = ? WHERE seq = ?", ("2000-01-01T00:00:00.000000Z", first))
    for i in range(64):
        kv.put("k", i)
    with pytest.raises(agentstate.CursorExpired):
        db.changes(0)
    assert db.changes(late)[0].seq == late + 1


def test_fork_up_to_the_largest_seq_copies_every_entry(db):
    """fork(upto=2**63-1), an upto the API accepts, copies the whole history."""
    db.runs.write("r", [{"seq": 0}, {"seq": 1}], {"finished": True}, create=True)
    db.runs.fork("r", "r2", upto=BIG)
    assert [e["seq"] for e in db.runs.entries("r2")] == [0, 1]
    db.runs.trim("r", before=BIG)
    assert db.runs.entries("r") == [] and db.runs.tail("r", BIG) == []


@pytest.mark.parametrize("age", [1e11 - 1, 9.9e10, 7e10])
def test_prune_with_the_largest_age_prunes_nothing(db, age):
    """runs.prune and sessions.prune with an age the API accepts (under 1e11 s, before
    year 1) answer: nothing is that old."""
    db.runs.write("r", [], {"finished": True}, create=True)
    s = db.sessions.create(ADMIN)
    assert db.runs.prune(older_than=age) == []
    assert db.runs.prune(older_than=age, finished_only=False) == []
    assert db.sessions.prune(ADMIN, idle_for=age) == []
    assert db.runs.read("r") is not None and db.sessions.get(s.id, ADMIN).id == s.id
