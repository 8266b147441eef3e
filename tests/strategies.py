"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

from hypothesis import strategies as st

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# Any text SQLite and JSON can carry: no NUL, no lone surrogates.
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
KEY_CHARS = "ABCXYZabcxyz0189._:-"
KEYS = st.text(KEY_CHARS, min_size=1, max_size=200)

SCALARS = st.none() | st.booleans() | INT64 | st.floats(allow_nan=False, allow_infinity=False) | TEXT
JSON = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(TEXT, children, max_size=5),
    max_leaves=30,
)


def nested(depth: int) -> list:
    """A list nested ``depth`` levels deep: nested(1) == [], nested(2) == [[]]."""
    v: list = []
    for _ in range(depth - 1):
        v = [v]
    return v


def as_stored(v):
    """What must come back for v: tuples are stored as lists."""
    if isinstance(v, (list, tuple)):
        return [as_stored(x) for x in v]
    if isinstance(v, dict):
        return {k: as_stored(x) for k, x in v.items()}
    return v
