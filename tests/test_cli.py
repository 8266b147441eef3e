"""The agentstate command (SPEC §7): CliRunner for behaviour, the installed executable too."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import apsw
import pytest
from click.testing import CliRunner

import agentstate
from agentstate.cli import cli


@pytest.fixture(autouse=True)
def _made(db_path):
    """The tests' database exists, as after `agentstate init` (only init, demo and serve
    create one: test_only_init_demo_and_serve_create_the_file)."""
    agentstate.open(db_path).close()


def run(db_path, *args, input=None):
    r = CliRunner().invoke(cli, ["--db", db_path, *args], input=input)
    assert "Traceback" not in r.output
    return r


def jrun(db_path, *args, input=None):
    r = CliRunner().invoke(cli, ["--db", db_path, "--json", *args], input=input)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_every_command_has_help():
    def walk(group, path):
        for name, cmd in group.commands.items():
            assert cmd.help, f"{' '.join(path + [name])} has no help text"
            r = CliRunner().invoke(cli, [*path, name, "--help"])
            assert r.exit_code == 0
            if hasattr(cmd, "commands"):
                walk(cmd, path + [name])

    walk(cli, [])
    assert CliRunner().invoke(cli, ["--version"]).output.startswith("agentstate")


def test_put_get_append_delete_keys_json(db_path):
    assert jrun(db_path, "put", "session:s-42", "cfg", '{"model": "small"}') == {"version": 1}
    assert jrun(db_path, "get", "session:s-42", "cfg") == {
        "key": "cfg", "value": {"model": "small"}, "version": 1}
    assert jrun(db_path, "put", "session:s-42", "cfg", "-", "--if-version", "1",
                input='{"model": "large"}') == {"version": 2}
    assert jrun(db_path, "append", "session:s-42", "h", "[1, 2]") == {"length": 2, "version": 1}
    assert jrun(db_path, "append", "session:s-42", "h", "-", input='["x"]') == {"length": 3, "version": 2}
    assert jrun(db_path, "keys", "session:s-42") == ["cfg", "h"]
    assert jrun(db_path, "keys", "session:s-42", "--prefix", "c") == ["cfg"]
    assert jrun(db_path, "delete", "session:s-42", "h") == {"deleted": True}
    assert jrun(db_path, "delete", "session:s-42", "h") == {"deleted": False}
    with agentstate.open(db_path) as db:
        assert db.scope("session", "s-42").get("cfg") == {"model": "large"}


def test_human_output(db_path):
    run(db_path, "put", "app:a", "k", '"é"')
    r = run(db_path, "get", "app:a", "k")
    assert r.stdout == '"é"\n' and r.stderr == "(version 1)\n"  # stdout pipes into put
    r = run(db_path, "info")
    lines = r.output.splitlines()
    assert lines[0].split() == ["path", db_path]
    assert any(line.split()[:2] == ["schema", "version"] for line in lines)
    # aligned: every value starts in the same column
    cols = {len(line) - len(line.split("  ")[-1].lstrip()) for line in lines}
    assert len(cols) == 1
    assert run(db_path, "check").output.startswith("ok")


@pytest.mark.parametrize("args,code", [
    (["put", "bad-scope", "k", "1"], "invalid_key"),
    (["put", "galaxy:x", "k", "1"], "invalid_key"),
    (["put", "app:x", "bad key", "1"], "invalid_key"),
    (["put", "app:x", "k", "{nope"], "invalid_value"),
    (["put", "app:x", "k", "NaN"], "invalid_value"),
    (["append", "app:x", "k", '{"a": 1}'], "invalid_value"),
    (["put", "app:x", "k", "1", "--if-version", "7"], "version_conflict"),
    (["append", "app:x", "scalar", "[1]"], "not_a_list"),
    (["get", "app:x", "absent"], "not_found"),
    (["runs", "show", "nope"], "not_found"),
    (["sessions", "show", "nope"], "not_found"),
])
def test_refused_operations_exit_1_with_one_line(db_path, args, code):
    run(db_path, "put", "app:x", "scalar", "1")
    r = run(db_path, *args)
    assert r.exit_code == 1, r.output
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {code}: "), r.stderr


def test_bad_usage_exits_2(db_path):
    for args in (["put", "app:x"], ["nonsense"], ["put", "app:x", "k", "1", "--if-version", "x"]):
        r = run(db_path, *args)
        assert r.exit_code == 2 and "Usage:" in r.stderr


def test_files_that_are_not_usable(tmp_path):
    missing = str(tmp_path / "missing.db")
    for args in (["get", "app:x", "k"], ["info"], ["check"], ["keys", "app:x"], ["runs", "list"]):
        r = run(missing, *args)
        assert r.exit_code == 1 and r.stderr.startswith("Error: not_found: no database")
    assert not os.path.exists(missing)
    r = run(str(tmp_path), "info")
    assert r.exit_code == 1 and "directory" in r.stderr
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"not sqlite" * 1000)
    r = run(str(junk), "info")
    assert r.exit_code == 1 and r.stderr.startswith("Error: damaged:")
    newer = str(tmp_path / "newer.db")
    agentstate.open(newer).close()
    c = apsw.Connection(newer)
    c.pragma("user_version", 999)
    c.close()
    r = run(newer, "get", "app:x", "k")
    assert r.exit_code == 1 and r.stderr.startswith("Error: schema_too_new:")


def test_only_init_demo_and_serve_create_the_file(tmp_path):
    """Every other command refuses a missing file, naming it (SPEC §16): put, append,
    tokens create and runs import too, which made an empty store at a mistyped path."""
    (tmp_path / "dump").mkdir()
    for args in (["put", "app:a", "k", "1"], ["append", "app:a", "k", "[1]"], ["keys", "app:a"],
                 ["delete", "app:a", "k"], ["vacuum"], ["tokens", "create", "bob"],
                 ["runs", "import", str(tmp_path / "dump")], ["settings"]):
        p = str(tmp_path / f"{args[0]}-{args[1] if len(args) > 1 else ''}.db")
        r = run(p, *args)
        assert r.exit_code == 1 and f"no database at {p}" in r.stderr, (args, r.output)
        assert not os.path.exists(p), args
    p = str(tmp_path / "init.db")
    assert run(p, "init").exit_code == 0 and os.path.exists(p)


def test_an_admin_token_takes_no_grants(db_path):
    """tokens create --admin --grant: refused (invalid_value, exit 1), no token made: an
    admin is never restricted, so the grants would be a lie (SPEC §16)."""
    run(db_path, "init")
    r = run(db_path, "tokens", "create", "ops", "--admin", "--grant", "thread:t-1")
    assert r.exit_code == 1 and r.stderr.startswith("Error: invalid_value:")
    with agentstate.open(db_path) as db:
        assert db.tokens.list() == []
        with pytest.raises(agentstate.InvalidValue):
            db.tokens.create("ops", admin=True, grants=["thread:t-1"])
        assert db.tokens.list() == []


def test_check_reports_damage_with_location(db_path):
    with agentstate.open(db_path) as db:
        db.scope("session", "s").append("h", [1, 2, 3])
        db.runs.write("r", [{"seq": 0}, {"seq": 1}], None, create=True)
    assert run(db_path, "check").exit_code == 0
    c = apsw.Connection(db_path)
    c.execute("UPDATE kv SET length = 7 WHERE key = 'h'")
    c.execute("PRAGMA foreign_keys = OFF")
    c.execute("DROP TRIGGER run_entry_contiguous")
    c.execute("DELETE FROM run_entry WHERE seq = 0")
    c.close()
    r = run(db_path, "check")
    assert r.exit_code == 1
    assert "kv session:s h:" in r.output and "run r:" in r.output
    data = json.loads(run(db_path, "--json", "check").stdout)
    assert data["ok"] is False and len(data["problems"]) == 2


def test_info_json(db_path):
    run(db_path, "append", "session:s", "h", "[1, 2]")
    i = jrun(db_path, "info")
    assert set(i) >= {"path", "size_bytes", "wal_bytes", "schema_version", "durability", "counts"}
    assert i["counts"]["keys"] == 1 and i["counts"]["list_items"] == 2 and i["counts"]["scopes"] == 1


def test_runs_commands(db_path, tmp_path):
    with agentstate.open(db_path) as db:
        db.runs.write("r1", [{"seq": i} for i in range(5)], {"task": "t", "turn": 2}, create=True)
    assert [r["id"] for r in jrun(db_path, "runs", "list")] == ["r1"]
    assert "r1" in run(db_path, "runs", "list").output
    shown = jrun(db_path, "runs", "show", "r1", "--tail", "2")
    assert shown["entries"] == [{"seq": 3}, {"seq": 4}] and shown["snapshot"]["task"] == "t"
    out = tmp_path / "export"
    assert run(db_path, "runs", "export", "r1", str(out)).exit_code == 0
    other = str(tmp_path / "other.db")
    run(other, "init")
    assert jrun(other, "runs", "import", str(out)) == [{"run_id": "r1", "added": 5, "error": None}]
    assert jrun(other, "runs", "import", str(out)) == [{"run_id": "r1", "added": 0, "error": None}]
    (out / "r1" / "log.jsonl").write_text('{"seq": 0}\n{oops\n')
    r = run(other, "runs", "import", str(out))
    assert r.exit_code == 1 and "log.jsonl:2:" in r.stderr
    assert run(db_path, "runs", "delete", "r1").exit_code == 0
    assert jrun(db_path, "runs", "list") == []


def test_list_commands_page(db_path):
    alice = agentstate.Principal("alice")
    with agentstate.open(db_path) as db:
        for i in range(5):
            db.runs.write(f"r{i}", [], {"task": "t"}, create=True)
        s = db.sessions.create(alice)
        for _ in range(3):
            db.sessions.start_turn(s.id, alice).finish()
        db.sessions.create(alice)
    ids = [r["id"] for r in jrun(db_path, "runs", "list")]
    first = [r["id"] for r in jrun(db_path, "runs", "list", "--limit", "2")]
    rest = [r["id"] for r in jrun(db_path, "runs", "list", "--after", first[-1])]
    assert first + rest == ids and len(first) == 2
    assert len(jrun(db_path, "sessions", "list", "--limit", "1")) == 1
    turns = jrun(db_path, "sessions", "turns", s.id, "--limit", "2")
    older = jrun(db_path, "sessions", "turns", s.id, "--after", turns[-1]["id"])
    assert [t["n"] for t in turns + older] == [3, 2, 1]
    r = run(db_path, "runs", "list", "--after", "nope")
    assert r.exit_code == 1 and "nope" in r.stderr


def test_sessions_commands(db_path):
    alice = agentstate.Principal("alice")
    with agentstate.open(db_path) as db:
        s = db.sessions.create(alice)
        t = db.sessions.start_turn(s.id, alice)
    assert [x["id"] for x in jrun(db_path, "sessions", "list")] == [s.id]
    assert jrun(db_path, "sessions", "show", s.id)["active_turn"]["id"] == t.id
    assert jrun(db_path, "sessions", "turns", s.id)[0]["status"] == "running"
    r = run(db_path, "sessions", "release", s.id, input="n\n")
    assert r.exit_code == 1
    assert jrun(db_path, "sessions", "turns", s.id)[0]["status"] == "running"
    r = run(db_path, "sessions", "release", s.id, input="y\n")
    assert r.exit_code == 0 and "failed" in r.output
    r = run(db_path, "sessions", "release", s.id, "--yes")
    assert r.exit_code == 1 and "invalid_transition" in r.stderr


def test_backup_and_vacuum(db_path, tmp_path):
    with agentstate.open(db_path) as db:
        db.scope("app", "a").append("l", list(range(1000)))
    dest = str(tmp_path / "copy.db")
    assert run(db_path, "backup", dest).exit_code == 0
    assert oct(os.stat(dest).st_mode & 0o777) == "0o600"
    assert run(dest, "check").exit_code == 0
    with agentstate.open(dest) as db:
        assert db.scope("app", "a").length("l") == 1000
    r = run(db_path, "backup", dest)
    assert r.exit_code == 1 and "exists" in r.stderr
    assert jrun(db_path, "vacuum")["size_after"] > 0


def test_backup_while_another_process_writes(db_path, tmp_path):
    """An online backup while a second process writes is consistent and passes check."""
    with agentstate.open(db_path) as db:
        db.scope("app", "a").append("l", [{"pad": "x" * 500} for _ in range(2000)])
    writer = subprocess.Popen([sys.executable, "-c", f"""
import agentstate, time
db = agentstate.open({db_path!r}, durability="normal")
s = db.scope("app", "w")
t, i = time.time(), 0
while time.time() - t < 4:
    i += 1
    s.put(f"k{{i}}", {{"pad": "y" * 300}})
    db.runs.write("r", [], {{"t": time.time()}}, create=not db.runs.read("r"))
"""], cwd=os.path.dirname(agentstate.__file__) + "/..")
    try:
        dest = str(tmp_path / "live.db")
        import time
        time.sleep(0.5)
        r = run(db_path, "backup", dest)
        assert r.exit_code == 0, r.output
    finally:
        writer.wait(30)
    assert writer.returncode == 0
    with agentstate.open(dest) as db:
        assert db.check() == []
        assert db.scope("app", "a").length("l") == 2000


def test_installed_executable(tmp_path):
    """The console script runs as a program: exit codes and stderr as with CliRunner."""
    exe = shutil.which("agentstate")
    assert exe, "pip install . puts agentstate on PATH"
    db_path = str(tmp_path / "x.db")
    env = {**os.environ, "AGENTSTATE_DB": db_path}
    missing = subprocess.run([exe, "put", "app:a", "k", "[1]"], capture_output=True, text=True, env=env)
    assert missing.returncode == 1 and missing.stderr.startswith("Error: not_found:")  # SPEC §16
    assert not os.path.exists(db_path)
    assert subprocess.run([exe, "init"], capture_output=True, text=True, env=env).returncode == 0
    ok = subprocess.run([exe, "put", "app:a", "k", "[1]"], capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    got = subprocess.run([exe, "--json", "get", "app:a", "k"], capture_output=True, text=True, env=env)
    assert json.loads(got.stdout) == {"key": "k", "value": [1], "version": 1}
    bad = subprocess.run([exe, "put", "app:a", "k", "2", "--if-version", "9"],
                         capture_output=True, text=True, env=env)
    assert bad.returncode == 1 and bad.stderr.startswith("Error: version_conflict:")
    assert "Traceback" not in bad.stderr
    usage = subprocess.run([exe, "frobnicate"], capture_output=True, text=True, env=env)
    assert usage.returncode == 2
    mod = subprocess.run([sys.executable, "-m", "agentstate", "--json", "keys", "app:a"],
                         capture_output=True, text=True, env=env)
    assert json.loads(mod.stdout) == ["k"]


def test_backup_shows_a_progress_bar_on_a_terminal(tmp_path):
    """On a terminal, backup draws click's progress bar on stderr; piped, it prints none."""
    import pty

    db_path, dest = str(tmp_path / "a.db"), str(tmp_path / "b.db")
    with agentstate.open(db_path) as db:
        db.scope("app", "a").append("l", [{"pad": "x" * 900} for _ in range(1000)])
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "agentstate", "--db", db_path, "backup", dest],
                         stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(60) == 0
    text = out.decode(errors="replace")
    assert "backup" in text and "100%" in text and "backed up to" in text
    piped = subprocess.run([sys.executable, "-m", "agentstate", "--db", db_path, "backup",
                            str(tmp_path / "c.db")], capture_output=True, text=True)
    assert piped.returncode == 0 and "%" not in piped.stderr


def test_runs_show_marks_calls_without_a_result(db_path):
    """runs show names each claimed call with no result: in progress while its claim is
    live, in doubt once it lapsed (SPEC §14); settled calls are not marked."""
    import time

    with agentstate.open(db_path) as db:
        db.runs.write("r", [], None, create=True)
        db.runs.once("r", "paid", lambda: {"id": "ch_1"})
        db.runs.claim("r", "running")
        db.runs.claim("r", "lost", lease=0.01)
    time.sleep(0.05)
    shown = jrun(db_path, "runs", "show", "r")
    assert shown["open_calls"] == {"running": "in_progress", "lost": "in_doubt"}
    out = run(db_path, "runs", "show", "r").output.splitlines()
    assert [line.split("<- ")[1] for line in out if "<- " in line] == [
        "in progress: no result recorded",
        "in doubt: no result recorded (it may have run: reconcile it)"]
