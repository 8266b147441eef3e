"""The file read from the real sqlite3 shell (SPEC §8): the docs' queries, while agents write."""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import re
import shlex
import shutil
import subprocess
import threading
import time

import pytest

import agentstate

from . import workers
from .conftest import REPO

SQLITE3 = shutil.which("sqlite3")


def docs_commands() -> list[list[str]]:
    """The `$ sqlite3 ...` lines of docs/sqlite.md's shell section."""
    text = (REPO / "docs" / "sqlite.md").read_text()
    text = text.split("## Reading it with the sqlite3 shell", 1)[1].split("\n## ", 1)[0]
    return [shlex.split(line) for line in re.findall(r"^\$ (sqlite3 .*)$", text, re.M)]


def docs_queries() -> list[str]:
    return [argv[-1] for argv in docs_commands()]


def docs_shell() -> list[str]:
    """The docs' shell command without its query: the tests read the file the same way."""
    prefixes = {tuple(argv[:-1]) for argv in docs_commands()}
    assert len(prefixes) == 1, prefixes
    return [SQLITE3, *next(iter(prefixes))[1:]]


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
    r = subprocess.run([*docs_shell(), sql], cwd=folder, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return [line.split("|") for line in r.stdout.splitlines()]


def test_docs_queries_while_another_process_writes(populated):
    folder, _, _ = populated
    queries = docs_queries()
    assert len(queries) == 6
    ctx = mp.get_context("spawn")
    started = ctx.Event()
    writer = ctx.Process(target=workers.busy_agent, args=(str(folder / "agentstate.db"), 6.0, started))
    writer.start()
    try:
        assert started.wait(60)
        value, history, active, biggest, runs, newest = (shell(folder, q) for q in queries)
    finally:
        writer.join(60)
    assert writer.exitcode == 0
    assert value == [["large"]]
    assert [int(r[0]) for r in history] == [29, 28]
    assert all(r[1] == "message" and json.loads(r[2])["seq"] == int(r[0]) for r in history)
    assert ["alice", "running", "0"] in active  # the fixture's turn (the writer's may be too)
    assert ["run-1", "triage", "30", "0"] in runs
    seqs = [int(r[0]) for r in newest]
    assert len(newest) == 3 and seqs == sorted(seqs, reverse=True)
    assert all(r[1] in ("kv", "run", "session") for r in newest)
    assert biggest[0][:3] == ["user", "u-7", "big"] and int(biggest[0][3]) > 5000
    assert len(biggest) == 5
    sizes = [int(r[3]) for r in biggest]
    assert sizes == sorted(sizes, reverse=True)


def test_the_docs_shell_waits_while_the_last_agent_closes(populated):
    """The last connection to close locks the file while it folds the WAL back in (SQLite's
    documented behaviour): a bare shell started then fails at once, the docs' waits."""
    folder, _, _ = populated
    pending = 0x40000000  # SQLite's lock bytes: an exclusive lock holds these 512 from here
    with open(folder / "agentstate.db", "rb+") as f:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 512, pending)
        bare = subprocess.run([SQLITE3, "agentstate.db", docs_queries()[0]], cwd=folder,
                              capture_output=True, text=True, timeout=60)
        unlock = threading.Timer(0.5, fcntl.lockf, (f, fcntl.LOCK_UN, 512, pending))
        t0 = time.monotonic()
        unlock.start()
        try:
            rows = shell(folder, docs_queries()[0])
            waited = time.monotonic() - t0
        finally:
            unlock.join()
    assert bare.returncode != 0 and "database is locked" in bare.stderr
    assert rows == [["large"]] and waited >= 0.45


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
