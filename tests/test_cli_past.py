"""The command's past (SPEC §17): history, diff, restore, and --as-of on get and keys, on a
file and on PostgreSQL, as people read them and as JSON."""

from __future__ import annotations

import base64
import json

from click.testing import CliRunner

from agentstate.cli import cli

from .conftest import digest, target


def run(db, *args):
    r = CliRunner().invoke(cli, ["--db", target(db), *args])
    assert "Traceback" not in r.output, r.output
    return r


def jrun(db, *args):
    r = run(db, "--json", *args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def _story(db):
    """settings dark -> light, a list of two then deleted, bytes; the seq between."""
    s = db.scope("user", "u-7")
    s.put("settings", {"theme": "dark"})
    s.append("log", [1, 2])
    s.put_bytes("raw", b"\xff")
    then = db.last_change()
    s.put("settings", {"theme": "light"})
    s.delete("log")
    s.put("later", 1)
    return s, then


def test_get_and_keys_as_of_a_change(any_db):
    db = any_db
    _s, then = _story(db)
    assert jrun(db, "get", "user:u-7", "settings", "--as-of", str(then)) == {
        "key": "settings", "value": {"theme": "dark"}, "version": 1}
    assert jrun(db, "get", "user:u-7", "settings")["value"] == {"theme": "light"}
    assert jrun(db, "keys", "user:u-7", "--as-of", str(then)) == ["log", "raw", "settings"]
    assert jrun(db, "keys", "user:u-7", "--as-of", str(then), "--prefix", "l") == ["log"]
    r = run(db, "get", "user:u-7", "later", "--as-of", str(then))
    assert r.exit_code == 1 and f"not_found: no key 'later' in user:u-7 as of change {then}" in r.output
    r = run(db, "get", "user:u-7", "settings", "--as-of", str(db.last_change() + 1))
    assert r.exit_code == 1 and "invalid_value" in r.output and "past the newest change" in r.output
    assert run(db, "get", "user:u-7", "settings", "--as-of", "-1").exit_code == 2
    r = run(db, "get", "user:u-7", "settings", "--as-of", str(then))
    assert r.stdout == '{"theme": "dark"}\n'


def test_history_prints_each_revision_newest_first(any_db):
    db = any_db
    s, _then = _story(db)
    s.put_bytes("raw", b"\x00")
    got = jrun(db, "history", "user:u-7", "settings")
    assert [(r["version"], r["op"], r["value"], r["type"]) for r in got] == [
        (2, "put", {"theme": "light"}, "json"), (1, "put", {"theme": "dark"}, "json")]
    assert all(r["at"].endswith("Z") for r in got)
    assert [base64.b64decode(r["value"]) for r in jrun(db, "history", "user:u-7", "raw")] \
        == [b"\x00", b"\xff"]
    assert len(jrun(db, "history", "user:u-7", "settings", "--limit", "1")) == 1
    assert jrun(db, "history", "user:u-7", "settings", "--since", str(got[0]["seq"])) == []
    text = run(db, "history", "user:u-7", "log").output.splitlines()
    assert text[0].split() == ["SEQ", "AT", "OP", "VERSION", "VALUE"]
    assert text[1].split()[3:] == ["delete", "1"] and text[2].split()[3:] == ["append", "1", "[1,", "2]"]
    assert run(db, "history", "user:u-7", "never").output == "no history of 'never' in user:u-7\n"
    assert "bytes:AA==" in run(db, "history", "user:u-7", "raw").output


def test_diff_prints_what_changed_between_two_changes(any_db):
    db = any_db
    _s, then = _story(db)
    db.scope("app", "other").put("x", 1)
    got = jrun(db, "diff", str(then))
    assert [(d["kind"], d["scope_id"], d["key"]) for d in got] == [
        ("app", "other", "x"), ("user", "u-7", "later"), ("user", "u-7", "log"),
        ("user", "u-7", "settings")]
    assert got[3]["before"] == {"value": {"theme": "dark"}, "version": 1, "type": "json"}
    assert [d["key"] for d in jrun(db, "diff", str(then), "--scope", "user:u-7", "--key", "log")] == ["log"]
    assert [d["scope_id"] for d in jrun(db, "diff", str(then), "--scope", "app")] == ["other"]
    assert jrun(db, "diff", str(then), str(then)) == []
    text = run(db, "diff", str(then), "--scope", "user:u-7").output
    assert "user:u-7 settings  v1 -> v2\n  - {\"theme\": \"dark\"}\n  + {\"theme\": \"light\"}\n" in text
    assert "user:u-7 log  v1 -> v0\n  - [1, 2]\n  + (absent)\n" in text
    assert run(db, "diff", str(db.last_change())).output == "no key changed\n"
    r = run(db, "diff", str(db.last_change()), "0")
    assert r.exit_code == 1 and "invalid_value" in r.output


def test_restore_puts_a_scope_back(any_db):
    db = any_db
    s, then = _story(db)
    r = run(db, "restore", "user:u-7", "--at", str(then), "--key", "settings")
    assert (r.exit_code, r.output) == (0, f"restored 1 key of user:u-7 to change {then}\n")
    assert (s.get("settings"), s.get("log"), s.get("later")) == ({"theme": "dark"}, None, 1)
    assert jrun(db, "restore", "user:u-7", "--at", str(then)) == {"restored": 2}
    assert (s.get("log"), s.list()) == ([1, 2], ["log", "raw", "settings"])
    before = digest(db)
    r = run(db, "restore", "user:u-7", "--at", str(db.last_change() + 1))
    assert r.exit_code == 1 and "invalid_value" in r.output
    assert run(db, "restore", "user:u-7").exit_code == 2  # --at is needed
    r = run(db, "restore", "user:u-7", "--at", str(then), "--key", "bad key")
    assert r.exit_code == 1 and "invalid_key" in r.output
    assert digest(db) == before
