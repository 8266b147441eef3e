"""Value history (SPEC §17): the store as of any change, a key's revisions, diffs, restore
and forks, on both backends (tests/test_remote.py runs these through connect() too)."""

from __future__ import annotations

import time

import pytest

import agentstate
from agentstate import CursorExpired, InvalidValue, UsageError, Versioned

from .conftest import digest

ALICE = agentstate.Principal("alice")


@pytest.fixture
def db(any_db):
    return any_db


def past(db, seq):
    with db.as_of(seq) as p:
        return p


def test_a_key_reads_as_it_was_right_after_each_change(db):
    """as_of(seq): the value right after change seq; before its first write, after a delete
    and in between: absent; the version too."""
    kv = db.scope("user", "u-7")
    start = db.last_change()
    v1 = kv.put("settings", {"model": "small"})
    s1 = db.last_change()
    kv.put("settings", {"model": "large"})
    s2 = db.last_change()
    kv.delete("settings")
    s3 = db.last_change()
    kv.put("settings", {"model": "tiny"})
    s4 = db.last_change()
    seen = {s: past(db, s).scope("user", "u-7").get_versioned("settings")
            for s in (start, s1, s2, s3, s4)}
    assert seen == {start: Versioned(None, 0), s1: Versioned({"model": "small"}, v1),
                    s2: Versioned({"model": "large"}, 2), s3: Versioned(None, 0),
                    s4: Versioned({"model": "tiny"}, 4)}


def test_other_scopes_and_keys_do_not_leak_into_the_past(db):
    """A change of another key or scope after seq does not change what as_of(seq) reads."""
    a, b = db.scope("app", "a"), db.scope("app", "b")
    a.put("k", 1)
    seq = db.last_change()
    b.put("k", 2)
    a.put("other", 3)
    p = past(db, seq)
    assert p.scope("app", "a").get("k") == 1 and p.scope("app", "b").get("k") is None
    assert p.scope("app", "a").list() == ["k"] and p.scope("app", "b").list() == []


def test_lists_read_as_they_were_at_every_change(db):
    """A list as of each change: its items of that moment, whatever appends, pops and
    re-appends came after (no list is copied: pops keep what they removed)."""
    kv = db.scope("session", "s-1")
    model: list[int] = []
    seen = {}
    steps = [("append", [1, 2, 3]), ("pop", 2), ("append", [7, 8]), ("pop", 1), ("pop", 5),
             ("append", [4]), ("append", list(range(10, 20))), ("pop", 3)]
    for op, arg in steps:
        if op == "append":
            kv.append("h", arg)
            model.extend(arg)
        else:
            kv.pop("h", arg)
            del model[max(0, len(model) - arg):]
        seen[db.last_change()] = list(model)
    for seq, items in seen.items():
        scope = past(db, seq).scope("session", "s-1")
        assert scope.get("h") == items, seq
        assert scope.length("h") == len(items)
        assert scope.slice("h", 1, -1) == items[1:-1] and scope.slice("h", -2) == items[-2:]


def test_a_list_replaced_or_deleted_still_reads_as_it_was(db):
    kv = db.scope("session", "s-1")
    kv.append("h", [1, 2])
    s1 = db.last_change()
    kv.put("h", ["x"])
    s2 = db.last_change()
    kv.delete("h")
    kv.put("h", {"not": "a list"})
    assert past(db, s1).scope("session", "s-1").get("h") == [1, 2]
    assert past(db, s2).scope("session", "s-1").get("h") == ["x"]
    assert kv.get("h") == {"not": "a list"}


def test_expiry_and_touch_are_part_of_the_past(db):
    """A key whose expiry had come by then reads as absent; expires_at reads as it was
    (a touch replaced it)."""
    kv = db.scope("app", "a")
    kv.put("t", 1, ttl=0.3)
    s1 = db.last_change()
    first = past(db, s1).scope("app", "a").expires_at("t")
    kv.touch("t", 1000)
    s2 = db.last_change()
    assert past(db, s1).scope("app", "a").expires_at("t") == first
    assert past(db, s2).scope("app", "a").expires_at("t") > first
    kv.put("short", 1, ttl=0.05)
    time.sleep(0.1)
    db.scope("app", "b").put("later", 1)  # a change after it expired
    s3 = db.last_change()
    assert past(db, s3).scope("app", "a").get("short") is None
    assert "short" not in past(db, s3).scope("app", "a").list()


def test_every_read_of_the_past_and_no_write(db):
    """get, get_versioned, get_many, items, list, slice, length, expires_at read the past;
    any write through it is UsageError and writes nothing."""
    kv = db.scope("app", "a")
    kv.put("x", 1)
    kv.append("l", [1, 2, 3])
    kv.put_bytes("b", b'{"raw": true}')
    seq = db.last_change()
    kv.put("x", 2)
    kv.delete("l")
    p = past(db, seq).scope("app", "a")
    assert p.get_many(["x", "l", "nope"]) == {"x": Versioned(1, 1), "l": Versioned([1, 2, 3], 1),
                                              "nope": Versioned(None, 0)}
    assert p.items() == [("b", Versioned({"raw": True}, 1)), ("l", Versioned([1, 2, 3], 1)),
                         ("x", Versioned(1, 1))]
    assert p.list(after="b") == ["l", "x"] and p.list(limit=1) == ["b"]
    assert p.get_bytes("b") == b'{"raw": true}' and p.expires_at("x") is None
    before = digest(db)
    for write in (lambda: p.put("x", 3), lambda: p.append("l", [4]), lambda: p.delete("x"),
                  lambda: p.pop("l"), lambda: p.update("x", lambda n: n + 1), lambda: p.clear(),
                  lambda: p.touch("x", 5), lambda: p.restore(at=seq)):
        with pytest.raises(UsageError):
            write()
    assert digest(db) == before


def test_a_seq_past_the_head_or_before_the_history_kept_is_refused(db):
    """as_of past the newest change: InvalidValue; with history off only the head reads;
    turned on again, history starts then (CursorExpired before)."""
    db.scope("app", "a").put("k", 1)
    head = db.last_change()
    with pytest.raises(InvalidValue):
        db.as_of(head + 1).__enter__()
    for bad in (-1, "3", 1.5, None):
        with pytest.raises(InvalidValue):
            db.as_of(bad).__enter__()
    db.set_setting("history_retention", 0)
    db.scope("app", "a").put("k", 2)
    with pytest.raises(CursorExpired):
        db.as_of(head).__enter__()
    assert past(db, db.last_change()).scope("app", "a").get("k") == 2  # the head: now
    db.set_setting("history_retention", 3600)
    on = db.last_change()
    db.scope("app", "a").put("k", 3)
    with pytest.raises(CursorExpired):
        db.as_of(on - 1).__enter__()
    assert past(db, on).scope("app", "a").get("k") == 2


def test_history_lists_each_kept_revision_newest_first(db):
    """history(key): seq, version, op, at and the value after each change, newest first,
    paged by since / before / limit; None after a delete."""
    kv = db.scope("user", "u-7")
    kv.put("s", 1)
    kv.put("s", 2)
    kv.delete("s")
    kv.append("s", ["a"])
    kv.touch("s", 100)
    revs = kv.history("s")
    assert [(r.op, r.version, r.value) for r in revs] == [
        ("touch", 4, ["a"]), ("append", 4, ["a"]), ("delete", 2, None), ("put", 2, 2),
        ("put", 1, 1)]
    assert [r.seq for r in revs] == sorted((r.seq for r in revs), reverse=True)
    assert all(r.at.tzinfo is not None for r in revs)
    assert kv.history("s", limit=2) == revs[:2]
    assert kv.history("s", before=revs[1].seq) == revs[2:]
    assert kv.history("s", since=revs[2].seq) == revs[:2]
    assert kv.history("never") == []


def test_diff_lists_every_key_changed_between_two_changes(db):
    """diff(since, until): one Diff per key changed in between, before and after, by kind,
    scope id, key; a key changed and changed back appears with equal values; filters."""
    db.scope("user", "u").put("a", 1)
    db.scope("app", "x").put("b", 1)
    since = db.last_change()
    db.scope("user", "u").put("a", 2)
    db.scope("user", "u").put("new", [1])
    db.scope("app", "x").put("b", 5)
    db.scope("app", "x").put("b", 1)  # and back
    until = db.last_change()
    db.scope("user", "u").put("a", 3)
    got = db.diff(since, until)
    assert [(d.kind, d.scope_id, d.key) for d in got] == [("app", "x", "b"), ("user", "u", "a"),
                                                           ("user", "u", "new")]
    assert got[0].before.value == got[0].after.value == 1
    assert got[1].before == Versioned(1, 1) and got[1].after == Versioned(2, 2)
    assert got[2].before == Versioned(None, 0) and got[2].after == Versioned([1], 1)
    assert [d.key for d in db.diff(since, kind="user", key="a")] == ["a"]
    assert db.diff(since)[1].after == Versioned(3, 3)
    with pytest.raises(InvalidValue):
        db.diff(until, since)


def test_restore_puts_a_scope_back_as_new_versions_in_one_transaction(db):
    """restore(at=seq): every key back as it was (new versions, in the feed), keys made
    since deleted, keys unchanged left alone; how many changed; keys= for some only."""
    kv = db.scope("user", "u-7")
    kv.put("settings", {"model": "small"})
    kv.append("history", [1, 2])
    kv.put("same", 1)
    seq = db.last_change()
    kv.put("settings", {"model": "WIPED"})
    kv.append("history", [3])
    kv.pop("history", 3)
    kv.put("junk", "x")
    head = db.last_change()
    assert kv.restore(at=seq, keys=["junk"]) == 1 and kv.get("junk") is None
    assert kv.restore(at=seq) == 2
    assert kv.get("settings") == {"model": "small"} and kv.get("history") == [1, 2]
    assert kv.get_versioned("settings").version == 3 and kv.get_versioned("same").version == 1
    ops = [(c.op, c.key) for c in db.changes(head)]
    assert sorted(ops) == [("delete", "junk"), ("put", "history"), ("put", "settings")]
    assert kv.append("history", [9]).length == 3 and kv.get("history") == [1, 2, 9]
    assert past(db, seq).scope("user", "u-7").get("history") == [1, 2]


def test_a_fork_is_the_session_as_it_was_and_independent_after(db):
    """sessions.fork(at=seq): a new session of the principal with the original's state at
    that change and no turns; writes to either never change the other (lists shared)."""
    s = db.sessions.create(ALICE, metadata={"topic": "refunds"})
    st = db.sessions.state(s.id, ALICE)
    st.append("history", list(range(5)))
    st.put("plan", "a")
    seq = db.last_change()
    st.append("history", [5])
    st.put("plan", "b")
    db.sessions.start_turn(s.id, ALICE).finish()
    f = db.sessions.fork(s.id, ALICE, at=seq)
    assert f.owner == "alice" and f.metadata == {"topic": "refunds"} and f.id != s.id
    fs = db.sessions.state(f.id, ALICE)
    assert fs.get("history") == [0, 1, 2, 3, 4] and fs.get("plan") == "a"
    assert db.sessions.turns(f.id, ALICE) == []
    st.pop("history", 4)
    fs.append("history", ["f"])
    st.append("history", ["o"])
    assert st.get("history") == [0, 1, "o"]
    assert fs.get("history") == [0, 1, 2, 3, 4, "f"]
    now = db.sessions.fork(s.id, ALICE, metadata={"n": 2})
    assert db.sessions.state(now.id, ALICE).get("history") == [0, 1, "o"]
    assert db.sessions.get(now.id, ALICE).metadata == {"n": 2}
    with pytest.raises(agentstate.NotFound):
        db.sessions.fork(s.id, agentstate.Principal("mallory"))


def test_a_fork_of_a_fork_reads_through_both(db):
    s = db.sessions.create(ALICE)
    st = db.sessions.state(s.id, ALICE)
    st.append("h", [1, 2, 3])
    f1 = db.sessions.fork(s.id, ALICE)
    db.sessions.state(f1.id, ALICE).append("h", [4])
    f2 = db.sessions.fork(f1.id, ALICE)
    db.sessions.state(f1.id, ALICE).pop("h", 3)
    st.pop("h", 3)
    assert db.sessions.state(f2.id, ALICE).get("h") == [1, 2, 3, 4]
    assert db.sessions.state(f2.id, ALICE).slice("h", 2) == [3, 4]
    assert db.sessions.state(f1.id, ALICE).get("h") == [1]


def test_writes_in_batches_and_blocks_keep_their_history(db):
    """A batch's and a clear's changes each keep what they replaced."""
    kv = db.scope("app", "a")
    kv.put("x", 1)
    kv.put("y", [1])
    seq = db.last_change()
    with db.batch() as b:
        b.scope("app", "a").put("x", 2)
        b.scope("app", "a").append("y", [2])
        b.scope("app", "a").delete("x")
    kv.clear()
    p = past(db, seq).scope("app", "a")
    assert p.get("x") == 1 and p.get("y") == [1]
    assert [r.op for r in kv.history("x")] == ["delete", "put", "put"]


def test_with_history_off_nothing_is_kept(db):
    """history_retention 0: writes keep nothing (history lists the changes of the head
    only), and replaced lists' items go at once."""
    db.set_setting("history_retention", 0)
    kv = db.scope("app", "a")
    kv.put("x", 1)
    kv.put("x", 2)
    with pytest.raises(CursorExpired):
        db.as_of(db.last_change() - 1).__enter__()


def _purged(db, writes: int = 40) -> None:
    """Enough writes for the bounded purge to run several times (every few writes)."""
    for i in range(writes):
        db.scope("app", "churn").put("n", i)


def test_history_older_than_its_retention_is_purged_a_little_per_write(db):
    """history_retention seconds after a value stopped being current, the purge (bounded,
    as writes happen) drops it: as_of before then is CursorExpired; a replaced list's items
    go with it, while a fork made from the list still reads them."""
    from .conftest import RawSQL

    db.set_setting("history_retention", 1)
    kv = db.scope("session", "s")
    kv.put("x", "old")
    kv.append("l", list(range(50)))
    s = db.sessions.create(ALICE)
    db.sessions.state(s.id, ALICE).append("h", list(range(30)))
    old = db.last_change()
    fork = db.sessions.fork(s.id, ALICE)
    kv.put("x", "new")
    kv.put("l", "not a list")
    db.sessions.state(s.id, ALICE).pop("h", 30)
    db.sessions.delete(s.id, ALICE)
    assert past(db, old).scope("session", "s").get("l") == list(range(50))
    time.sleep(1.2)
    _purged(db)
    with pytest.raises(CursorExpired):
        db.as_of(old).__enter__()
    assert db.sessions.state(fork.id, ALICE).get("h") == list(range(30))
    with RawSQL(db) as sql:
        items = sql.execute("SELECT (SELECT count(*) FROM list_item) + "
                            "(SELECT count(*) FROM list_gone)")[0][0]
        assert items == 30  # what the fork reads (popped from its base): the replaced 50 went
        assert sql.execute("SELECT count(*) FROM kv_history")[0][0] < 40
    db.sessions.delete(fork.id, ALICE)
    time.sleep(1.2)
    _purged(db)
    with RawSQL(db) as sql:
        assert sql.execute("SELECT count(*) FROM list_item")[0][0] == 0
        assert sql.execute("SELECT count(*) FROM list_gone")[0][0] == 0
    assert db.check() == []


def test_a_fork_shortened_then_its_base_popped_then_the_fork_appended(db):
    """A pop of the base copies only what a list made from it still reads: not past the
    end the fork was popped to, where the fork's next append writes its own items."""
    s = db.sessions.create(ALICE)
    st = db.sessions.state(s.id, ALICE)
    st.append("h", ["a", "b", "c", "d"])
    f = db.sessions.fork(s.id, ALICE)
    fs = db.sessions.state(f.id, ALICE)
    assert fs.pop("h", 2) == ["c", "d"]
    assert st.pop("h", 3) == ["b", "c", "d"]
    assert fs.append("h", ["x", "y"]).length == 4
    assert fs.get("h") == ["a", "b", "x", "y"] and st.get("h") == ["a"]
    assert db.check() == []
