"""Parsing JSON from clients: strict (SPEC §2: no NaN or Infinity literals), bounded, and
never a long stall of the event loop.

The C decoder holds the GIL for the whole of a parse, wherever it runs: 20 MiB of small
lists is seconds in which no other request is served. So a body is parsed by the C
decoder only when its count of JSON tokens (bracket, comma and colon bytes: an upper
bound) is small; a bigger one is parsed by ``_parse_slowly``, a loop in Python with an
explicit stack, which lets the event loop's thread in every few milliseconds, counts the
values it makes (TooLarge past ``max_values``) and the depth (InvalidValue past the
store's), and has no recursion to exhaust. Strings are still scanned by the C
``scanstring``, so a body of a few big strings parses at nearly C speed either way.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring  # type: ignore[attr-defined]
from typing import Any

from agentstate._encoding import MAX_DEPTH
from agentstate.errors import InvalidValue, TooLarge

from ._limits import LIMITS

FAST_TOKENS = 50_000  # the C decoder: ~10-30 ms for this many tokens, GIL held throughout


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_decode = json.JSONDecoder(parse_constant=_no_constants).decode
_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9][0-9]*))(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def tokens(raw: bytes | str) -> int:
    """An upper bound of the tokens the C decoder makes of ``raw`` (quick: a few byte counts)."""
    if isinstance(raw, bytes):
        return raw.count(b"[") + raw.count(b"{") + raw.count(b",") + raw.count(b":")
    return raw.count("[") + raw.count("{") + raw.count(",") + raw.count(":")


def _skip(text: str, i: int) -> int:
    """The index of the first character at or after ``i`` that is not whitespace."""
    return _WS.match(text, i).end()  # type: ignore[union-attr]  # "*": it always matches


def parse(raw: bytes | str, max_values: int, max_depth: int = MAX_DEPTH,
          max_containers: int | None = None) -> Any:
    """The JSON value in ``raw``.

    :raises InvalidValue: not UTF-8, not JSON, NaN/Infinity literals, nested too deep.
    :raises TooLarge: more than ``max_values`` values, or ``max_containers`` of them arrays
        and objects (default ``LIMITS.json_containers``): the garbage collector walks every
        live container, so their count bounds its pauses while the value lives.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as e:
        raise InvalidValue(f"the body is not UTF-8: {e}") from None
    try:
        if tokens(raw) <= min(FAST_TOKENS, max_values):
            return _decode(text)
        return _parse_slowly(text, max_values, max_depth,
                             max_containers=max_containers or LIMITS.json_containers)
    except RecursionError:
        raise InvalidValue(f"JSON nested deeper than {max_depth} levels") from None
    except ValueError as e:  # json.JSONDecodeError, and ours
        if isinstance(e, (InvalidValue, TooLarge)):  # both ValueErrors: ours, as they are
            raise
        raise InvalidValue(f"not JSON: {e}") from None


def _fail(text: str, i: int, what: str) -> InvalidValue:
    return InvalidValue(f"not JSON: {what} at character {i}"
                        + ("" if i >= len(text) else f" ({text[i:i + 20]!r})"))


def _key(text: str, i: int) -> tuple[str, int]:
    """An object's key and the colon after it: the index of its value."""
    if text[i:i + 1] != '"':
        raise _fail(text, i, "expected a key in double quotes")
    key, i = scanstring(text, i + 1, True)
    i = _skip(text, i)
    if text[i:i + 1] != ":":
        raise _fail(text, i, "expected ':'")
    return key, _skip(text, i + 1)


def parse_prefix(raw: bytes | str, max_values: int) -> tuple[Any, bool]:
    """As much of the JSON value in ``raw`` as ``max_values`` values make, and whether it was
    cut: for showing a value (a page shows a few thousand values at most), never for storing.

    :raises InvalidValue: as ``parse``.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if tokens(raw) <= min(FAST_TOKENS, max_values):
            return _decode(text), False
        return _parse_slowly(text, max_values, MAX_DEPTH, partial=True)
    except UnicodeDecodeError as e:
        raise InvalidValue(f"not UTF-8: {e}") from None
    except RecursionError:
        raise InvalidValue(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        if isinstance(e, InvalidValue):
            raise
        raise InvalidValue(f"not JSON: {e}") from None


def is_json(raw: str | bytes) -> bool:
    """Whether ``raw`` is one JSON value (SPEC §2's: no NaN), checked without making it: no
    long hold of the GIL, no objects for the garbage collector (a stored text, say)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if tokens(raw) <= FAST_TOKENS:
            _decode(text)
        else:
            _parse_slowly(text, 2**62, MAX_DEPTH, build=False)
        return True
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False


def _parse_slowly(text: str, max_values: int, max_depth: int, partial: bool = False,
                  max_containers: int | None = None, build: bool = True) -> Any:
    """What json.loads would make of ``text``, one token per step of a Python loop.
    ``partial``: past ``max_values``, (what was made so far, True) instead of TooLarge.
    ``build``: False only checks the text (containers are markers, values dropped)."""
    n, count, containers = len(text), 0, 0
    max_containers = max_containers or max_values
    root: Any = None
    stack: list[Any] = []  # the open containers, innermost last (each already in its parent)
    keys: list[str | None] = []  # each open object's key being read (None for a list)

    def put(value: Any) -> None:  # into the innermost open container, or as the root
        nonlocal root
        if not build:
            return
        if not stack:
            root = value
        elif keys[-1] is None:
            stack[-1].append(value)
        else:
            stack[-1][keys[-1]] = value

    i = _skip(text, 0)
    while True:
        if i >= n:
            raise _fail(text, i, "unexpected end")
        count += 1
        if count > max_values:
            if partial:
                return root, True
            raise TooLarge(f"the body holds more than {max_values:,} JSON values", count, max_values)
        c = text[i]
        if c == "{" or c == "[":
            if len(stack) >= max_depth:
                raise InvalidValue(f"JSON nested deeper than {max_depth} levels")
            containers += 1
            if containers > max_containers:
                if partial:
                    return root, True
                raise TooLarge(f"the body holds more than {max_containers:,} JSON arrays and "
                               "objects", containers, max_containers)
            container: Any = ({} if c == "{" else []) if build else c
            put(container)
            i = _skip(text, i + 1)
            if text[i:i + 1] == ("}" if c == "{" else "]"):
                i += 1
            else:
                stack.append(container)
                if c == "{":
                    key, i = _key(text, i)
                    keys.append(key)
                else:
                    keys.append(None)
                continue  # to the container's first value
        elif c == '"':
            value, i = scanstring(text, i + 1, True)
            put(value)
        elif (m := _NUMBER.match(text, i)) is not None:
            whole, frac, exp = m.groups()
            put(float(whole + (frac or "") + (exp or "")) if frac or exp else int(whole))
            i = m.end()
        elif text.startswith("true", i):
            put(True)
            i += 4
        elif text.startswith("false", i):
            put(False)
            i += 5
        elif text.startswith("null", i):
            put(None)
            i += 4
        else:
            raise _fail(text, i, "expected a value")
        while True:  # after a value: the next one, or the end of containers
            i = _skip(text, i)
            if not stack:
                if i != n:
                    raise _fail(text, i, "extra data")
                return (root, False) if partial else root
            c = text[i:i + 1]
            if c == ",":
                i = _skip(text, i + 1)
                if keys[-1] is not None:
                    keys[-1], i = _key(text, i)
                break  # to the next value
            if c != ("]" if keys[-1] is None else "}"):
                raise _fail(text, i, "expected ',' or the container's end")
            stack.pop()
            keys.pop()
            i += 1
