"""Reads in one call (SPEC 0.3): snapshot(), get_many, items, clear, raw entries, pinned runs."""

from __future__ import annotations

import threading

import pytest

import agentstate
from agentstate import InvalidKey, InvalidValue, RunNotFound, UsageError, Versioned

from .conftest import digest


@pytest.fixture
def db(any_db):
    """SQLite and PostgreSQL (tests/test_remote.py runs these through connect() too)."""
    return any_db


def test_get_many_reads_several_keys_at_once(db):
    """get_many: every key asked for, in the order asked, absent ones as (None, 0); values
    of every kind (JSON, lists, bytes holding JSON) as get_versioned gives them."""
    kv = db.scope("session", "s")
    kv.put("a", {"x": 1})
    kv.append("l", [1, "two"])
    kv.put("a", {"x": 2})
    kv.put_bytes("b", b'{"raw": true}')
    got = kv.get_many(["l", "nope", "a", "b", "a"])
    assert list(got) == ["l", "nope", "a", "b"]
    assert got == {"l": Versioned([1, "two"], 1), "nope": Versioned(None, 0),
                   "a": Versioned({"x": 2}, 2), "b": Versioned({"raw": True}, 1)}
    assert got["a"] == kv.get_versioned("a") and kv.get_many([]) == {}
    assert db.scope("session", "other").get_many(["a"]) == {"a": Versioned(None, 0)}


def test_get_many_refuses_bad_input(db):
    """A bad key, a string for the list, more than 1,000 keys: refused before any read."""
    kv = db.scope("app", "a")
    with pytest.raises(InvalidKey):
        kv.get_many(["ok", "bad key"])
    with pytest.raises(InvalidValue):
        kv.get_many("abc")
    with pytest.raises(InvalidValue):
        kv.get_many([f"k{i}" for i in range(1001)])


def test_items_pages_keys_with_their_values(db):
    """items: the keys of list() (literal prefix, after, limit) each with its value."""
    kv = db.scope("agent", "bot")
    for k in ("a_1", "a.2", "ab", "b"):
        kv.put(k, k.upper())
    assert kv.items() == [(k, Versioned(k.upper(), 1)) for k in ("a.2", "a_1", "ab", "b")]
    assert [k for k, _ in kv.items("a_")] == ["a_1"]
    assert kv.items("a", after="a.2", limit=1) == [("a_1", Versioned("A_1", 1))]
    assert kv.items("no such prefix!") == [] and kv.items(limit=0) == []
    assert [k for k, _ in kv.items()] == kv.list()


def test_items_gives_lists_with_their_items(db):
    """A page holding a list gives its items (on SQLite such a page is read a second way:
    kv.items reads a page without list items first)."""
    kv = db.scope("agent", "bot")
    kv.put("a", 1)
    kv.append("b", [1, {"x": "two"}])
    kv.append("b", [3])
    kv.put("c", [4])  # a JSON array, not a list
    assert kv.items() == [("a", Versioned(1, 1)), ("b", Versioned([1, {"x": "two"}, 3], 2)),
                          ("c", Versioned([4], 1))]
    assert kv.items(after="b") == [("c", Versioned([4], 1))]
    assert kv.items("b") == [("b", Versioned([1, {"x": "two"}, 3], 2))]


def test_a_list_written_between_a_page_and_its_items_reads_as_one_state(db_path):
    """SQLite reads a page without list items, then, as it holds a list, the page again
    whole: a list written in between (here by this thread, between the two statements)
    gives the version and the items of one state, never the old version's row with the
    new items."""
    from agentstate.backends.sqlite import kv as sqlite_kv

    with agentstate.open(db_path) as db:
        kv = db.scope("app", "a")
        kv.append("l", [1])
        kv.put("m", 2)
        conn, calls = db._store.conn(), []

        class Between:
            def execute(self, sql, args):
                calls.append(sql)
                if len(calls) == 2:
                    kv.append("l", [2])
                return conn.execute(sql, args)

        rows = sqlite_kv.items(Between(), "app", "a", "", None, None)
        assert len(calls) == 2
        assert [(r[0], r[3], r[4]) for r in rows] == [("l", 2, "1,2"), ("m", 1, None)]
        calls.clear()
        assert [(r[0], r[3], r[4]) for r in sqlite_kv.items(conn, "app", "a", "", None, None)] \
            == [("l", 2, "1,2"), ("m", 1, None)]


def test_clear_deletes_every_key_of_the_scope(db):
    """clear: every key of the scope in one transaction, a delete change each; versions
    continue above the cleared ones; other scopes keep theirs."""
    kv, other = db.scope("thread", "t"), db.scope("thread", "u")
    kv.put("a", 1)
    kv.put("a", 2)
    kv.append("l", [1, 2, 3])
    other.put("a", 1)
    head = db.last_change()
    assert kv.clear() == 2
    assert kv.list() == [] and other.get("a") == 1
    assert sorted((c.op, c.key, c.version) for c in db.changes(head)) == [
        ("delete", "a", 2), ("delete", "l", 1)]
    assert kv.put("a", 3) == 4  # never reused (a delete uses up a version, as delete() does)
    assert db.scope("thread", "empty").clear() == 0


def test_a_snapshot_sees_one_state(db):
    """Reads inside snapshot() see the state of its first read, whatever other threads
    commit meanwhile; after the block, the new state."""
    kv = db.scope("app", "a")
    kv.put("x", 1)
    kv.put("y", 1)
    with db.snapshot():
        assert kv.get("x") == 1
        t = threading.Thread(target=lambda: (kv.put("x", 2), kv.put("y", 2)))
        t.start()
        t.join(30)
        assert kv.get("y") == 1 and kv.get_many(["x", "y"])["x"].value == 1
        assert kv.items()[0][1].value == 1 and db.runs.list() == []
    assert (kv.get("x"), kv.get("y")) == (2, 2)


def test_writes_inside_a_snapshot_are_usage_errors(db):
    """A write in snapshot() is refused with UsageError and writes nothing."""
    kv = db.scope("app", "a")
    before = digest(db)
    with db.snapshot():
        for write in (lambda: kv.put("k", 1), lambda: kv.append("l", [1]), kv.clear,
                      lambda: db.runs.write("r", [], None, create=True)):
            with pytest.raises(UsageError):
                write()
    assert digest(db) == before


def test_raw_entries_are_the_stored_text(db):
    """entries(raw=True): each entry's stored JSON text, which decodes to entries()."""
    db.runs.write("r", [{"seq": 0, "text": "héllo", "n": 1.5}, {"seq": 1}], None, create=True)
    raw = db.runs.entries("r", raw=True)
    assert raw == ['{"seq":0,"text":"héllo","n":1.5}', '{"seq":1}']
    assert db.runs.entries("r", 1, raw=True) == ['{"seq":1}']
    with pytest.raises(InvalidValue):
        db.runs.entries("r", raw=1)


def test_a_pinned_run_survives_prune(db):
    """pin: prune() leaves a pinned run (until unpinned); head() and list() say so; delete
    and trim still act on it; a pin change in the feed; RunNotFound for no run."""
    for rid in ("keep", "go"):
        db.runs.write(rid, [{"seq": 0}, {"seq": 1}], {"finished": True}, create=True)
    head = db.last_change()
    assert db.runs.pin("keep") is True and db.runs.pin("keep") is True
    assert [(c.op, c.scope_id) for c in db.changes(head)] == [("pin", "keep")]
    assert db.runs.head("keep").pinned and not db.runs.head("go").pinned
    assert {r.id: r.pinned for r in db.runs.list()} == {"keep": True, "go": False}
    assert db.runs.prune(older_than=0, finished_only=False) == ["go"]
    assert db.runs.trim("keep", before=1) == 1
    assert db.runs.pin("keep", False) is False
    assert db.runs.prune(older_than=0, finished_only=False) == ["keep"]
    with pytest.raises(RunNotFound):
        db.runs.pin("nope")
    with pytest.raises(InvalidValue):
        db.runs.pin("go", pinned="yes")


def test_async_twins_of_the_new_reads(db):
    """aget_many, aitems, aclear and apin behave as their twins."""
    import asyncio

    kv = db.scope("user", "u")
    kv.put("a", 1)
    db.runs.write("r", [], None, create=True)

    async def main():
        assert await kv.aget_many(["a"]) == {"a": Versioned(1, 1)}
        assert await kv.aitems() == [("a", Versioned(1, 1))]
        assert await db.runs.apin("r") is True
        assert await kv.aclear() == 1

    asyncio.run(main())
    assert kv.list() == []


def test_check_holds_after_clear_and_pin(db):
    """The store's invariants hold after the new writes."""
    kv = db.scope("app", "a")
    kv.append("l", [1, 2])
    kv.put("k", 1)
    kv.clear()
    db.runs.write("r", [], None, create=True)
    db.runs.pin("r")
    assert db.check() == []


def test_remote_snapshot_is_a_usage_error(tmp_path):
    """snapshot() cannot span HTTP calls: UsageError on a remote client, nothing sent."""
    from agentstate.backends.remote import RemoteOps

    ops = RemoteOps("http://127.0.0.1:9", "t" * 40, 1.0)
    try:
        with pytest.raises(UsageError):
            with agentstate.Database(ops).snapshot():
                pass
    finally:
        ops.close()
