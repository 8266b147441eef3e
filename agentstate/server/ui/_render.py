"""Values as text on the pages, bounded in size and time whatever their shape.

``json.dumps(indent=2)`` of 100 KB of lists nested 500 deep is 50 MB (each line indented
by its depth): a value any token may write. Here the text is made a piece at a time by
a loop with an explicit stack (no recursion), indentation stops growing past MAX_INDENT
levels, and making stops at a cap: each value at most VALUE_CAP characters, all the values
of one page at most PAGE_CAP (a budget per render), and a cut value says so and links to
the whole value as JSON. Ordinary values come out exactly as ``json.dumps(indent=2)``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

VALUE_CAP = 64 * 1024  # characters of one value's text on a page
PAGE_CAP = 1024 * 1024  # characters of all the values of one page
MAX_INDENT = 32  # levels indented; deeper ones stay at this indent

_budget: ContextVar[list[int] | None] = ContextVar("page_budget", default=None)
_END = object()


def start_page() -> None:
    """A new page's budget (call in the thread that renders it)."""
    _budget.set([PAGE_CAP])


@dataclass
class Shown:
    text: str
    truncated: bool
    cap: int

    def __str__(self) -> str:
        return self.text


def _scalar(v: Any, cut: int) -> str:
    if isinstance(v, str) and len(v) > cut:
        v = v[:cut]  # the caller cuts the text anyway; no need to escape the rest
    return json.dumps(v, ensure_ascii=False)


def chunks(value: Any, indent: bool, cut: int) -> Iterator[str]:
    """The pieces of ``value``'s JSON text, in order (``indent``: as indent=2 does, else as
    json.dumps's default separators)."""
    frames: list[list[Any]] = []  # open containers: [items, closer, level, count]

    def start(v: Any, level: int) -> str:
        if isinstance(v, dict):
            frames.append([iter(v.items()), "}", level, 0])
            return "{"
        if isinstance(v, (list, tuple)):
            frames.append([iter(v), "]", level, 0])
            return "["
        return _scalar(v, cut)

    def newline(level: int) -> str:
        return "\n" + "  " * min(level, MAX_INDENT) if indent else ""

    yield start(value, 0)
    while frames:
        f = frames[-1]
        item: Any = next(f[0], _END)
        if item is _END:
            frames.pop()
            yield (newline(f[2]) if f[3] else "") + f[1]
            continue
        yield ("," if f[3] and indent else ", " if f[3] else "") + newline(f[2] + 1)
        f[3] += 1
        if f[1] == "}":
            key, item = item
            yield json.dumps(str(key), ensure_ascii=False) + ": "
        yield start(item, f[2] + 1)


def text(value: Any, cap: int, indent: bool = True) -> tuple[str, bool]:
    """At most ``cap`` characters of ``value``'s JSON text, and whether it was cut."""
    out: list[str] = []
    size = 0
    for piece in chunks(value, indent, cap + 1):
        if size + len(piece) > cap:
            out.append(piece[:cap - size])
            return "".join(out), True
        out.append(piece)
        size += len(piece)
    return "".join(out), False


def pretty(value: Any) -> Shown:
    """A value for a page: indented, cut at VALUE_CAP or what is left of the page's budget."""
    budget = _budget.get()
    cap = VALUE_CAP if budget is None else max(0, min(VALUE_CAP, budget[0]))
    shown, cut = text(value, cap)
    if budget is not None:
        budget[0] -= len(shown)
    return Shown(shown, cut, cap)


def short(value: Any, n: int = 120) -> str:
    """One line of a value, at most ``n`` characters (then an ellipsis)."""
    if isinstance(value, str):
        return value if len(value) <= n else value[:n] + "…"
    shown, cut = text(value, n, indent=False)
    return shown + "…" if cut else shown
