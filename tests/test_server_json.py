"""The server's bounded JSON: its parser agrees with json.loads and its page text with
json.dumps(indent=2) wherever they can run, and both stay bounded where those would not."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentstate.errors import InvalidValue, TooLarge
from agentstate.server import _json
from agentstate.server.ui import _render

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(), lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=40)


def _no_constants(name):
    raise ValueError(name)


@settings(max_examples=500, deadline=None)
@given(VALUES, st.sampled_from([None, 0, 2]))
def test_the_slow_parser_reads_what_json_loads_reads(value, indent):
    """The GIL-friendly parser is the C decoder's equal on every JSON text."""
    text = json.dumps(value, indent=indent, ensure_ascii=bool(indent))
    assert _json._parse_slowly(text, 10**9, 10**6) == json.loads(text)


@pytest.mark.parametrize("text", ["", "[", "]", "[1,]", '{"a"}', '{"a":1,}', "[1 2]", "NaN",
                                  "[Infinity]", "[-Infinity]", "-", "01", "{1:2}", "tru", '["a\\x"]',
                                  '"\x01"', " [ ] x", '{"a":1 "b":2}', "[1,,2]", '{"a" 1}'])
def test_the_slow_parser_refuses_what_json_loads_refuses(text):
    with pytest.raises(ValueError):
        json.loads(text, parse_constant=_no_constants)
    with pytest.raises(ValueError):
        _json._parse_slowly(text, 10**9, 10**6)
    with pytest.raises(InvalidValue):
        _json.parse(text.encode(), 10**9)


def test_parsing_a_hostile_body_is_bounded():
    """Past FAST_TOKENS the parse counts values and containers (TooLarge past their limits)
    and refuses depth past the store's, with no recursion to exhaust."""
    with pytest.raises(InvalidValue, match="deeper"):
        _json.parse(b"[" * 100_000, 10**6)
    with pytest.raises(InvalidValue, match="deeper"):
        _json.parse(b'{"a":' * 100_000 + b"1" + b"}" * 100_000, 10**6)
    with pytest.raises(TooLarge) as values:  # 1.2 million numbers, 2.4 MB
        _json.parse(b"[" + b",".join([b"0"] * 1_200_000) + b"]", 1_000_000)
    assert (values.value.size, values.value.limit) == (1_000_001, 1_000_000)
    with pytest.raises(TooLarge) as containers:  # 600,000 arrays, 1.8 MB
        _json.parse(b"[" + b",".join([b"[]"] * 600_000) + b"]", 1_000_000)
    assert (containers.value.size, containers.value.limit) == (250_001, 250_000)
    assert _json.parse(b"[" + b",".join([b"[]"] * 100_000) + b"]", 10**6) == [[]] * 100_000


def test_parsing_a_big_body_lets_other_threads_run():
    """The C decoder holds the GIL for a whole parse (one gap as long as the parse, in
    which no other thread runs); past FAST_TOKENS the parse lets them in all along."""
    body = b"[" + b",".join([b"0"] * 3_000_000) + b"]"  # numbers: no garbage collector pauses
    gaps, done = [], threading.Event()

    def tick():
        last = time.perf_counter()
        while not done.is_set():
            time.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        t0 = time.perf_counter()
        assert len(_json.parse(body, 10**8)) == 3_000_000
        took = time.perf_counter() - t0
    finally:
        done.set()
        ticker.join()
    assert max(gaps) < took / 3, (max(gaps), took)  # the C decoder: max(gaps) ~ took


@settings(max_examples=500, deadline=None)
@given(VALUES)
def test_page_text_is_json_dumps_until_its_cap(value):
    """Ordinary values look as they did (json.dumps, indent=2); the cap cuts, and says so."""
    whole = json.dumps(value, indent=2, ensure_ascii=False)
    assert _render.text(value, 10**9) == (whole, False)
    assert _render.text(value, 10**9, indent=False)[0] == json.dumps(value, ensure_ascii=False)
    cut, truncated = _render.text(value, 9)
    assert cut == whole[:9] and truncated == (len(whole) > 9)


def test_deep_values_make_bounded_text_quickly():
    """100 KB of lists nested 500 deep: json.dumps(indent=2) made 50 MB of it."""
    one: list = []
    for _ in range(498):
        one = [one]
    value = [one] * 100
    t0 = time.perf_counter()
    text, truncated = _render.text(value, _render.VALUE_CAP)
    assert truncated and len(text) == _render.VALUE_CAP
    assert max(len(line) - len(line.lstrip()) for line in text.splitlines()) <= 2 * _render.MAX_INDENT
    assert time.perf_counter() - t0 < 2
    _render.start_page()
    shown = [_render.pretty(value) for _ in range(30)]
    assert sum(len(s.text) for s in shown) <= _render.PAGE_CAP  # the page's budget
    assert shown[-1].truncated and shown[-1].text == ""
