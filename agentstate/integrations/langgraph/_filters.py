"""Search filters as LangGraph's SQLite store applies them (``json_extract`` comparisons),
in Python: the store filters the items it reads."""

from __future__ import annotations

import json
import re
from typing import Any

_FILTER_KEY = re.compile(r"^[a-zA-Z0-9_.-]+$")
_OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
_NUMBER_PREFIX = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def check_filter(filter: dict[str, Any] | None) -> None:
    for key, want in (filter or {}).items():
        if not isinstance(key, str) or not _FILTER_KEY.match(key):
            raise ValueError(
                f"Invalid filter key: '{key}'. Filter keys must contain only alphanumeric "
                "characters, underscores, dots, and hyphens."
            )
        if isinstance(want, dict):
            for op in want:
                if op not in _OPERATORS:
                    raise ValueError(f"Unsupported operator: {op}")


def matches(value: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    """LangGraph's SQLite store's filter semantics (``json_extract`` comparisons):
    a dotted key walks into objects; a dict of operators compares."""
    for key, want in (filter or {}).items():
        have: Any = value
        for part in key.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        tests = want.items() if isinstance(want, dict) else [("$eq", want)]
        if not all(_compare(have, op, w) for op, w in tests):
            return False
    return True


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float))  # a JSON true reads back as 1 in SQL, and bool is int


def _equal(have: Any, want: Any) -> bool:
    if want is None:
        return have is None
    if isinstance(want, str):
        return isinstance(have, str) and have == want
    if _is_number(want):
        return _is_number(have) and have == want
    return have == want


def _real(v: Any) -> float:
    """SQLite's ``CAST(v AS REAL)``: numbers as they are, text by its numeric prefix."""
    if _is_number(v):
        return float(v)
    m = _NUMBER_PREFIX.match(v) if isinstance(v, str) else None
    return float(m.group(0)) if m else 0.0


def _compare(have: Any, op: str, want: Any) -> bool:
    if op == "$eq":
        return _equal(have, want)
    if op == "$ne":
        return have is not None and not _equal(have, want)
    if have is None or want is None:
        return False
    if _is_number(want):
        a, b = _real(have), float(want)
    elif isinstance(want, str):
        if isinstance(have, (dict, list)):
            have = json.dumps(have, separators=(",", ":"), ensure_ascii=False)
        if not isinstance(have, str):  # in SQL, every number sorts before every text
            return op in ("$lt", "$lte")
        a, b = have, want  # type: ignore[assignment]
    else:
        return False
    return {"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op]
