"""Scoped key-value state: versions, CAS, delete, update, append, slice, list (SPEC §2)."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate import NotAList, VersionConflict

from . import workers
from .conftest import digest, target


@pytest.fixture
def db(any_db):
    """Every test here runs on both backends: an SQLite file and a PostgreSQL schema."""
    return any_db


def test_versions_rise_on_every_write(db):
    s = db.scope("session", "s1")
    assert s.get_versioned("k") == (None, 0)
    assert s.put("k", 1) == 1
    assert s.put("k", 2) == 2
    assert s.get_versioned("k") == agentstate.Versioned(2, 2)
    assert s.append("l", [1]) == agentstate.Appended(1, 1)
    assert s.append("l", [2, 3]) == (3, 2)


def test_stale_if_version_after_delete_and_recreate_is_refused(db):
    """Versions are never reused, so a version read before a delete never matches again."""
    s = db.scope("session", "s1")
    s.put("k", "a")
    stale = s.get_versioned("k").version
    assert s.delete("k") is True
    assert s.put("k", "b") > stale
    before = digest(db)
    with pytest.raises(VersionConflict) as e:
        s.put("k", "c", if_version=stale)
    assert e.value.current_version == s.get_versioned("k").version
    with pytest.raises(VersionConflict):
        s.delete("k", if_version=stale)
    assert digest(db) == before
    assert s.get("k") == "b"


def test_if_version_zero_means_only_if_absent(db):
    s = db.scope("user", "u")
    assert s.put("k", 1, if_version=0) == 1
    with pytest.raises(VersionConflict) as e:
        s.put("k", 2, if_version=0)
    assert e.value.current_version == 1
    assert s.get("k") == 1
    assert e.value.code == "version_conflict" and e.value.status == 409


def test_cas_on_absent_key_reports_version_zero(db):
    s = db.scope("user", "u")
    with pytest.raises(VersionConflict) as e:
        s.put("nope", 1, if_version=3)
    assert e.value.current_version == 0
    assert s.delete("nope", if_version=0) is False
    assert s.delete("nope") is False


def test_delete_with_matching_version(db):
    s = db.scope("user", "u")
    v = s.put("k", 1)
    assert s.delete("k", if_version=v) is True
    assert s.get("k", "gone") == "gone"


def test_bad_if_version_is_invalid_value(db):
    s = db.scope("user", "u")
    for bad in (-1, 1.0, "1", True):
        with pytest.raises(agentstate.InvalidValue):
            s.put("k", 1, if_version=bad)


def test_scopes_never_see_each_other(db):
    """The same key in different kinds or ids holds different values."""
    pairs = [("session", "x"), ("agent", "x"), ("user", "x"), ("session", "y"), ("app", "x:y")]
    for i, (kind, sid) in enumerate(pairs):
        db.scope(kind, sid).put("k", i)
        db.scope(kind, sid).append("l", [i])
    for i, (kind, sid) in enumerate(pairs):
        assert db.scope(kind, sid).get("k") == i
        assert db.scope(kind, sid).slice("l") == [i]
        assert db.scope(kind, sid).list() == ["k", "l"]


def test_get_default_and_falsy_values(db):
    s = db.scope("app", "a")
    assert s.get("x", 42) == 42
    for v in (0, "", [], {}, False, None):
        s.put("x", v)
        assert s.get("x", 42) == v


def test_update_passes_stored_falsy_values_not_default(db):
    """update() calls fn with the stored 0, "" or [] as is; default only when absent."""
    s = db.scope("app", "a")
    seen = []
    assert s.update("n", lambda v: seen.append(v) or 5, default="D") == 5
    for stored in (0, "", []):
        s.put("n", stored)
        s.update("n", lambda v: seen.append(v) or v)
    assert seen == ["D", 0, "", []]


def test_update_exception_writes_nothing(db):
    s = db.scope("app", "a")
    s.put("n", 1)
    before = digest(db)

    def boom(v):
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        s.update("n", boom)
    with pytest.raises(agentstate.InvalidValue):
        s.update("n", lambda v: float("nan"))
    assert digest(db) == before
    assert s.get_versioned("n") == (1, 1)


def increment_from_threads(s, threads: int, each: int) -> int:
    """``threads`` threads each ``update`` the key "n" ``each`` times; how often the
    update function ran."""
    calls, errors = [], []

    def inc(n):
        calls.append(1)
        return n + 1

    def work():
        try:
            for _ in range(each):
                s.update("n", inc, default=0)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert errors == []
    return len(calls)


def test_update_from_threads_loses_nothing(db):
    """One Database shared by 8 threads: 8 x 100 increments end at 800, and each
    update's function ran at most twice (update()'s docstring: once more after a lost race)."""
    s = db.scope("agent", "a")
    calls = increment_from_threads(s, 8, 100)
    assert s.get_versioned("n") == (800, 800)
    assert 800 <= calls <= 1600


def test_append_slice_length(db):
    s = db.scope("session", "s")
    assert s.slice("h") == [] and s.length("h") == 0
    s.append("h", [0, 1, 2])
    s.append("h", [])
    s.append("h", [3, 4])
    full = [0, 1, 2, 3, 4]
    assert s.get("h") == full
    for start in range(-7, 8):
        for stop in [None, *range(-7, 8)]:
            assert s.slice("h", start, stop) == full[start:stop], (start, stop)


def test_append_on_empty_list_and_absent_key(db):
    s = db.scope("session", "s")
    assert s.append("e", []) == (0, 1)
    assert s.get("e") == []
    assert s.append("e", ["a"]) == (1, 2)


def test_put_replaces_a_list_and_its_items(db):
    """With history off, a replaced list's items go at once (kept for the past otherwise:
    test_history.py)."""
    db.set_setting("history_retention", 0)
    s = db.scope("session", "s")
    s.append("h", [1, 2, 3])
    s.put("h", ["x"])
    assert s.slice("h") == ["x"] and s.length("h") == 1
    s.put("h", {"not": "a list"})
    assert db._store.query("SELECT count(*) FROM list_item")[0][0] == 0
    with pytest.raises(NotAList):
        s.append("h", [1])
    with pytest.raises(NotAList):
        s.slice("h")
    with pytest.raises(NotAList):
        s.length("h")
    s.put_bytes("b", b"[1]")
    with pytest.raises(NotAList):
        s.append("b", [2])
    assert s.get_bytes("b") == b"[1]"


def test_delete_removes_list_items(db):
    db.set_setting("history_retention", 0)  # else kept for the past (test_history.py)
    s = db.scope("session", "s")
    s.append("h", list(range(10)))
    assert s.delete("h")
    assert db._store.query("SELECT count(*) FROM list_item")[0][0] == 0
    assert s.append("h", [1]) == (1, 3)


def test_append_is_flat_in_storage(db):
    """An append writes only the new items: earlier item rows are untouched."""
    s = db.scope("session", "s")
    s.append("h", list(range(1000)))
    before = db._store.query("SELECT count(*), max(idx) FROM list_item")[0]
    s.append("h", [1000])
    after = db._store.query("SELECT count(*), max(idx) FROM list_item")[0]
    assert before == (1000, 999) and after == (1001, 1000)
    assert s.slice("h", -2) == [999, 1000]


def test_list_keys_paging_and_limit(db):
    s = db.scope("app", "a")
    for k in ["a", "a.b", "a_c", "ab", "b", "b:1"]:
        s.put(k, 1)
    assert s.list() == ["a", "a.b", "a_c", "ab", "b", "b:1"]
    assert s.list("a") == ["a", "a.b", "a_c", "ab"]
    assert s.list("a_") == ["a_c"]
    assert s.list("a", after="a.b") == ["a_c", "ab"]
    assert s.list("a", limit=2) == ["a", "a.b"]
    assert s.list(after="ab", limit=1) == ["b"]
    assert s.list("b", after="a") == ["b", "b:1"]
    for impossible in ["%", "*", "a b", "é", "x" * 201]:
        assert s.list(impossible) == []


@settings(max_examples=80)
@given(
    keys=st.sets(st.text("_%*.:-ab", min_size=1, max_size=6), max_size=30),
    prefix=st.text("_%*.:-", max_size=3),
)
def test_list_prefix_is_literal(db, keys, prefix):
    """list(prefix) returns exactly the keys starting with prefix; _ % * match only themselves."""
    s = db.scope("thread", "p")
    valid = {k for k in keys if "%" not in k and "*" not in k}
    for k in s.list():
        s.delete(k)
    for k in valid:
        s.put(k, 0)
    assert s.list(prefix) == sorted(k for k in valid if k.startswith(prefix))


def test_transaction_groups_writes_across_scopes(db):
    a, b = db.scope("session", "s"), db.scope("agent", "x")
    with db.transaction():
        a.put("k", 1)
        b.append("l", [1])
        b.update("n", lambda n: n + 1, default=0)
    assert (a.get("k"), b.get("l"), b.get("n")) == (1, [1], 1)
    before = digest(db)
    with pytest.raises(KeyError):
        with db.transaction():
            a.put("k", 2)
            b.append("l", [2])
            a.delete("k")
            raise KeyError("abort")
    assert digest(db) == before
    assert (a.get("k"), b.get("l")) == (1, [1])


def test_refused_call_inside_transaction_keeps_earlier_writes(db):
    """A call refused inside a block undoes only itself; the block goes on."""
    s = db.scope("session", "s")
    with db.transaction():
        s.put("a", 1)
        with pytest.raises(VersionConflict):
            s.put("b", 1, if_version=5)
        s.put("c", 1)
    assert s.list() == ["a", "c"]


def test_nested_transactions(db):
    s = db.scope("session", "s")
    with db.transaction():
        s.put("a", 1)
        with pytest.raises(ValueError):
            with db.transaction():
                s.put("b", 1)
                raise ValueError
        s.put("c", 1)
    assert s.list() == ["a", "c"]


def test_state_bundle(db):
    st = db.state(session="s-42", agent="support-bot", user="u-7", thread="t-1")
    st.session.append("history", [{"role": "user"}])
    st.agent.update("visits", lambda n: n + 1, default=0)
    assert db.scope("session", "s-42").get("history") == [{"role": "user"}]
    assert db.scope("agent", "support-bot").get("visits") == 1
    only = db.state(session="s")
    with pytest.raises(AttributeError):
        _ = only.agent
    with pytest.raises(agentstate.InvalidKey):
        db.state(galaxy="g")


def test_bytes_values(db):
    s = db.scope("thread", "t")
    assert s.get_bytes("b") is None
    v = s.put_bytes("b", b"\x00\xff")
    assert s.get_bytes("b") == b"\x00\xff"
    assert s.put_bytes("b", bytearray(b"x"), if_version=v) == v + 1
    s.put("j", {"a": "é"})
    assert s.get_bytes("j") == '{"a":"é"}'.encode()
    s.append("l", [1, "x"])
    assert s.get_bytes("l") == b'[1,"x"]'
    with pytest.raises(agentstate.InvalidValue):
        s.put_bytes("b", "text")


def test_lists_never_share_items(db):
    """Every list gets its own list_id, empty or deleted ones included."""
    s = db.scope("app", "a")
    s.append("e1", [])
    s.append("e2", [])
    s.put("p", [])
    s.append("x", [1])
    s.delete("x")
    s.append("x2", [2])
    for k in ("e1", "e2", "p"):
        s.append(k, [k])
    assert [s.get(k) for k in ("e1", "e2", "p", "x2")] == [["e1"], ["e2"], ["p"], [2]]
    assert db.check() == []


def _read_modify_write(target: str, n: int, start, results) -> None:
    """n blocks of get-then-put on one key, and n update() calls counting fn's runs."""
    with agentstate.open(target, busy_timeout=30) as db:
        kv = db.scope("app", "rmw")
        start.wait()
        most = 0
        for _ in range(n):
            with db.transaction():
                kv.put("blocks", kv.get("blocks") + 1)
            runs = []
            kv.update("updates", lambda v: runs.append(v) or v + 1)
            most = max(most, len(runs))
        results.put(most)


def test_read_modify_write_in_transactions_from_processes_loses_nothing(db):
    """4 processes x 30 blocks that read a key and write it back, and 30 update() calls each:
    no increment is lost, and update()'s fn runs at most twice per call (the retry holds
    the key: SQLite's write lock, or on PostgreSQL the row it read)."""
    kv = db.scope("app", "rmw")
    kv.put("blocks", 0)
    kv.put("updates", 0)
    most = workers.race(_read_modify_write, lambda w: (target(db), 30))
    assert kv.get("blocks") == 120 and kv.get("updates") == 120
    assert max(most) <= 2
