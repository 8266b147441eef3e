"""Many processes doing everything at once, with the sqlite3 shell reading (issue: reliability)."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import subprocess
import time

import pytest

import agentstate

from . import workers

SHELL_QUERIES = [
    "SELECT count(*) FROM state",
    "SELECT seq FROM run_history WHERE run_id = 'soak-run' ORDER BY seq DESC LIMIT 10",
    "SELECT session_id, status FROM active_turns",
    "SELECT json_extract(value, '$[#-1]') FROM state WHERE key = 'shared-list'",
]


def soak(db_path: str, seconds: float, n: int = 8) -> dict:
    with agentstate.open(db_path) as db:
        sid = db.sessions.create(agentstate.Principal("alice")).id
        db.scope("app", "soak").put("session_id", sid)
        db.runs.write("soak-run", [], None, create=True)
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=workers.mixed_worker, args=(db_path, w, seconds, start, results))
             for w in range(n)]
    for p in procs:
        p.start()
    time.sleep(1.0)  # let them import and open
    start.set()
    sqlite3 = shutil.which("sqlite3")
    assert sqlite3
    shell_reads = 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for q in SHELL_QUERIES:
            # with the README's busy timeout: the last worker to close locks the file a moment
            r = subprocess.run([sqlite3, "-cmd", ".timeout 5000", db_path, q], capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            shell_reads += 1
    out = dict(results.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    for who, done in out.items():
        assert done["errors"] == [], (who, done["errors"][:3])  # nothing unexpected
        assert done["busy"] == [], (who, done["busy"][:3])  # (operation, seconds waited)
    with agentstate.open(db_path) as db:
        assert db.check() == []
        kv = db.scope("app", "soak")
        assert kv.get("counter", 0) == sum(d["inc"] for d in out.values())  # no lost update
        items = kv.slice("shared-list")
        assert len(items) == len({tuple(x) for x in items})  # no duplicate
        for who, done in out.items():
            assert [i for w, i in items if w == who] == done["appended"]  # none missing, in order
        history = db.runs.read("soak-run").entries
        assert [e["seq"] for e in history] == list(range(len(history)))  # no gap
        for who, done in out.items():
            assert [e["i"] for e in history if e["who"] == who] == done["entries"]
        turns = db.sessions.turns(kv.get("session_id"), agentstate.Principal("alice"))
        assert sum(1 for t in turns if t.status == "finished") == sum(d["turns"] for d in out.values())
        assert not [t for t in turns if t.status in ("queued", "running")]
    return {"processes": n, "seconds": seconds, "shell_reads": shell_reads,
            "ops": sum(d["inc"] + len(d["appended"]) + len(d["entries"]) + d["turns"]
                       for d in out.values())}


def test_eight_processes_mixed_load(tmp_path):
    """8 processes for a few seconds: no lost update, no duplicate or missing item, no gap, no Busy."""
    stats = soak(str(tmp_path / "soak.db"), float(os.environ.get("AGENTSTATE_SOAK_SECONDS", 6)))
    assert stats["ops"] > 100 and stats["shell_reads"] > 0


@pytest.mark.slow
def test_eight_processes_mixed_load_long(tmp_path):
    """The same for 60 s (AGENTSTATE_SOAK_SECONDS_LONG overrides)."""
    stats = soak(str(tmp_path / "soak.db"), float(os.environ.get("AGENTSTATE_SOAK_SECONDS_LONG", 60)))
    print(f"\nsoak: {stats}")
