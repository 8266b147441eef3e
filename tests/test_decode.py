"""Reading stored JSON: the fast path (the scanner on compact text) gives what json does, errors included."""

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
