"""Validation and encoding of keys and values (SPEC §2), with hypothesis."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentstate import InvalidKey, InvalidValue, TooLarge

from .conftest import digest, on_postgres
from .strategies import as_stored, JSON, KEYS, nested

MIB = 1024 * 1024


@pytest.fixture
def db(any_db):
    """Every test here runs on both backends: an SQLite file and a PostgreSQL schema."""
    return any_db


def same(a, b) -> bool:
    """Equality that also tells 0.0 from -0.0 and int from float."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and type(a) is type(b)


@settings(max_examples=150)
@given(value=JSON, key=KEYS)
def test_every_json_value_round_trips(db, value, key):
    """Every valid JSON value comes back equal, with its version."""
    s = db.scope("user", "u1")
    version = s.put(key, value)
    got = s.get_versioned(key)
    assert same(got.value, as_stored(value))
    assert got.version == version
    assert json.loads(s.get_bytes(key)) == as_stored(value)


@settings(max_examples=60)
@given(items=st.lists(JSON, max_size=8), more=st.lists(JSON, max_size=8))
def test_lists_round_trip_through_append_and_slice(db, items, more):
    """A list put and appended to reads back whole, by slice and by get."""
    s = db.scope("thread", "t")
    s.put("l", items)
    s.append("l", more)
    want = as_stored(items) + as_stored(more)
    assert s.get("l") == want
    assert s.length("l") == len(want)
    assert s.slice("l", 1, -1) == want[1:-1]


BAD_VALUES = [
    float("nan"),
    float("inf"),
    -float("inf"),
    {"a": [1, float("nan")]},
    2**63,
    -(2**63) - 1,
    [2**64],
    "a\x00b",
    {"k\x00": 1},
    "\ud800",
    {"\udfff": 1},
    ["ok", "x\ud83d"],
    {1: "int key"},
    {None: 1},
    {(1, 2): 1},
    {1, 2},
    b"bytes",
    object(),
    nested(513),
    {"a": nested(512)},
    complex(1, 2),
]


@pytest.mark.slow_on_postgres  # refused above the store: PostgreSQL's case runs in CI's -m slow
@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
def test_invalid_values_are_refused_and_change_nothing(db, value):
    """Each invalid value raises InvalidValue, for put and append, and writes nothing."""
    s = db.scope("app", "a")
    s.put("existing", [1])
    before = digest(db)
    with pytest.raises(InvalidValue):
        s.put("k", value)
    with pytest.raises(InvalidValue):
        s.append("existing", [value])
    with pytest.raises(InvalidValue):
        s.put("existing", value, if_version=1)
    assert digest(db) == before
    assert s.get("k") is None and s.get("existing") == [1]


@pytest.mark.slow_on_postgres  # refused above the store: PostgreSQL's case runs in CI's -m slow
@settings(max_examples=100)
@given(
    value=st.one_of(
        st.floats(allow_nan=True).filter(lambda f: f != f or f in (float("inf"), float("-inf"))),
        st.integers().filter(lambda i: not -(2**63) <= i < 2**63),
        st.text(min_size=1).map(lambda t: t + "\x00"),
        st.sampled_from(["\ud800", "\udbff", "\udc00"]).map(lambda s: "x" + s),
        st.dictionaries(st.integers() | st.booleans() | st.none(), st.none(), min_size=1),
        st.sets(st.integers(), min_size=0, max_size=3),
        st.binary(),
    ),
    wrap=st.integers(0, 3),
)
def test_hypothesis_invalid_values_refused_unchanged(db, value, wrap):
    """Random invalid values, nested or not, are refused and leave the file as it was."""
    for _ in range(wrap):
        value = {"v": [value]}
    s = db.scope("agent", "bot")
    before = digest(db)
    with pytest.raises(InvalidValue):
        s.put("x", value)
    assert digest(db) == before


def test_depth_limit_is_exactly_512(db):
    """[] is one level: 512 levels are stored, 513 are InvalidValue, no RecursionError."""
    s = db.scope("app", "a")
    s.put("deep", nested(512))
    assert s.get("deep") == nested(512)
    for depth in (513, 100_000):
        with pytest.raises(InvalidValue):
            s.put("deep2", nested(depth))
    d: dict = {}
    for _ in range(600):
        d = {"a": d}
    with pytest.raises(InvalidValue):
        s.put("deep3", d)


def test_int64_bounds(db):
    s = db.scope("app", "a")
    for v in (2**63 - 1, -(2**63)):
        s.put("i", v)
        assert s.get("i") == v


@pytest.mark.slow_on_postgres  # refused above the store: PostgreSQL's case runs in CI's -m slow
@pytest.mark.parametrize(
    "key",
    ["", "x" * 201, "a b", "a/b", "é", "a\x00", "a\n", "a*", "a%", 5, None, b"k", "k\n"],
    ids=repr,
)
def test_invalid_keys(db, key):
    """Keys and scope ids outside 1-200 characters of A-Za-z0-9._:- are InvalidKey."""
    s = db.scope("app", "a")
    with pytest.raises(InvalidKey):
        s.put(key, 1)
    with pytest.raises(InvalidKey):
        s.get(key)
    with pytest.raises(InvalidKey):
        db.scope("app", key)


def test_key_boundaries(db):
    s = db.scope("app", "x" * 200)
    s.put("k" * 200, 1)
    assert s.get("k" * 200) == 1
    assert s.list() == ["k" * 200]


@pytest.mark.slow_on_postgres  # refused above the store: PostgreSQL's case runs in CI's -m slow
@pytest.mark.parametrize("kind", ["global", "Session", "", None, "thread "])
def test_invalid_scope_kinds(db, kind):
    with pytest.raises(InvalidKey):
        db.scope(kind, "x")


def test_size_limit_is_exactly_one_mib_of_utf8_json(db):
    """A value of exactly 1 MiB of compact UTF-8 JSON is stored; one byte more is TooLarge."""
    s = db.scope("app", "a")
    exact = "x" * (MIB - 2)  # plus two quotes
    s.put("big", exact)
    assert s.get("big") == exact
    before = digest(db)
    with pytest.raises(TooLarge) as e:
        s.put("big2", exact + "x")
    assert (e.value.size, e.value.limit) == (MIB + 1, MIB)
    # Non-ASCII counts in UTF-8 bytes, not characters: "é" is 2 bytes.
    with pytest.raises(TooLarge):
        s.put("big3", "é" * (MIB // 2))
    with pytest.raises(TooLarge):
        s.put_bytes("b", b"x" * (MIB + 1))
    assert digest(db) == before
    s.put_bytes("b", b"x" * MIB)


def test_list_limit_counts_the_whole_list_after_append(db):
    """Appends are refused once the list's JSON would pass 1 MiB; the list stays as it was."""
    s = db.scope("app", "a")
    item = "y" * 998  # 1,000 bytes of JSON each
    n = (MIB - 2 + 1) // 1001  # items with commas that fit
    for i in range(0, n, 100):
        s.append("l", [item] * min(100, n - i))
    assert s.length("l") == n
    size = 2 + n * 1000 + (n - 1)
    rest = MIB - size - 1  # room for one more item after a comma
    s.append("l", ["z" * (rest - 2)])  # exactly 1 MiB now
    assert len(json.dumps(s.get("l"), separators=(",", ":"))) == MIB
    before = digest(db)
    with pytest.raises(TooLarge) as e:
        s.append("l", [0])
    assert e.value.size == MIB + 2
    assert digest(db) == before
    assert s.length("l") == n + 1


def test_non_ascii_is_stored_as_raw_utf8(db):
    """Values are JSON text with raw UTF-8, so the sqlite3 shell (or psql) sees the characters."""
    s = db.scope("app", "a")
    s.put("greeting", {"text": "héllo ✓ 😀"})
    text = "value::text" if on_postgres(db) else "value"  # a json column, as psql prints it
    raw = db._store.query(f"SELECT {text}, size FROM kv WHERE key = 'greeting'")[0]
    assert raw[0] == '{"text":"héllo ✓ 😀"}'
    assert raw[1] == len(raw[0].encode("utf-8"))


def test_tuples_are_stored_as_lists(db):
    s = db.scope("app", "a")
    s.put("t", (1, (2, 3)))
    assert s.get("t") == [1, [2, 3]]


def test_get_of_bytes_parses_json_or_raises_decode_error(db):
    """get() of a bytes value parses it: JSONDecodeError for non-JSON and non-UTF-8."""
    s = db.scope("app", "a")
    s.put_bytes("j", b'{"a": 1}')
    assert s.get("j") == {"a": 1}
    for bad in (b"\xff\xfe", b"not json", b"NaN"):
        s.put_bytes("bad", bad)
        with pytest.raises(json.JSONDecodeError):
            s.get("bad")
    assert s.get_bytes("bad") == b"NaN"


# -- the two encoder paths (agentstate._encoding) -------------------------------------
# encode() writes with json's C encoder made once and reused (_encoding._encoder);
# where that is unavailable it falls back to json.JSONEncoder.encode (_dumps).
# Both must give the same bytes and the same refusals.


def _both_paths(value):
    """encode(value) on the reused C encoder, then on the fallback: each result or exception type."""
    from unittest import mock

    from agentstate import _encoding

    out = []
    for enc in (_encoding._encoder, None):
        with mock.patch.object(_encoding, "_encoder", enc):
            try:
                out.append(_encoding.encode(value))
            except Exception as e:  # noqa: BLE001 - compared below
                out.append(type(e))
    return out


def test_the_reused_c_encoder_is_in_use():
    from agentstate import _encoding

    assert _encoding._encoder is not None  # CPython: the fast path is the one tested above


@settings(max_examples=300)
@given(value=JSON)
def test_both_encoder_paths_write_the_same_compact_utf8_json(value):
    fast, fallback = _both_paths(value)
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    assert fast == fallback == (text, len(text.encode("utf-8")))


@pytest.mark.parametrize("value", BAD_VALUES, ids=lambda v: type(v).__name__)
def test_both_encoder_paths_refuse_every_invalid_value(value):
    assert _both_paths(value) == [InvalidValue, InvalidValue]


@settings(max_examples=100)
@given(
    value=st.one_of(
        st.floats(allow_nan=True).filter(lambda f: f != f or f in (float("inf"), float("-inf"))),
        st.integers().filter(lambda i: not -(2**63) <= i < 2**63),
        st.text(min_size=1).map(lambda t: t + "\x00"),
        st.sampled_from(["\ud800", "\udbff", "\udc00"]).map(lambda s: "x" + s),
        st.dictionaries(st.integers() | st.booleans() | st.none(), st.none(), min_size=1),
    ),
    wrap=st.integers(0, 3),
)
def test_both_encoder_paths_refuse_random_invalid_values(value, wrap):
    for _ in range(wrap):
        value = [{"v": value}]
    assert _both_paths(value) == [InvalidValue, InvalidValue]


def test_a_value_that_contains_itself_is_refused_on_both_paths():
    """The reused encoder does not look for cycles: check_value's depth limit refuses them first."""
    loop: list = []
    loop.append(loop)
    d: dict = {}
    d["self"] = [d]
    for v in (loop, d, {"a": [loop]}):
        assert _both_paths(v) == [InvalidValue, InvalidValue]
