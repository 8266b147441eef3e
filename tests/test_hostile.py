"""Hostile input: anything is either accepted and round-trips, or refused with its SPEC §6
class and leaves the file unchanged. Nothing else escapes."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate import AgentStateError
from agentstate.cli import cli

from .conftest import file_digest
from .strategies import as_stored, JSON, nested

MIB = 1024 * 1024
ANY_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)
KEYISH = st.one_of(
    ANY_TEXT, st.text("abc._:-%* /\x00é", max_size=210), st.sampled_from(["x" * 200, "x" * 201, ""]),
    st.integers(), st.none(), st.binary(max_size=10), st.floats(), st.lists(st.integers(), max_size=2),
)
WEIRD = st.one_of(
    st.floats(), st.integers(min_value=-(2**70), max_value=2**70), ANY_TEXT, st.binary(max_size=20),
    st.sets(st.integers(), max_size=2), st.complex_numbers(), st.just(object()), st.just(nested(513)),
    st.just(nested(512)), st.just(float("nan")),
)
DICT_KEYS = st.one_of(ANY_TEXT, st.integers(), st.none(), st.booleans(), st.floats(allow_nan=False),
                      st.binary(max_size=4), st.tuples(st.integers(0, 2)))
HOSTILE = st.recursive(
    WEIRD | JSON,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(DICT_KEYS, c, max_size=3) | st.tuples(c, c),
    max_leaves=8,
)


def attempt(db_path, fn):
    """Run fn; return (ok, result). A refusal must be an agentstate error and change nothing."""
    before = file_digest(db_path)
    try:
        return True, fn()
    except AgentStateError:
        assert file_digest(db_path) == before
        return False, None


@settings(max_examples=200)
@given(kind=st.sampled_from(["session", "agent", "galaxy", ""]) | KEYISH, sid=KEYISH, key=KEYISH, value=HOSTILE)
def test_put_anything(db, db_path, kind, sid, key, value):
    ok, _ = attempt(db_path, lambda: db.scope(kind, sid).put(key, value))
    if ok:
        assert json.dumps(db.scope(kind, sid).get(key), sort_keys=True) == json.dumps(as_stored(value), sort_keys=True)


@settings(max_examples=150)
@given(key=KEYISH, items=HOSTILE | st.lists(HOSTILE, max_size=4))
def test_append_anything(db, db_path, key, items):
    s = db.scope("session", "h")
    ok, r = attempt(db_path, lambda: s.append(key, items))
    if ok:
        assert r.length == s.length(key)
        if items:
            assert s.slice(key, -len(items)) == as_stored(items)


@settings(max_examples=150)
@given(run_id=KEYISH, entries=HOSTILE | st.lists(st.fixed_dictionaries({"seq": st.integers(-2, 3)}, optional={"x": HOSTILE}), max_size=3),
       snapshot=HOSTILE, create=st.booleans())
def test_run_write_anything(db, db_path, run_id, entries, snapshot, create):
    ok, _ = attempt(db_path, lambda: db.runs.write(run_id, entries, snapshot, create=create))
    if ok:
        rec = db.runs.read(run_id)
        assert rec is not None
        if snapshot is not None:
            assert rec.snapshot == as_stored(snapshot)


@settings(max_examples=100)
@given(name=KEYISH, admin=st.booleans() | st.integers(0, 2) | st.none(), sid=KEYISH, data=HOSTILE)
def test_sessions_anything(db, db_path, name, admin, sid, data):
    try:
        p = agentstate.Principal(name, admin=admin)
    except AgentStateError:
        return
    attempt(db_path, lambda: db.sessions.get(sid, p))
    ok, s = attempt(db_path, lambda: db.sessions.create(p, metadata=data))
    if ok:
        attempt(db_path, lambda: db.sessions.start_turn(s.id, p, input=data).finish(data))


@settings(max_examples=150)
@given(args=st.lists(ANY_TEXT | st.sampled_from(
    ["get", "put", "append", "delete", "keys", "runs", "sessions", "show", "import", "--json",
     "--if-version", "-1", "app:x", "session:", ":x", "-", "[1]", "{}", "NaN", "\x00"]), max_size=5),
       stdin=st.binary(max_size=40) | ANY_TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")))
def test_cli_arguments(tmp_path_factory, args, stdin):
    """Any command line and any stdin (bytes, as a real stdin is) exits 0, 1 or 2 with no
    traceback and no stray exception."""
    db_path = str(tmp_path_factory.mktemp("cli") / "c.db")
    if any("\x00" in a for a in args):
        return  # a real argv cannot carry NUL
    r = CliRunner().invoke(cli, ["--db", db_path, *args], input=stdin)
    assert r.exit_code in (0, 1, 2), (args, r.output)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, repr(r.exception))
    assert "Traceback" not in r.output


def test_boundary_sizes(db, db_path):
    """Exactly 1 MiB and 200-character keys are accepted; one more byte or character is refused."""
    s = db.scope("app", "b")
    s.put("k" * 200, "x" * (MIB - 2))
    assert len(s.get("k" * 200)) == MIB - 2
    for fn, err in ((lambda: s.put("k" * 201, 1), agentstate.InvalidKey),
                    (lambda: s.put("k", "x" * (MIB - 1)), agentstate.TooLarge),
                    (lambda: s.put_bytes("k", b"\xff" * (MIB + 1)), agentstate.TooLarge),
                    (lambda: db.runs.write("r", [{"seq": 0, "x": "y" * (16 * MIB)}], None, create=True),
                     agentstate.TooLarge)):
        before = file_digest(db_path)
        with pytest.raises(err):
            fn()
        assert file_digest(db_path) == before
    s.put_bytes("b", b"\xff" * MIB)
    assert s.get_bytes("b") == b"\xff" * MIB
    with pytest.raises(json.JSONDecodeError):
        s.get("b")
