"""The file read from the real sqlite3 shell (SPEC §8): the README's queries, while agents write."""

from __future__ import annotations

import json
import multiprocessing as mp
import re
import shutil
import subprocess

import pytest

import agentstate

from . import workers
from .conftest import REPO

SQLITE3 = shutil.which("sqlite3")


def readme_queries() -> list[str]:
    text = (REPO / "README.md").read_text().split("## Reading the file with sqlite3", 1)[1]
    return re.findall(r'^sqlite3 agentstate\.db "(.*)"$', text, re.M)


@pytest.fixture
def populated(tmp_path):
    path = tmp_path / "agentstate.db"
    alice = agentstate.Principal("alice")
    with agentstate.open(path) as db:
        db.scope("session", "s-42").put("settings", {"model": "large", "temperature": 0.2})
        db.scope("user", "u-7").put("big", {"notes": "x" * 5000})
        db.scope("session", "s-42").append("history", [{"role": "user", "content": "héllo"}] * 3)
        db.runs.write("run-1", [{"seq": i, "type": "message", "n": i} for i in range(30)],
                      {"task": "triage"}, create=True)
        s = db.sessions.create(alice)
        t = db.sessions.start_turn(s.id, alice, lease=600)
    return tmp_path, s.id, t.id


def shell(folder, sql: str) -> list[list[str]]:
    assert SQLITE3, "the sqlite3 shell must be installed (.ci/run installs it)"
    r = subprocess.run([SQLITE3, "-bail", "agentstate.db", sql], cwd=folder, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.split("|") for line in r.stdout.splitlines()]


def test_readme_queries_while_another_process_writes(populated):
    folder, sid, tid = populated
    queries = readme_queries()
    assert len(queries) == 5
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    writer = ctx.Process(target=workers.busy_agent, args=(str(folder / "agentstate.db"), 6.0, started))
    writer.start()
    try:
        assert started.wait(60)
        value, history, active, newest, biggest = (shell(folder, q) for q in queries)
    finally:
        writer.join(60)
    assert writer.exitcode == 0
    assert value == [["large"]]
    assert [int(r[0]) for r in history] == list(range(29, 19, -1))
    assert all(r[1] == "message" and json.loads(r[2])["seq"] == int(r[0]) for r in history)
    assert [sid, "alice", tid, "running"] in [r[:4] for r in active]
    seqs = [int(r[0]) for r in newest]
    assert 6 <= len(newest) <= 20 and seqs == sorted(seqs, reverse=True)  # the fixture wrote 6
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT[\d:.]+Z", r[1]) and r[2] in ("kv", "run", "session")
               for r in newest)
    assert biggest[0][:3] == ["user", "u-7", "big"] and int(biggest[0][3]) > 5000
    assert len(biggest) == 5
    sizes = [int(r[3]) for r in biggest]
    assert sizes == sorted(sizes, reverse=True)


def test_views_show_values_and_iso_times(populated):
    folder, _, _ = populated
    rows = shell(folder, "SELECT kind, scope_id, key, value, version, updated_at FROM state "
                         "WHERE key = 'history'")
    assert rows[0][:3] == ["session", "s-42", "history"]
    assert json.loads(rows[0][3]) == [{"role": "user", "content": "héllo"}] * 3
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", rows[0][5])
    assert shell(folder, "SELECT id, task, entries FROM runs") == [["run-1", "triage", "30"]]
    lapsed = shell(folder, "SELECT status, lease_lapsed FROM active_turns")
    assert lapsed == [["running", "0"]]


def test_schema_is_commented_and_old_shell_friendly():
    """Every table has a comment; nothing in the schema needs SQLite newer than 3.37."""
    sql = (REPO / "schema.sql").read_text()
    for m in re.finditer(r"CREATE (TABLE|VIEW) (\w+)", sql):
        before = sql[: m.start()].rstrip().splitlines()[-1]
        assert before.startswith("--"), f"{m.group(2)} has no comment above it"
    body = "\n".join(line.split("--")[0] for line in sql.splitlines())
    for newer in ("->", "unixepoch(", "subsec", "string_agg", "jsonb", "iif(", "octet_length"):
        assert newer not in body.lower(), newer
    assert not re.search(r"\w\([^()]*ORDER BY", body), "ORDER BY inside an aggregate needs 3.44"
