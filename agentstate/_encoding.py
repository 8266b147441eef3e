"""Validation and encoding: the one place that checks keys and values.

Values are checked in one iterative walk (no recursion, so no RecursionError
at any depth) and then encoded by the C json encoder into compact UTF-8 JSON.
Lone surrogates are caught by that final UTF-8 encode.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from typing import Any

from .errors import InvalidKey, InvalidValue, TooLarge

MAX_KEY = 200
MAX_VALUE = 1024 * 1024  # bytes of compact JSON, for a value and for a whole list
MAX_DEPTH = 512  # [] is 1 level
INT_MIN, INT_MAX = -(2**63), 2**63 - 1
_INFINITIES = (float("inf"), float("-inf"))
SCOPE_KINDS = ("thread", "session", "agent", "user", "app")

_KEY = re.compile(r"[A-Za-z0-9._:\-]{1,200}")
_PREFIX = re.compile(r"[A-Za-z0-9._:\-]{0,200}")
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


def _refuse(o: Any) -> Any:
    raise TypeError(f"{type(o).__name__} is not JSON serializable")


def _one_encoder() -> Any:
    """The C encoder that ``_dumps`` builds afresh on every call, built once.

    ``JSONEncoder.encode`` makes a new ``c_make_encoder`` object (and a dict to
    detect cycles) per value; made once and reused, the same C code writes the
    same bytes ~1.5 µs sooner per value. No cycle detection is needed: every
    value is walked by ``check_value`` first, and a cycle is refused there as
    nesting deeper than MAX_DEPTH. None (use ``_dumps``) where the C encoder is
    missing or does not give ``_dumps``'s bytes on a probe.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        enc = make(None, _refuse, json.encoder.encode_basestring, None, ":", ",", False, False, False)
        probe = {"é": [1, -2.5, 1e-07, True, None, "a\"b\n\u2028"], "": {}}
        if "".join(enc(probe, 0)) != _dumps(probe):
            return None
    except Exception:
        return None
    return enc


_encoder = _one_encoder()


def _reject_constant(name: str) -> Any:
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


# Stored text is always strict JSON; bytes values may be anything, so NaN and
# Infinity literals are refused when parsing them too.
_decoder = json.JSONDecoder(parse_constant=_reject_constant)
_loads = _decoder.decode
# The decoder's scanner, called directly: ``decode`` above first skips
# whitespace and then checks for trailing text, each with a regex; agentstate
# stores compact JSON, which has none, so a read parses ~0.7 µs sooner
# (benchmarks/PYTHON-COST.md). Anything else takes ``_loads`` (see decode()).
_scan: Any = getattr(_decoder, "scan_once")  # noqa: B009 (set by JSONDecoder.__init__)


def check_key(key: Any, what: str = "key") -> str:
    """Return ``key`` if it follows the key rules, else raise InvalidKey."""
    if type(key) is not str or _KEY.fullmatch(key) is None:
        raise InvalidKey(
            f"{what} must be 1-{MAX_KEY} characters of A-Z a-z 0-9 . _ : -, got {_show(key)}"
        )
    return key


def is_key(s: str) -> bool:
    """Whether a string follows the key rules (ids that cannot exist need no lookup)."""
    return _KEY.fullmatch(s) is not None


def check_int(name: str, v: Any, lo: int = 0) -> int:
    """An int in [lo, 2**63-1] (what SQLite can bind); else InvalidValue."""
    if type(v) is not int or not lo <= v <= INT_MAX:
        raise InvalidValue(f"{name} must be an integer from {lo} to {INT_MAX}, got {_show(v)}")
    return v


def check_kind(kind: Any) -> str:
    if kind not in SCOPE_KINDS or type(kind) is not str:
        raise InvalidKey(f"scope kind must be one of {', '.join(SCOPE_KINDS)}, got {_show(kind)}")
    return kind


def prefix_ok(prefix: Any) -> bool:
    """Whether some key could start with ``prefix`` (else listing gives [])."""
    if type(prefix) is not str:
        raise InvalidKey(f"prefix must be a string, got {_show(prefix)}")
    return _PREFIX.fullmatch(prefix) is not None


def _show(x: Any) -> str:
    r = repr(x)
    return r if len(r) <= 60 else r[:57] + "..."


def check_value(value: Any) -> None:
    """Raise InvalidValue unless ``value`` is storable JSON (SPEC §2)."""
    t = type(value)
    if t is str:
        if "\x00" in value:
            raise InvalidValue("strings may not contain NUL (U+0000)")
        return
    if t is int or t is bool or value is None:
        if t is int and not INT_MIN <= value <= INT_MAX:
            raise InvalidValue(f"integer {value} is outside the signed 64-bit range")
        return
    # Containers and everything else: an explicit stack of (value, depth).
    # Children of the common exact scalar types are checked in place; only
    # containers (and anything unusual) go on the stack.
    stack = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        v, depth = pop()
        # Containers first: they are most of what the stack holds (no object is
        # both a container and a str/int/float, so the order changes no verdict).
        if isinstance(v, (dict, list, tuple)):
            if depth > MAX_DEPTH:
                raise InvalidValue(f"nesting deeper than {MAX_DEPTH} levels")
            d = depth + 1
            children: Iterable[Any]
            if isinstance(v, dict):
                for k in v:
                    if not isinstance(k, str):
                        raise InvalidValue(f"object keys must be strings, got {_show(k)}")
                    if "\x00" in k:
                        raise InvalidValue("object keys may not contain NUL (U+0000)")
                children = v.values()
            else:
                children = v
            for item in children:
                t = type(item)
                if t is str:
                    if "\x00" in item:
                        raise InvalidValue("strings may not contain NUL (U+0000)")
                elif t is int:
                    if not INT_MIN <= item <= INT_MAX:
                        raise InvalidValue(f"integer {item} is outside the signed 64-bit range")
                elif t is float:
                    if item != item or item in _INFINITIES:
                        raise InvalidValue(f"{item} is not a JSON number")
                elif not (t is bool or item is None):
                    push((item, d))
        elif isinstance(v, str):
            if "\x00" in v:
                raise InvalidValue("strings may not contain NUL (U+0000)")
        elif isinstance(v, bool) or v is None:
            pass
        elif isinstance(v, int):
            if not INT_MIN <= v <= INT_MAX:
                raise InvalidValue(f"integer {v} is outside the signed 64-bit range")
        elif isinstance(v, float):
            if v != v or v in _INFINITIES:
                raise InvalidValue(f"{v} is not a JSON number")
        else:
            raise InvalidValue(f"{type(v).__name__} is not a JSON value")


def _text_size(text: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidValue("strings may not contain lone surrogates") from None


def _dump(value: Any) -> str:
    """Compact JSON of a value ``check_value`` accepted."""
    try:
        if _encoder is not None:
            return "".join(_encoder(value, 0))
        return _dumps(value)
    except RecursionError:  # only when the caller's own stack is nearly full
        raise InvalidValue("value is nested too deeply to encode here") from None


def encode(value: Any, limit: int = MAX_VALUE) -> tuple[str, int]:
    """Validate ``value``; return its compact JSON text and its size in UTF-8 bytes.

    :raises InvalidValue: not storable JSON.
    :raises TooLarge: the UTF-8 JSON is over ``limit`` bytes.
    """
    check_value(value)
    text = _dump(value)
    size = _text_size(text)
    if size > limit:
        raise TooLarge(f"value is {size} bytes, over the limit of {limit}", size, limit)
    return text, size


def encode_items(items: Any, limit: int = MAX_VALUE) -> tuple[list[str], int]:
    """Validate the items of a list, to be stored one row each.

    Returns the JSON text of each item and the size of the JSON of the list
    made of just these items. The depth limit counts the list itself.
    """
    if not isinstance(items, (list, tuple)):
        raise InvalidValue(f"items must be a list, got {type(items).__name__}")
    check_value(items)
    texts = [_dump(x) for x in items]
    size = list_size(len(texts), sum(map(_text_size, texts)))
    if size > limit:
        raise TooLarge(f"list is {size} bytes, over the limit of {limit}", size, limit)
    return texts, size


def list_size(n: int, item_bytes: int) -> int:
    """Bytes of the compact JSON of a list of ``n`` items of ``item_bytes`` in all."""
    return 2 + item_bytes + (n - 1 if n else 0)


_canonical = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode


def canonical(value: Any) -> str:
    """One text per JSON value: objects by sorted keys; true, 1 and 1.0 stay three values.

    Python's ``==`` would call ``{"a": 1}`` and ``{"a": True}`` equal; JSON does not.
    """
    return _canonical(value)


def same_json(a: str, b: str) -> bool:
    """Whether two stored JSON texts hold the same JSON value."""
    return a == b or canonical(_loads(a)) == canonical(_loads(b))


def decode(data: str | bytes) -> Any:
    """Parse stored JSON; non-UTF-8 bytes raise json.JSONDecodeError too (SPEC §2)."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise json.JSONDecodeError(f"not UTF-8: {e.reason}", repr(data[:40]), e.start) from None
    try:
        try:
            value, end = _scan(data, 0)
            if end == len(data):
                return value
        except (ValueError, StopIteration):
            pass  # whitespace around the value, or not JSON: _loads says which
        return _loads(data)
    except RecursionError:  # raw bytes may nest deeper than any stored JSON value
        raise json.JSONDecodeError("nested too deeply to parse", data[:40], 0) from None


def fs_path(path: str | bytes | os.PathLike[Any]) -> str:
    """A path SQLite can open: SQLite takes UTF-8 names, so others are refused up front."""
    p = os.fsdecode(os.fspath(path))
    try:
        p.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidValue(
            f"the path {p!r} is not valid UTF-8: SQLite cannot open it; rename it"
        ) from None
    if "\x00" in p:
        raise InvalidValue("a path cannot contain NUL")
    return p


def check_fence(fence: Any) -> str | None:
    """The turn id of a ``fence=`` argument (SPEC §14): a Turn, a turn id, or None."""
    if fence is None:
        return None
    turn_id = getattr(fence, "id", fence)  # a Turn (or anything with the turn's id)
    if type(turn_id) is not str:
        raise InvalidValue(f"fence must be a Turn or a turn id, got {_show(fence)}")
    return check_key(turn_id, "fence (a turn id)")


def storable_text(v: Any) -> str:
    """Any text as valid, NUL-free UTF-8: lone surrogates (an os.fsdecode'd file name)
    and NUL become backslash escapes, so storing an error's text can never fail."""
    text = str(v)
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")
