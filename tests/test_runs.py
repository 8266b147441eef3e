"""Runs: history entries and snapshots (SPEC §3)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from datetime import timezone

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, rule,
                                 run_state_machine_as_test)

import agentstate
from agentstate import HistoryGap, InvalidValue, RunExists, RunNotFound, SavedState, TooLarge

from . import workers
from .conftest import RawSQL, digest, on_postgres, target


@pytest.fixture
def db(any_db):
    """Every test here runs on both backends: an SQLite file and a PostgreSQL schema
    (tests of SQLite's own machinery use ``file_db``)."""
    return any_db


@pytest.fixture
def file_db(db_path):
    d = agentstate.open(db_path)
    yield d
    d.close()


def E(seq, **kw):
    return {"seq": seq, **kw}


def test_write_read_entries_tail(db):
    r = db.runs
    r.write("r1", [E(0, type="user"), E(1, type="assistant")], {"task": "t"}, create=True)
    r.write("r1", [E(2)], None)
    rec = r.read("r1")
    assert rec == agentstate.Record([E(0, type="user"), E(1, type="assistant"), E(2)], {"task": "t"})
    assert r.entries("r1", since=1) == [E(1, type="assistant"), E(2)]
    assert r.entries("r1", since=1, limit=1) == [E(1, type="assistant")]
    assert r.tail("r1", 2) == [E(1, type="assistant"), E(2)]
    assert r.tail("r1", 10) == rec.entries
    assert r.tail("r1", 0) == []
    assert r.read("nope") is None
    assert r.entries("nope") == [] and r.tail("nope", 3) == []


def test_snapshot_replaced_or_kept(db):
    r = db.runs
    r.write("r", [], None, create=True)
    assert r.read("r") == ([], None)
    r.write("r", [], {"a": 1})
    r.write("r", [E(0)], None)
    assert r.read("r").snapshot == {"a": 1}
    r.write("r", [], {"b": 2})
    assert r.read("r").snapshot == {"b": 2}


def test_resent_entries_are_skipped(db):
    """The idempotent retry of a crashed writer: stored seqs are skipped, the rest continue."""
    r = db.runs
    r.write("r", [E(0, v="a"), E(1, v="b")], None, create=True)
    r.write("r", [E(0, v="a"), E(1, v="b")], None)
    r.write("r", [E(1, v="b"), E(2, v="c")], None)
    assert [e["v"] for e in r.read("r").entries] == ["a", "b", "c"]


def test_a_different_entry_at_a_stored_seq_is_refused(db):
    """A racing writer that lost hears so (HistoryGap) instead of being silently skipped."""
    r = db.runs
    r.write("r", [E(0, v="a")], None, create=True)
    before = digest(db)
    with pytest.raises(HistoryGap, match="different entry"):
        r.write("r", [E(0, v="other"), E(1, v="b")], {"s": 1})
    assert digest(db) == before
    r.write("r", [{"v": "a", "seq": 0}, E(1, v="b")], None)  # same entry, other key order
    assert len(r.read("r").entries) == 2


@pytest.mark.parametrize("bad", [
    lambda r: r.write("r", [E(0)], {"s": 1}, create=True),               # exists
    lambda r: r.write("r", [E(2), E(4)], {"s": 1}),                     # gap after stored
    lambda r: r.write("r", [E(3)], {"s": 1}),                           # gap
    lambda r: r.write("r", [E(2), E(2)], {"s": 1}),                     # duplicate in batch
    lambda r: r.write("r", [E(2, x=float("nan"))], {"s": 1}),           # invalid entry
    lambda r: r.write("r", [E(2), {"no": "seq"}], {"s": 1}),            # no seq
    lambda r: r.write("r", [E(2)], ["not", "a", "dict"]),               # snapshot not a dict
    lambda r: r.write("r", [E(2)], {"big": "x" * (16 * 1024 * 1024)}),  # oversized snapshot
    lambda r: r.write("r", [E(2, big="x" * (16 * 1024 * 1024))], None), # oversized entry
    lambda r: r.write("missing", [E(0)], None),                         # not found
    lambda r: r.write("bad id", [E(0)], None, create=True),             # invalid id
])
def test_refused_writes_write_nothing(db, bad):
    r = db.runs
    r.write("r", [E(0), E(1)], {"s": 0}, create=True)
    before = digest(db)
    with pytest.raises(agentstate.AgentStateError):
        bad(r)
    assert digest(db) == before
    assert r.read("r") == ([E(0), E(1)], {"s": 0})


def test_check_order_validation_then_existence_then_gap(db):
    r = db.runs
    r.write("r", [E(0)], None, create=True)
    with pytest.raises(InvalidValue):
        r.write("r", [E(5, x=float("inf"))], None, create=True)
    with pytest.raises(RunExists):
        r.write("r", [E(5)], None, create=True)
    with pytest.raises(RunNotFound):
        r.write("nope", [E(5)], None)
    with pytest.raises(HistoryGap):
        r.write("new", [E(1)], None, create=True)
    with pytest.raises(TooLarge):
        r.write("nope", [E(0, big="x" * (16 * 1024 * 1024))], None)
    assert issubclass(HistoryGap, ValueError) and issubclass(RunNotFound, LookupError)


def test_database_refuses_gaps_and_duplicates_from_raw_sql(db):
    """Contiguity is the database's own rule, for any writer (the sqlite3 shell or psql too)."""
    db.runs.write("r", [E(0)], None, create=True)
    with RawSQL(db) as c:
        with pytest.raises(c.refused):
            c.execute("INSERT INTO run_entry (run_id, seq, entry) VALUES ('r', 5, '{\"seq\":5}')")
        with pytest.raises(c.refused):
            c.execute("INSERT INTO run_entry (run_id, seq, entry) VALUES ('r', 0, '{\"seq\":0}')")
    assert db.runs.read("r").entries == [E(0)]
    assert db.check() == []


def test_racing_writers_cannot_make_gaps_or_duplicates(db):
    """4 processes race to append to one run: seqs stay 0..n-1, each win stored once."""
    db.runs.write("shared", [], None, create=True)
    out = workers.race(workers.history_writer, lambda w: (target(db), w, 40))
    assert all(other == 0 for _, _, other in out)
    entries = db.runs.read("shared").entries
    assert [e["seq"] for e in entries] == list(range(160))
    for w in range(4):
        assert [e["k"] for e in entries if e["who"] == w] == list(range(40))


def test_head_is_the_run_without_its_history(db):
    assert db.runs.head("nope") is None
    db.runs.write("h", [{"seq": i, "type": "x"} for i in range(5)], {"task": "t", "turn": 3},
                  create=True)
    db.runs.trim("h", before=2)
    h = db.runs.head("h")
    assert (h.id, h.snapshot, h.first_seq, h.next_seq, h.format) == ("h", {"task": "t", "turn": 3}, 2, 5, 1)
    assert h.summary == next(r for r in db.runs.list() if r.id == "h")
    assert h.created_at <= h.updated_at and h.updated_at.tzinfo is not None
    with pytest.raises(agentstate.InvalidKey):
        db.runs.head("bad id")


def test_list_is_paged(db):
    for i in range(7):
        db.runs.write(f"r{i}", [], {"task": f"t{i}"}, create=True)
    everything = [r.id for r in db.runs.list()]
    assert sorted(everything) == [f"r{i}" for i in range(7)] and everything[0] == "r6"
    got, after = [], None
    while True:
        page = [r.id for r in db.runs.list(after=after, limit=3)]
        got.append(page)
        if len(page) < 3:
            break
        after = page[-1]
    assert [len(p) for p in got] == [3, 3, 1] and sum(got, []) == everything
    assert db.runs.list(limit=0) == []
    with pytest.raises(agentstate.RunNotFound):
        db.runs.list(after="no-such-run")
    with pytest.raises(agentstate.InvalidValue):
        db.runs.list(limit=-1)


def test_list_newest_first_with_snapshot_fields(db):
    r = db.runs
    r.write("a", [], {"task": "first", "turn": 3, "stopped_by": "user", "finished": True}, create=True)
    r.write("b", [E(0)], {"task": 7, "turn": "x"}, create=True)
    r.write("c", [], None, create=True)
    r.write("a", [E(0)], None)
    got = r.list()
    assert [s.id for s in got] == ["a", "c", "b"]
    a = got[0]
    assert (a.task, a.turn, a.stopped_by, a.finished) == ("first", 3, "user", True)
    b = got[2]
    assert (b.task, b.turn, b.stopped_by, b.finished) == ("", 0, None, False)
    for s in got:
        assert s.created_at.tzinfo is timezone.utc and s.updated_at >= s.created_at
    assert a.updated_at > a.created_at


def test_saved_state_from_snapshot_without_a_database():
    s = SavedState.from_snapshot("r", {"task": "t", "turn": 2, "finished": True})
    assert (s.id, s.task, s.turn, s.stopped_by, s.finished) == ("r", "t", 2, None, True)
    assert SavedState.from_snapshot("r", None) == SavedState("r")


def test_load_marks_interrupted_tool_calls(db):
    r = db.runs
    r.write("r", [
        E(0, type="tool_call", call_id="a"),
        E(1, type="tool_result", call_id="a"),
        E(2, type="tool_call", call_id="b"),
        E(3, type="tool_call", call_id="c"),
        E(4, type="tool_result", call_id="c"),
        E(5, type="tool_result", call_id="d"),
        E(6, type="tool_call", call_id="d"),
    ], {"turn": 1}, create=True)
    rec = r.load("r")
    assert rec.entries[:7] == r.read("r").entries
    extra = rec.entries[7:]
    assert [(e["type"], e["call_id"], e["status"]) for e in extra] == [
        ("tool_result", "b", "unknown"), ("tool_result", "d", "unknown")]
    assert set(extra[0]) == {"type", "call_id", "status", "content"}
    assert "may or may not" in extra[0]["content"]
    assert len(r.read("r").entries) == 7  # not saved
    with pytest.raises(RunNotFound):
        r.load("nope")


NOT_JSON = ("UPDATE run_entry SET entry = 'not json' WHERE seq = 1",
            "UPDATE run SET snapshot = '{bad'")


@pytest.mark.parametrize("damage", [
    "DELETE FROM run_entry WHERE seq = 1",
    *NOT_JSON,
    "UPDATE run_entry SET entry = '{\"seq\":7}' WHERE seq = 1",
    "UPDATE run_entry SET entry = '[1]' WHERE seq = 1",
    "UPDATE run SET next_seq = 9",
    "UPDATE run SET snapshot = '[1,2]'",
])
def test_load_refuses_a_damaged_run(db, damage):
    """Damage made by hand is found by load(); on PostgreSQL a json column refuses non-JSON."""
    db.runs.write("r", [E(0), E(1), E(2)], {"a": 1}, create=True)
    with RawSQL(db) as c:
        if on_postgres(db) and damage in NOT_JSON:
            import psycopg

            with pytest.raises(psycopg.errors.InvalidTextRepresentation):
                c.execute(damage)
            return
        c.execute(damage)
    with pytest.raises(agentstate.Damaged):
        db.runs.load("r")


def test_load_refuses_a_newer_run_format(db):
    db.runs.write("r", [E(0)], None, create=True)
    with RawSQL(db) as c:
        c.execute("UPDATE run SET format = 99")
    with pytest.raises(agentstate.SchemaTooNew):
        db.runs.load("r")


def test_fork(db):
    r = db.runs
    r.write("r", [E(0), E(1), E(2)], {"s": 1}, create=True)
    r.fork("r", "f1", upto=1)
    r.fork("r", "f2")
    assert r.read("f1") == ([E(0), E(1)], {"s": 1})
    assert r.read("f2") == r.read("r")
    r.write("f1", [E(2, other=True)], None)
    assert r.read("r").entries[2] == E(2)
    with pytest.raises(RunExists):
        r.fork("r", "f1")
    with pytest.raises(RunNotFound):
        r.fork("nope", "f3")
    assert r.read("f3") is None


def test_delete(db):
    r = db.runs
    r.write("r", [E(0)], {"s": 1}, create=True)
    r.delete("r")
    r.delete("r")
    assert r.read("r") is None and r.list() == []
    assert db._store.query("SELECT count(*) FROM run_entry")[0][0] == 0
    r.write("r", [E(0, again=True)], None, create=True)
    assert r.read("r").entries == [E(0, again=True)]


def vm_steps(db, fn) -> int:
    """SQLite virtual-machine instructions that fn runs: a cost measure free of timing noise."""
    c = db._store.conn()
    steps = [0]

    def tick():
        steps[0] += 1
        return False

    c.set_progress_handler(tick, 10)
    try:
        fn()
    finally:
        c.set_progress_handler(None)
    return steps[0]


def test_write_entries_and_tail_cost_does_not_grow_with_history(file_db):
    """One write, entries(since=...) and tail(n) run the same work at 100 and 100,000 entries.

    SQLite's instruction counter (test_postgres.py counts the server's buffer reads)."""
    db = file_db
    r = db.runs
    costs = {}
    for n in (100, 100_000):
        run = f"r{n}"
        r.write(run, [E(i) for i in range(n)], {"s": 1}, create=True)
        costs[n] = (
            vm_steps(db, lambda: r.write(run, [E(n)], {"s": 2})),
            vm_steps(db, lambda: r.entries(run, since=n - 19)),
            vm_steps(db, lambda: r.tail(run, 20)),
        )
    for small, big in zip(costs[100], costs[100_000]):
        assert big <= small * 1.5 + 5, costs


def test_list_does_not_read_histories(file_db):
    db = file_db
    r = db.runs
    for i in range(20):
        r.write(f"short{i}", [E(0)], {"task": "x"}, create=True)
    short = vm_steps(db, r.list)
    for i in range(20):
        r.write(f"short{i}", [E(j) for j in range(1, 500)], None)
    assert vm_steps(db, r.list) <= short * 1.2 + 5


def test_async_methods_do_not_block_the_event_loop(db):
    r = db.runs
    big = [E(i, text="x" * 200) for i in range(60_000)]

    async def main():
        ticks = 0
        done = False

        async def ticker():
            nonlocal ticks
            while not done:
                ticks += 1
                await asyncio.sleep(0.001)

        t = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        await r.awrite("big", big, {"s": 1}, create=True)
        during = ticks
        done = True
        await t
        assert during >= 5, during
        assert len(await r.aentries("big", since=59_990)) == 10
        assert (await r.atail("big", 1))[0]["seq"] == 59_999
        assert [s.id for s in await r.alist()] == ["big"]
        assert (await r.aread("big")).snapshot == {"s": 1}
        assert len((await r.aload("big")).entries) == 60_000
        await r.afork("big", "copy", upto=0)
        await r.adelete("big")
        assert await r.aread("big") is None

    asyncio.run(main())


def test_export_and_import_folder_layout(db, tmp_path):
    r = db.runs
    r.write("r1", [E(0, t="é"), E(1)], {"task": "x"}, create=True)
    r.write("r2", [], None, create=True)
    out = tmp_path / "out"
    r.export("r1", out)
    r.export("r2", out)
    for f in ("log.jsonl", "snapshot.json"):
        assert stat.S_IMODE(os.stat(out / "r1" / f).st_mode) == 0o600
    lines = (out / "r1" / "log.jsonl").read_text().splitlines()
    assert [json.loads(x) for x in lines] == [E(0, t="é"), E(1)]
    assert json.loads((out / "r1" / "snapshot.json").read_text()) == {"task": "x"}
    with pytest.raises(RunNotFound):
        r.export("nope", out)
    r.delete("r1")
    r.delete("r2")
    first = r.import_runs(out)
    assert [(x.run_id, x.added, x.error) for x in first] == [("r1", 2, None), ("r2", 0, None)]
    again = r.import_runs(out)
    assert [(x.run_id, x.added, x.error) for x in again] == [("r1", 0, None), ("r2", 0, None)]
    assert r.read("r1") == ([E(0, t="é"), E(1)], {"task": "x"})


def test_import_reports_malformed_line_and_writes_nothing_of_that_run(db, tmp_path):
    good, bad = tmp_path / "in" / "good", tmp_path / "in" / "bad"
    good.mkdir(parents=True)
    bad.mkdir()
    (good / "log.jsonl").write_text('{"seq":0}\n')
    (bad / "log.jsonl").write_text('{"seq":0}\n{"seq":1}\n{"seq": 2,\n')
    (bad / "snapshot.json").write_text('{"s":1}')
    res = {x.run_id: x for x in db.runs.import_runs(tmp_path / "in")}
    assert res["good"].error is None and res["good"].added == 1
    assert res["bad"].error.startswith(f"{bad / 'log.jsonl'}:3:")
    assert db.runs.read("bad") is None
    (bad / "log.jsonl").write_text('{"seq":0}\n{"seq":2}\n')
    res = {x.run_id: x for x in db.runs.import_runs(tmp_path / "in")}
    assert "history_gap" in res["bad"].error and db.runs.read("bad") is None


class RunModel(RuleBasedStateMachine):
    """Random creates, writes with overlapping re-sends and gaps, deletes and forks vs a model."""

    store: agentstate.Database  # the store under test (set by test_run_model)
    target = ""  # what reopen() opens again: the same store

    @initialize()
    def setup(self):
        self.db = self.store
        for run in ("a", "b", "c"):  # each example starts from no runs
            self.db.runs.delete(run)
        self.model: dict[str, tuple[list, dict | None]] = {}

    ids = st.sampled_from(["a", "b", "c"])

    @rule(run=ids, start=st.integers(0, 8), count=st.integers(0, 4),
          snap=st.none() | st.fixed_dictionaries({"n": st.integers(0, 9)}), create=st.booleans())
    def write(self, run, start, count, snap, create):
        entries = [E(s, v=s * 10) for s in range(start, start + count)]
        exists = run in self.model
        if create and exists:
            expect = RunExists
        elif not create and not exists:
            expect = RunNotFound
        else:
            have = len(self.model[run][0]) if exists else 0
            new = [e for e in entries if e["seq"] >= have]
            expect = HistoryGap if new and new[0]["seq"] != have else None
        if expect:
            with pytest.raises(expect):
                self.db.runs.write(run, entries, snap, create=create)
            return
        self.db.runs.write(run, entries, snap, create=create)
        old_entries, old_snap = self.model.get(run, ([], None))
        have = len(old_entries)
        self.model[run] = (old_entries + [e for e in entries if e["seq"] >= have],
                           snap if snap is not None else old_snap)

    @rule(run=ids)
    def delete(self, run):
        self.db.runs.delete(run)
        self.model.pop(run, None)

    @rule(src=ids, dst=ids, upto=st.none() | st.integers(0, 6))
    def fork(self, src, dst, upto):
        if src not in self.model:
            with pytest.raises(RunNotFound):
                self.db.runs.fork(src, dst, upto=upto)
        elif dst in self.model:
            with pytest.raises(RunExists):
                self.db.runs.fork(src, dst, upto=upto)
        else:
            self.db.runs.fork(src, dst, upto=upto)
            entries, snap = self.model[src]
            self.model[dst] = ([e for e in entries if upto is None or e["seq"] <= upto], snap)

    @rule()
    def reopen(self):
        if self.db is not self.store:
            self.db.close()
        self.db = agentstate.open(self.target)

    @invariant()
    def matches(self):
        if not hasattr(self, "db"):
            return
        for run in ["a", "b", "c"]:
            want = self.model.get(run)
            got = self.db.runs.read(run)
            assert (got is None) == (want is None)
            if want:
                assert got.entries == want[0] and got.snapshot == want[1]
                assert self.db.runs.load(run).entries == want[0]
        assert sorted(s.id for s in self.db.runs.list()) == sorted(self.model)

    def teardown(self):
        if hasattr(self, "db") and self.db is not self.store:
            self.db.close()


@pytest.mark.slow_on_postgres  # PostgreSQL's case in CI's -m slow (seconds)
def test_run_model(db):
    machine = type("RunModelHere", (RunModel,), {"store": db, "target": target(db)})
    run_state_machine_as_test(machine, settings=settings(max_examples=40, stateful_step_count=25,
                                                         deadline=None))
