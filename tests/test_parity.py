"""Calls that must answer the same on every backend and through the remote client (issue 26).

Run here on both backends, and again through ``agentstate.connect()`` by
tests/test_remote.py (which imports this module's tests).
"""

from __future__ import annotations

import asyncio
import json

import pytest

import agentstate
from agentstate import NotFound, Principal, RunNotFound

ALICE, ADMIN = Principal("alice"), Principal("ops", admin=True)


@pytest.fixture
def db(any_db):
    """Every test here runs on both backends: an SQLite file and a PostgreSQL schema."""
    return any_db


NOT_JSON = {"text": b"not json", "not UTF-8": b"\xff\xfe", "NaN": b"NaN", "trailing text": b"[1] x",
            "5,000 levels deep": b"[" * 5000 + b"]" * 5000}


@pytest.mark.parametrize("name", list(NOT_JSON))
def test_get_of_stored_bytes_that_are_not_json_is_a_json_decode_error(db, name):
    """SPEC §2 and §5: get, get_versioned, their async twins, update and
    ThreadStateStore.get_json of bytes that are not JSON raise json.JSONDecodeError
    (through the remote client they raised InvalidValue); the bytes stay as they were."""
    data = NOT_JSON[name]
    s = db.scope("thread", "t-1")
    s.put_bytes("raw", data)
    store = agentstate.ThreadStateStore("t-1", db=db)
    calls = {
        "get": lambda: s.get("raw"), "get_versioned": lambda: s.get_versioned("raw"),
        "aget": lambda: asyncio.run(s.aget("raw")),
        "aget_versioned": lambda: asyncio.run(s.aget_versioned("raw")),
        "update": lambda: s.update("raw", lambda v: v),
        "get_json": lambda: store.get_json("raw"),
    }
    for what, call in calls.items():
        with pytest.raises(json.JSONDecodeError):
            call()
            pytest.fail(f"{what} did not raise")
    assert s.get_bytes("raw") == data and store.get_json("absent") is None
    s.put_bytes("raw", b'{"a": [1]}')  # bytes that are JSON parse, with their version
    assert s.get_versioned("raw") == ({"a": [1]}, 2) and store.get_json("raw") == {"a": [1]}


def test_a_page_of_none_still_checks_what_it_is_asked(db):
    """limit=0 answers [] where the same call with a limit would answer: an unknown
    ``after``, or an unknown session, is still NotFound (remotely, limit=0 answered []
    without asking the store)."""
    s = db.sessions.create(ALICE)
    db.sessions.start_turn(s.id, ALICE)
    db.runs.write("r", [], None, create=True)
    with pytest.raises(NotFound):
        db.sessions.list(ADMIN, after="s-nope", limit=0)
    with pytest.raises(NotFound):
        db.sessions.turns("s-nope", ADMIN, limit=0)
    with pytest.raises(NotFound):
        db.sessions.turns(s.id, ALICE, after="t-nope", limit=0)
    with pytest.raises(NotFound):
        db.sessions.turns_by_status(ADMIN, after="t-nope", limit=0)
    with pytest.raises(RunNotFound):
        db.runs.list(after="nope", limit=0)
    assert db.sessions.list(ADMIN, limit=0) == db.sessions.list(ALICE, after=s.id, limit=0) == []
    assert db.sessions.turns(s.id, ALICE, limit=0) == db.sessions.turns_by_status(ALICE, limit=0) == []
    assert db.runs.list(limit=0) == db.runs.list(after="r", limit=0) == []
    assert len(db.sessions.list(ADMIN, limit=1)) == 1 and len(db.runs.list(limit=1)) == 1
