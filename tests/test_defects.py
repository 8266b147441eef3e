"""Regression tests for the defects of issue 10, one per item, named after what broke."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import apsw
import pytest
from click.testing import CliRunner

import agentstate
from agentstate.cli import cli

from .conftest import file_digest

ALICE = agentstate.Principal("alice")


def _agent_writes(path: str) -> None:
    """Another process opens the path and writes (its write is acknowledged)."""
    subprocess.run([sys.executable, "-c",
                    "import agentstate, sys; agentstate.open(sys.argv[1]).scope('app', 'agent')"
                    ".put('mine', 'acknowledged')", path], check=True)


def test_1_refused_command_never_deletes_a_file_another_process_wrote(tmp_path, monkeypatch):
    """A command refused after it created the file leaves the file, and another agent's writes."""
    path = str(tmp_path / "shared.db")
    real_put = agentstate.Scope.put

    def put_refused_after_an_agent_wrote(self, key, value, **kw):
        _agent_writes(path)  # an agent opened the new file meanwhile and wrote to it
        real_put(self, key, value, if_version=99)  # the command's own write is refused

    assert CliRunner().invoke(cli, ["--db", path, "init"]).exit_code == 0
    monkeypatch.setattr(agentstate.Scope, "put", put_refused_after_an_agent_wrote)
    r = CliRunner().invoke(cli, ["--db", path, "put", "app:x", "k", "1"])
    assert r.exit_code == 1 and "version_conflict" in r.stderr
    monkeypatch.undo()
    with agentstate.open(path) as db:
        assert db.scope("app", "agent").get("mine") == "acknowledged"


def test_1_bad_input_is_refused_before_the_file_is_created(tmp_path):
    """A value refused by the store's rules (too large) creates no file at all."""
    path = str(tmp_path / "new.db")
    r = CliRunner().invoke(cli, ["--db", path, "put", "app:x", "k", '"' + "x" * (1 << 20) + '"'])
    assert r.exit_code == 1 and "too_large" in r.stderr
    assert not os.path.exists(path)


def test_2_import_into_a_new_file_keeps_the_good_runs(tmp_path):
    """A malformed run folder costs only that run; the new file and the good runs stay."""
    src = tmp_path / "export"
    (src / "good").mkdir(parents=True)
    (src / "good" / "log.jsonl").write_text('{"seq": 0, "type": "user"}\n')
    (src / "bad").mkdir()
    (src / "bad" / "log.jsonl").write_text("not json\n")
    path = str(tmp_path / "new.db")
    assert CliRunner().invoke(cli, ["--db", path, "init"]).exit_code == 0
    r = CliRunner().invoke(cli, ["--db", path, "runs", "import", str(src)])
    assert r.exit_code == 1 and "1 of 2 runs not imported" in r.stderr
    with agentstate.open(path) as db:
        assert db.runs.read("good").entries == [{"seq": 0, "type": "user"}]
        assert db.runs.read("bad") is None


def test_3_another_task_cannot_join_an_open_transaction(db):
    """A plain write from another asyncio task meeting an open transaction on the same thread is
    refused (Busy), never silently joined and rolled back; an async twin waits and commits."""
    kv = db.scope("app", "tx")
    outcome = {}

    async def in_transaction():
        try:
            with db.transaction():
                kv.put("inside", 1)
                await asyncio.sleep(0.2)  # other tasks run here
                raise RuntimeError("the block fails")
        except RuntimeError:
            outcome["rolled_back"] = True

    async def plain_writer():
        await asyncio.sleep(0.05)
        try:
            outcome["plain"] = kv.put("outside", 1)
        except agentstate.Busy as e:
            outcome["plain"] = e

    async def async_writer():
        await asyncio.sleep(0.05)
        outcome["async"] = await kv.aput("outside_async", 1)

    async def main():
        await asyncio.gather(in_transaction(), plain_writer(), async_writer())

    asyncio.run(main())
    assert outcome["rolled_back"]
    assert isinstance(outcome["plain"], agentstate.Busy)  # told, not acknowledged
    assert kv.get("outside") is None and kv.get("inside") is None
    assert outcome["async"] == 1 and kv.get("outside_async") == 1  # acknowledged and kept


def test_3_async_twin_inside_a_transaction_is_a_usage_error(db):
    """An async twin inside transaction() would wait for it forever: refused at once."""
    kv = db.scope("app", "tx")

    async def main():
        with db.transaction():
            with pytest.raises(agentstate.UsageError):
                await kv.aput("k", 1)
            kv.put("k2", 2)

    asyncio.run(main())
    assert kv.get("k") is None and kv.get("k2") == 2


def test_4_foreign_file_with_user_version_1_is_refused_untouched(tmp_path):
    """A file of another application is Damaged and byte-for-byte unchanged, whatever its
    user_version."""
    path = str(tmp_path / "foreign.db")
    c = apsw.Connection(path)
    c.execute("CREATE TABLE notes (x); INSERT INTO notes VALUES (1); PRAGMA user_version = 1")
    c.close()
    before = file_digest(path)
    with pytest.raises(agentstate.Damaged):
        agentstate.open(path)
    assert file_digest(path) == before
    assert not os.path.exists(path + "-wal")


def test_5_turn_block_outliving_its_lease_raises(db):
    """The caller learns that its turn did not finish when its lease lapsed in the block."""
    s = db.sessions.create(ALICE)
    with pytest.raises(agentstate.InvalidTransition, match="expired"):
        with db.sessions.turn(s.id, ALICE, lease=0.2):
            time.sleep(1.0)
    assert db.sessions.turns(s.id, ALICE)[0].status == "expired"


def test_6_exception_text_with_lone_surrogate_is_stored_escaped(db):
    """The caller's exception propagates and the turn is failed, its text stored escaped."""
    s = db.sessions.create(ALICE)
    name = os.fsdecode(b"report-\xff.txt")
    with pytest.raises(FileNotFoundError) as info:
        with db.sessions.turn(s.id, ALICE):
            raise FileNotFoundError(f"no file {name}\x00")
    assert name in str(info.value)
    t = db.sessions.turns(s.id, ALICE)[0]
    assert t.status == "failed" and "report-\\udcff.txt" in t.error and "\x00" not in t.error
    db.sessions.start_turn(s.id, ALICE).finish()  # the session is not left busy


def test_7_session_deleted_during_the_turn_keeps_the_callers_exception(db):
    s = db.sessions.create(ALICE)
    with pytest.raises(KeyError, match="the caller's"):
        with db.sessions.turn(s.id, ALICE):
            db.sessions.delete(s.id, ALICE)
            raise KeyError("the caller's")


@pytest.mark.parametrize("stored, resent", [({"a": 1}, {"a": True}), ({"a": 1}, {"a": 1.0}),
                                            ({"a": True}, {"a": 1}), ({"a": [0]}, {"a": [False]})])
def test_8_resent_entry_equal_only_in_python_is_a_history_gap(db, stored, resent):
    """true, 1 and 1.0 are three JSON values: a different entry at a stored seq is refused."""
    db.runs.write("r", [{"seq": 0, **stored}], None, create=True)
    with pytest.raises(agentstate.HistoryGap):
        db.runs.write("r", [{"seq": 0, **resent}, {"seq": 1}], None)
    assert db.runs.read("r").entries == [{"seq": 0, **stored}]


def test_8_resent_entry_with_keys_in_another_order_is_a_retry(db):
    db.runs.write("r", [{"seq": 0, "a": 1, "b": {"x": 1, "y": 2}}], None, create=True)
    db.runs.write("r", [{"b": {"y": 2, "x": 1}, "a": 1, "seq": 0}, {"seq": 1}], None)
    assert len(db.runs.read("r").entries) == 2


def test_9_load_matches_object_call_ids_whatever_their_key_order(db):
    db.runs.write("r", [
        {"seq": 0, "type": "tool_call", "call_id": {"a": 1, "b": 2}},
        {"seq": 1, "type": "tool_result", "call_id": {"b": 2, "a": 1}},
        {"seq": 2, "type": "tool_call", "call_id": 1},
        {"seq": 3, "type": "tool_result", "call_id": True},
    ], None, create=True)
    synthetic = db.runs.load("r").entries[4:]
    assert [e["call_id"] for e in synthetic] == [1]  # True answers no call 1


def test_10_close_inside_a_transaction_raises_closed(db_path):
    """Closing while a transaction block is open (same thread or another) gives Closed."""
    db = agentstate.open(db_path)
    with pytest.raises(agentstate.Closed):
        with db.transaction():
            db.scope("app", "x").put("k", 1)
            db.close()
    db = agentstate.open(db_path)
    inside, closed = threading.Event(), threading.Event()
    errors = []

    def worker():
        try:
            with db.transaction():
                db.scope("app", "x").put("k2", 1)
                inside.set()
                closed.wait(10)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    assert inside.wait(10)
    db.close()
    closed.set()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], agentstate.Closed), errors
    with agentstate.open(db_path) as again:
        assert again.scope("app", "x").get("k") is None and again.scope("app", "x").get("k2") is None


def _open_connections(path: str) -> list:
    def is_open(c: apsw.Connection) -> bool:
        try:
            _ = c.in_transaction
            return True
        except apsw.ConnectionClosedError:
            return False

    return [c for c in apsw.connections() if is_open(c) and c.filename == path]


def test_11_close_while_another_thread_is_inside_a_statement_releases_its_files(db_path):
    """The busy thread's connection is closed as its call returns, not kept for the thread's life."""
    db = agentstate.open(db_path)
    db.scope("app", "x").put("k", 1)
    in_statement, after_close, done = threading.Event(), threading.Event(), threading.Event()
    result = {}

    def slow() -> int:
        in_statement.set()
        after_close.wait(10)
        return 1

    def worker():
        with db._store.read() as c:  # this thread's connection, in a statement that waits
            c.create_scalar_function("slow", slow)
            result["value"] = c.execute("SELECT slow()").get
        result["open_after_call"] = _open_connections(db.path)
        try:
            db.scope("app", "x").get("k")
        except agentstate.Closed:
            result["closed"] = True
        result["open"] = _open_connections(db.path)
        done.set()
        time.sleep(0.3)  # the thread lives on, as a pool thread would

    t = threading.Thread(target=worker)
    t.start()
    assert in_statement.wait(10)
    db.close()
    after_close.set()
    assert done.wait(10)
    assert result["open_after_call"] == [] and result.get("closed") and result["open"] == [], result
    t.join()


def test_12_lone_surrogates_in_ids_are_not_found_or_invalid(db):
    bad = "s-\udcff"
    for call in (lambda: db.sessions.get(bad, ALICE), lambda: db.sessions.turns(bad, ALICE),
                 lambda: db.sessions.start_turn(bad, ALICE), lambda: db.sessions.get_turn(bad, ALICE),
                 lambda: db.sessions.decide(bad, ALICE, 1)):
        with pytest.raises(agentstate.NotFound):
            call()
    with pytest.raises(agentstate.InvalidKey):
        db.scope("app", "x").list(after="a\udcff")
    r = CliRunner().invoke(cli, ["--db", db.path, "sessions", "show", bad])
    assert r.exit_code == 1 and r.stderr.startswith("Error: not_found:")


def test_13_non_utf8_paths_are_refused_and_leave_nothing(tmp_path, db):
    bad = os.path.join(os.fsencode(tmp_path), b"x\xff.db")
    with pytest.raises(agentstate.InvalidValue, match="UTF-8"):
        agentstate.open(bad)
    with pytest.raises(agentstate.InvalidValue, match="UTF-8"):
        db.backup(bad)
    r = CliRunner().invoke(cli, ["--db", os.fsdecode(bad), "init"])
    assert r.exit_code == 1 and "UTF-8" in r.stderr
    assert [f for f in os.listdir(tmp_path) if f.startswith("x")] == []


def test_14_backup_or_vacuum_inside_a_transaction_is_a_usage_error(db, tmp_path):
    for call in (lambda: db.backup(str(tmp_path / "b.db")), db.vacuum):
        t0 = time.monotonic()
        with pytest.raises(agentstate.UsageError):
            with db.transaction():
                call()
        assert time.monotonic() - t0 < 4  # at once, not after busy_timeout


@pytest.mark.parametrize("value", ["-0.5", "-5", "-1e3"])
def test_15_negative_numbers_are_values_not_options(db, db_path, value):
    r = CliRunner().invoke(cli, ["--db", db_path, "put", "app:cfg", "t", value])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["--db", db_path, "append", "app:cfg", "-list", "[" + value + "]"])
    assert r.exit_code == 0, r.output
    with agentstate.open(db_path) as db:
        assert db.scope("app", "cfg").get("t") == float(value) or db.scope("app", "cfg").get("t") == int(value)
        assert db.scope("app", "cfg").length("-list") == 1


def test_16_command_stdin_is_bytes_with_anything_in_it(db, db_path):
    """A real stdin is bytes: lone-surrogate and non-UTF-8 bytes are refused in one line."""
    for data in ('"\udcff"'.encode("utf-8", "surrogatepass"), b"\xff\xfe"):
        r = CliRunner().invoke(cli, ["--db", db_path, "put", "app:a", "k", "-"], input=data)
        assert r.exit_code == 1 and r.stderr.startswith("Error: invalid_value:"), r.output


# -- the decisions noted on issue 10 ------------------------------------------

def test_import_of_an_older_export_keeps_the_newer_snapshot(db, tmp_path):
    db.runs.write("r", [{"seq": 0}], {"turn": 1}, create=True)
    db.runs.export("r", tmp_path)
    db.runs.write("r", [{"seq": 1}], {"turn": 2})
    db.runs.import_runs(tmp_path)
    assert db.runs.read("r").snapshot == {"turn": 2}


def test_runs_delete_of_an_unknown_id_says_so(db_path):
    r = CliRunner().invoke(cli, ["--db", db_path, "init"])
    r = CliRunner().invoke(cli, ["--db", db_path, "--json", "runs", "delete", "nope"])
    assert r.exit_code == 0 and r.stdout.strip() == '{"deleted": false}'


def test_value_corrupted_by_hand_is_damaged(db, db_path):
    db.scope("app", "x").put("k", {"a": 1})
    db.scope("app", "x").append("l", [1])
    c = apsw.Connection(db_path)
    c.execute("UPDATE kv SET value = '{broken' WHERE key = 'k'; UPDATE list_item SET item = '[' ")
    c.close()
    with pytest.raises(agentstate.Damaged):
        db.scope("app", "x").get("k")
    with pytest.raises(agentstate.Damaged):
        db.scope("app", "x").slice("l")
