"""Upgrading from agentstate 0.2: threads its LangGraph saver stored (record format 1,
one key per pending write) read through the current saver exactly as 0.2 read them,
and are migrated to the current layout on first use. The old side is the real 0.2
code (``git archive be4f1f3``), run in its own process by langgraph_upgrade_worker.py."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

import agentstate
from agentstate.integrations.langgraph import AgentStateSaver
from agentstate.integrations.langgraph import _upgrade
from agentstate.integrations.langgraph._layout import is_old

from .langgraph_upgrade_worker import OPS, THREADS, build, config, dump
from .test_langgraph import in_two_processes

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("langgraph_upgrade_worker.py")
RELEASE_0_2 = "be4f1f3"  # the last commit with the 0.2 layout (before d1597e6)


@pytest.fixture(scope="module")
def old_package(tmp_path_factory) -> Path:
    """agentstate as of 0.2, extracted from git (with the schema files it reads)."""
    where = tmp_path_factory.mktemp("agentstate-0.2")
    tar = subprocess.run(["git", "archive", RELEASE_0_2, "agentstate", "schema.sql",
                          "schema_postgres.sql"], cwd=ROOT, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        t.extractall(where, filter="data")
    return where


def run_old(package: Path, *args: str) -> dict[str, Any]:
    """The worker under agentstate 0.2 (a script, so that its own folder, not the
    repository, comes before PYTHONPATH); what it wrote to its output file."""
    out = package.parent / f"out-{os.getpid()}-{threading.get_ident()}.json"
    done = subprocess.run([sys.executable, str(WORKER), args[0], args[1], str(out), str(package),
                           *args[2:]], cwd=package, env={**os.environ, "PYTHONPATH": str(package)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["agentstate"] == str(package / "agentstate")  # the old code ran
    return result


@pytest.fixture(scope="module")
def stored(old_package, tmp_path_factory) -> dict[str, Any]:
    """A file 0.2 wrote (two threads, a subgraph's namespace, an interrupt, pending
    writes, one over INLINE bytes, three runs), what 0.2's saver read from it, and
    what 0.2's saver read after each whole-thread operation (each on its own copy)."""
    d = tmp_path_factory.mktemp("stored-by-0.2")
    store, runs = d / "store.db", d / "runs.txt"
    result = run_old(old_package, str(store), str(runs))
    copies = []
    for op in OPS:
        shutil.copy(store, d / f"{op}.db")
        copies.append(f"{op}={d / f'{op}.db'}")
    result.update(run_old(old_package, str(store), str(runs), *copies))
    return {"store": store, "runs": runs.read_text(), **result}


def pristine(stored: dict[str, Any], tmp_path: Path) -> tuple[str, str]:
    """A copy of the file as 0.2 left it (and of the runs file of its graph)."""
    shutil.copy(stored["store"], tmp_path / "store.db")
    (tmp_path / "runs.txt").write_text(stored["runs"])
    return str(tmp_path / "store.db"), str(tmp_path / "runs.txt")


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two dumps differ (a readable failure: dumps are large)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b), key=str)
                for d in (differences(a.get(k), b.get(k), f"{path}/{k}") if k in a and k in b
                          else [f"{path}/{k}: only in {'first' if k in a else 'second'}"])]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {str(a)[:150]} != {str(b)[:150]}"]


def thread_keys(db: agentstate.Database, thread: str) -> list[str]:
    return db.scope("thread", f"langgraph.{thread}").list("")


def old_keys(db: agentstate.Database, *threads: str) -> list[str]:
    """The keys of 0.2's layout in ``threads`` (default: all)."""
    return [k for t in threads or ("t-1", "t-2", "t-3") for k in thread_keys(db, t) if is_old(k)]


# -- reading what 0.2 stored --------------------------------------------------------------


def test_a_thread_stored_by_0_2_reads_as_0_2_read_it_then_resumes(stored, tmp_path):
    """Every read (list with filters, before, limit, across threads and namespaces;
    get_tuple of each checkpoint) returns what 0.2 returned; the interrupted graph
    resumes from 0.2's checkpoint with its pending writes (the finished task does not
    run again); the file then holds the current layout only."""
    path, runs = pristine(stored, tmp_path)
    with agentstate.open(path) as db:
        before = old_keys(db)
        assert any(".w." in k for k in before) and any(k.startswith("r.") for k in before)
        assert any(k.startswith("x.") for k in thread_keys(db, "t-1"))  # the large write
        assert differences(dump(AgentStateSaver(db)), stored["dump"]) == []
        assert old_keys(db) == []
        graph = build(AgentStateSaver(db), runs)
        state = graph.invoke(Command(resume="yes"), config("t-1"))
        assert state["answer"] == "yes" and state["big"] == "x" * 6000
        assert state["log"][-1] == "last" and state["log"].count("big") == 1
        assert Path(runs).read_text() == stored["runs"]  # big ran once, under 0.2
    with agentstate.open(path) as db:  # a second open: the new layout, read as is
        assert old_keys(db) == []
        keys = thread_keys(db, "t-2")
        assert any(k.endswith(".r") for k in keys) and any(k.endswith(".p") for k in keys)
        assert any(k.startswith("u.") for k in keys)
        saver = AgentStateSaver(db)
        assert saver.get_tuple(config("t-1")).checkpoint["channel_values"]["answer"] == "yes"
        assert differences(dump(saver)["t-2"], stored["dump"]["t-2"]) == []


def test_aget_tuple_of_a_0_2_thread_migrates_it_in_a_worker_thread(stored, tmp_path, monkeypatch):
    """aget_tuple reads a file on the loop's thread, but a thread of 0.2's layout needs
    migrating (a write): that read goes to a worker thread, and migrates it."""
    path, _runs = pristine(stored, tmp_path)
    hops = []
    real = asyncio.to_thread
    monkeypatch.setattr(asyncio, "to_thread", lambda fn, *a, **kw: (hops.append(fn), real(fn, *a, **kw))[1])
    with agentstate.open(path) as db:
        saver = AgentStateSaver(db)
        assert old_keys(db, "t-2")
        tup = asyncio.run(saver.aget_tuple(config("t-2")))
        assert len(hops) == 1 and old_keys(db, "t-2") == []
        assert tup == saver.get_tuple(config("t-2"))
        assert differences(dump(saver)["t-2"], stored["dump"]["t-2"]) == []


@pytest.mark.parametrize("op", list(OPS))
def test_a_whole_thread_operation_on_0_2_threads_gives_what_0_2_gave(stored, tmp_path, op):
    """delete_thread, delete_for_runs, prune and copy_thread, as the first call on a
    file 0.2 wrote, leave what the same call left under 0.2 (as its saver reads it)."""
    path, _runs = pristine(stored, tmp_path)
    with agentstate.open(path) as db:
        OPS[op](AgentStateSaver(db))
        assert differences(dump(AgentStateSaver(db)), stored[op]) == []
        assert old_keys(db) == []
        for thread in ("t-1", "t-2", "t-3"):  # no large write outlives its checkpoint's writes
            keys = thread_keys(db, thread)
            for k in keys:
                if k.startswith("x."):
                    assert "c." + ".".join(k.split(".")[1:3]) + ".p" in keys, k
        if op == "delete_thread":
            assert thread_keys(db, "t-1") == []
            assert not db.scope("app", "langgraph.saver").list("r.00000000-0000-4000-8000-000000000001")


def test_a_put_on_a_0_2_thread_migrates_it_and_builds_on_its_parent(stored, tmp_path):
    """A put whose parent is a 0.2 record (no read before it) migrates the thread and
    stores the new checkpoint as a child of it (unchanged channels: the parent's bytes)."""
    path, _runs = pristine(stored, tmp_path)
    with agentstate.open(path) as db:
        latest = stored["dump"]["t-2"]["latest"][""]
        saver = AgentStateSaver(db)  # nothing read before the put
        ck = {"v": 4, "id": "1ffffff0-0000-6fff-8000-000000000000", "ts": latest["checkpoint"]["ts"],
              "channel_values": {}, "channel_versions": latest["checkpoint"]["channel_versions"],
              "versions_seen": {}, "updated_channels": []}
        saver.put(latest["config"], ck, {"source": "update", "step": 99}, {})
        assert old_keys(db, "t-2") == [] and old_keys(db, "t-1") != []  # one thread at a time
        tup = saver.get_tuple(config("t-2"))
        assert tup.config["configurable"]["checkpoint_id"] == ck["id"]
        assert tup.checkpoint["channel_values"]["answer"] == "no"  # the parent's bytes
        assert tup.parent_config == latest["config"]


# -- a 0.2 process still running ------------------------------------------------------------

OLD_READER = """
import sys, agentstate
from agentstate.integrations.langgraph import AgentStateSaver
assert agentstate.__file__.startswith(sys.argv[2])
try:
    with agentstate.open(sys.argv[1]) as db:
        AgentStateSaver(db).get_tuple({"configurable": {"thread_id": "t-2"}})
        print("read")
except agentstate.SchemaTooNew:
    print("SchemaTooNew")
"""

# The writers below open the file first, say "ready" and wait for a line on stdin: a 0.2
# process running when the file is upgraded (one started after is refused: SchemaTooNew).
OLD_WRITER = """
import sys, agentstate
from langgraph.checkpoint.base import empty_checkpoint
from agentstate.integrations.langgraph import AgentStateSaver
assert agentstate.__file__.startswith(sys.argv[2])
with agentstate.open(sys.argv[1]) as db:
    saver = AgentStateSaver(db)
    print("ready", flush=True)
    sys.argv[3:] = [sys.stdin.readline().strip()]
    ck = empty_checkpoint()
    ck["id"] = "1ffffff0-0000-6fff-8000-000000000001"
    ck["channel_values"] = {"answer": "late"}
    ck["channel_versions"] = {"answer": 99}
    got = saver.put({"configurable": {"thread_id": "t-2", "checkpoint_ns": "",
                                      "checkpoint_id": sys.argv[3]}},
                    ck, {"source": "loop", "step": 9}, {"answer": 99})
    saver.put_writes(got, [("log", "x" * 5000)], "task-late")
"""


def old_script(package: Path, script: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=package,
                          env={**os.environ, "PYTHONPATH": str(package)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def old_running(package: Path, script: str, *args: str) -> subprocess.Popen[str]:
    """A 0.2 process that has opened the file and waits (``finish`` sends it its line)."""
    proc = subprocess.Popen([sys.executable, "-c", script, *args], cwd=package,
                            env={**os.environ, "PYTHONPATH": str(package)}, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def finish(proc: subprocess.Popen[str], line: str) -> None:
    out, err = proc.communicate(line + "\n", timeout=300)
    assert proc.returncode == 0, err


def test_a_0_2_process_reading_a_migrated_thread_is_told_to_upgrade(stored, old_package, tmp_path):
    """After the migration, a 0.2 process is refused (SchemaTooNew: the file's schema is
    0.4's now, and 0.2's saver refused a migrated thread alike) instead of finding it empty
    and starting the conversation over."""
    path, _runs = pristine(stored, tmp_path)
    assert old_script(old_package, OLD_READER, path, str(old_package)) == "read"
    with agentstate.open(path) as db:
        AgentStateSaver(db).get_tuple(config("t-2"))
    assert old_script(old_package, OLD_READER, path, str(old_package)) == "SchemaTooNew"


def test_a_checkpoint_a_0_2_process_stores_after_the_migration_is_read(stored, old_package, tmp_path):
    """A 0.2 process in the middle of a step when the thread is migrated stores its
    next checkpoint and writes in the old layout: they are read (and migrated) too."""
    path, _runs = pristine(stored, tmp_path)
    old = old_running(old_package, OLD_WRITER, path, str(old_package))
    with agentstate.open(path) as db:
        saver = AgentStateSaver(db)
        parent = saver.get_tuple(config("t-2")).config["configurable"]["checkpoint_id"]
        assert old_keys(db, "t-2") == []
        finish(old, parent)
        assert old_keys(db, "t-2") != []
        tup = saver.get_tuple(config("t-2"))
        assert tup.checkpoint["channel_values"] == {"answer": "late"}
        assert tup.pending_writes == [("task-late", "log", "x" * 5000)]
        assert old_keys(db, "t-2") == []
        assert len(list(saver.list(config("t-2")))) == len(stored["dump"]["t-2"]["list"]) + 1


OLD_LATE_WRITE = """
import sys, agentstate
from agentstate.integrations.langgraph import AgentStateSaver
assert agentstate.__file__.startswith(sys.argv[2])
with agentstate.open(sys.argv[1]) as db:
    print("ready", flush=True)
    sys.argv[3:] = [sys.stdin.readline().strip()]
    AgentStateSaver(db).put_writes({"configurable": {"thread_id": "t-2", "checkpoint_ns": "",
                                                     "checkpoint_id": sys.argv[3]}},
                                   [("log", "late")], "task-late")
"""


def test_a_write_0_2_stores_for_an_older_migrated_checkpoint_is_listed_in_place(
        stored, old_package, tmp_path, monkeypatch):
    """A pending write a 0.2 process stores for an old checkpoint of a migrated thread
    is met in the middle of a list, which migrates it and goes on from where it was:
    every checkpoint once, in order, that one with the write."""
    from agentstate.integrations.langgraph import checkpoint as module

    path, _runs = pristine(stored, tmp_path)
    expected = stored["dump"]["t-2"]["by ns"][""]
    oldest = expected[-1]["config"]["configurable"]["checkpoint_id"]
    old = old_running(old_package, OLD_LATE_WRITE, path, str(old_package))
    with agentstate.open(path) as db:
        saver = AgentStateSaver(db)
        saver.get_tuple(config("t-2"))  # migrated
        finish(old, oldest)
        upgrades: list[str] = []
        monkeypatch.setattr(module, "upgrade", lambda db, scope: upgrades.append(scope.id) or
                            _upgrade.upgrade(db, scope))
        got = list(saver.list({"configurable": {"thread_id": "t-2", "checkpoint_ns": ""}}))
        assert upgrades == ["langgraph.t-2"]  # met after checkpoints were given: a resumed list
        assert [t.config for t in got] == [t["config"] for t in expected]
        assert ("task-late", "log", "late") in got[-1].pending_writes
        assert len(got[-1].pending_writes) == len(expected[-1]["writes"]) + 1
        assert all(len(t.pending_writes) == len(e["writes"]) for t, e in zip(got[:-1], expected))
        assert old_keys(db, "t-2") == []


# -- two migrators at once ------------------------------------------------------------------


def _reader(path: str, barrier: Any, out: Any) -> None:
    with agentstate.open(path) as db:
        barrier.wait()
        try:
            out.put(dump(AgentStateSaver(db)))
        except Exception as e:  # reported, so the test fails at once, with it
            out.put(repr(e))


def race(path: str, expected: dict[str, Any]) -> None:
    results = in_two_processes(_reader, lambda _w, barrier, out: (path, barrier, out), wait=180)
    assert [differences(got, expected) if isinstance(got, dict) else got for got in results] == [[], []]
    with agentstate.open(path) as db:
        assert old_keys(db) == []
        assert differences(dump(AgentStateSaver(db)), expected) == []


# one round by default, two more in CI's -m slow
@pytest.mark.parametrize("round_", [0, *(pytest.param(i, marks=pytest.mark.slow) for i in (1, 2))])
def test_two_processes_migrating_one_thread_at_once_both_read_it_whole(stored, tmp_path, round_):
    """Two processes meet the same 0.2 threads at the same moment: both read exactly
    what 0.2 read, and the file ends in the new layout, nothing lost or doubled."""
    path, _runs = pristine(stored, tmp_path)
    race(path, stored["dump"])


# -- PostgreSQL -------------------------------------------------------------------------------


def test_threads_0_2_stored_on_postgresql_read_the_same_and_resume(old_package, pg_url, tmp_path):
    """The same on a PostgreSQL store: 0.2's reads, the resumed graph, the new layout;
    two processes migrating at once both read it whole."""
    runs = tmp_path / "runs.txt"
    expected = run_old(old_package, pg_url, str(runs))["dump"]
    with agentstate.open(pg_url) as db:
        assert any(".w." in k for k in old_keys(db))
    race(pg_url, expected)
    with agentstate.open(pg_url) as db:
        ran = runs.read_text()
        state = build(AgentStateSaver(db), str(runs)).invoke(Command(resume="yes"), config("t-1"))
        assert state["answer"] == "yes" and runs.read_text() == ran


def waiting_for_a_lock(url: str) -> bool:
    """Whether a session of the server waits for a lock (held by another transaction)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as c:
        return c.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                         ).fetchone()[0] > 0


def test_a_migrator_that_starts_while_another_holds_the_thread_waits_then_finds_it_done(
        old_package, pg_url, tmp_path, monkeypatch):
    """A second migration of a thread, started while the first has read its rows and
    not committed, waits for it (the rows a write transaction read are locked), then
    finds nothing to move: each checkpoint moved once, read whole."""
    expected = run_old(old_package, pg_url, str(tmp_path / "runs.txt"))["dump"]
    first, second = agentstate.open(pg_url), agentstate.open(pg_url, busy_timeout=120)
    try:
        real, moved = _upgrade._rows, []

        def other() -> None:
            try:
                moved.append(_upgrade.upgrade(second, second.scope("thread", "langgraph.t-1")))
            except BaseException as e:
                moved.append(e)

        racer = threading.Thread(target=other)

        def rows(scope: agentstate.Scope, prefix: str) -> list[Any]:
            got = real(scope, prefix)
            if prefix == "r." and not racer.is_alive() and not moved:  # the first's read done
                racer.start()
                for _ in range(1200):  # until the second waits for the first's locks
                    if waiting_for_a_lock(pg_url) or moved:
                        break
                    threading.Event().wait(0.05)
                assert waiting_for_a_lock(pg_url), moved
            return got

        monkeypatch.setattr(_upgrade, "_rows", rows)
        assert _upgrade.upgrade(first, first.scope("thread", "langgraph.t-1")) is True
        racer.join(120)
        assert moved == [False]
        monkeypatch.setattr(_upgrade, "_rows", real)
        assert differences(dump(AgentStateSaver(first)), expected) == []
        assert old_keys(first, "t-1") == []
    finally:
        first.close()
        second.close()


def test_a_thread_0_2_left_has_the_threads_it_had(stored):
    """(The fixture's own check.) The 0.2 dump covers both threads and the subgraph."""
    assert sorted(k for k in stored["dump"] if k in THREADS) == list(THREADS)
    assert stored["dump"]["t-1"]["namespaces"] == ["", "sub"]
    assert any(w[1] == "__interrupt__" for t in stored["dump"]["t-1"]["list"] for w in t["writes"])
