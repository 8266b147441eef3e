"""Reads: stored JSON parsed on the fast path gives what json gives, errors included; a read
through Store.call_read translates driver errors."""

from __future__ import annotations

import json

import pytest

from agentstate._encoding import decode


@pytest.mark.parametrize("text", [
    '{"a":1}', ' {"a": 1} ', '{"a":1}\n', '[1,2]', '"x"', "1", "1 ", "-0", "1e400", "true", "null",
    '"\\ud800"', '{"é":["\\u2028",2.5]}',
])
def test_decode_gives_what_json_gives(text):
    """Compact text (the fast path) and text with whitespace around it (the full parse) alike."""
    assert decode(text) == json.loads(text)
    assert decode(text.encode("utf-8")) == json.loads(text)


@pytest.mark.parametrize("text", ["", "nul", "[1,2]x", '{"a":1', "NaN", "[Infinity]", '{"a":-Infinity}', " "])
def test_decode_refuses_what_is_not_json(text):
    """Not JSON, trailing text, and the NaN/Infinity literals are JSONDecodeError on both paths."""
    with pytest.raises(json.JSONDecodeError):
        decode(text)


def test_decode_of_deep_nesting_is_a_decode_error():
    with pytest.raises(json.JSONDecodeError, match="nested too deeply"):
        decode("[" * 100_000)


def test_a_read_translates_driver_errors(db, monkeypatch):
    """get runs through Store.call_read: a driver error leaves as an agentstate error, and a
    closed database refuses the read."""
    import apsw

    import agentstate
    from agentstate.backends.sqlite import kv as _kv

    s = db.scope("app", "a")
    s.put("k", {"v": 1})

    def broken(c, *args):
        raise apsw.IOError("disk I/O error")

    monkeypatch.setattr(_kv, "get", broken)
    with pytest.raises(agentstate.StorageError):
        s.get("k")
    monkeypatch.undo()
    assert s.get("k") == {"v": 1}
    db.close()
    with pytest.raises(agentstate.Closed):
        s.get("k")
