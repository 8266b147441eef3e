"""A key's history on its page (SPEC §17): each kept revision, and what changed from the
version before it as lines a person reads (``theme: "dark" → "light"``, ``+ tags[2]: "x"``).

Values come from the store's text, parsed as far as a page shows (``_pages.parse``), and
compared by a loop with an explicit stack that stops after ``NODES`` values and ``LINES``
lines: any token may write a value of 100,000 nested lists, and a page stays quick.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import agentstate
from agentstate._changes import parse_at

from .. import _json
from . import _pages as pages
from ._render import text

LINES = 40  # lines of one revision's difference a page shows
NODES = 20_000  # values compared for one revision, at most
SHOWN = 80  # characters of one value in a line
PAGE = 10  # revisions a key's page shows at a time
_ROOT = "(the value)"
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Line:
    sign: str  # "+" added, "-" removed, "~" changed
    path: str
    old: str  # the value before, shortened ("" when added)
    new: str  # the value after ("" when removed)


@dataclass
class Revision:
    seq: int
    version: int
    op: str
    at: datetime
    value: Any  # parsed as far as a page shows; None when absent, or bytes
    absent: bool
    is_bytes: bool
    size: int
    lines: list[Line] = field(default_factory=list)
    more: bool = False  # more changed than the lines shown
    rough: bool = False  # a value was too large to compare whole: the lines may miss some
    unknown: bool = False  # the version before this one is no longer kept


def short(value: Any) -> str:
    """A value as one line of JSON (a string in its quotes), at most SHOWN characters."""
    shown, cut = text(value, SHOWN, indent=False)
    return shown + "…" if cut else shown


def _path(parent: str, step: str | int) -> str:
    """``a.b[2]``; a member whose name is not a plain word in quotes: ``a["x y"]``."""
    base = "" if parent == _ROOT else parent
    if isinstance(step, int):
        return f"{base}[{step}]"
    if _WORD.fullmatch(step):
        return f"{base}.{step}" if base else step
    return f"{base}[{json.dumps(step, ensure_ascii=False)}]"


def difference(old: Any, new: Any) -> tuple[list[Line], bool, bool]:
    """The lines that turn ``old`` into ``new``, at most LINES; whether there were more; and
    whether the walk stopped at NODES before the end."""
    lines: list[Line] = []
    stack: list[tuple[str, Any, Any]] = [(_ROOT, old, new)]
    seen = 0
    while stack:
        if len(lines) >= LINES:
            return lines, True, False
        seen += 1
        if seen > NODES:
            return lines, False, True
        path, a, b = stack.pop()
        if isinstance(a, dict) and isinstance(b, dict):
            for name in sorted(set(a) | set(b), reverse=True):  # popped in ascending order
                stack.append((_path(path, name), a.get(name, _GONE), b.get(name, _GONE)))
        elif isinstance(a, list) and isinstance(b, list):
            for i in range(max(len(a), len(b)) - 1, -1, -1):
                stack.append((_path(path, i), a[i] if i < len(a) else _GONE,
                              b[i] if i < len(b) else _GONE))
        elif a is _GONE:
            lines.append(Line("+", path, "", short(b)))
        elif b is _GONE:
            lines.append(Line("-", path, short(a), ""))
        elif type(a) is not type(b) or a != b:
            lines.append(Line("~", path, short(a), short(b)))
    return lines, False, False


class _Gone:
    """No such member: a key or an index one side lacks (None is a value)."""

    def __repr__(self) -> str:
        return "(none)"


_GONE = _Gone()


def _revision(row: tuple[Any, ...]) -> tuple[Revision, bool]:
    """A stored revision for a page, and whether its value was cut."""
    seq, version, op, at, type_, stored, items = row
    if type_ is None:
        return Revision(seq, version, op, parse_at(at), None, True, False, 0), False
    raw = stored
    if type_ == "list":
        raw = "[" + (items or "") + "]"
    if type_ == "bytes" and not _json.is_json(raw):
        return Revision(seq, version, op, parse_at(at), raw, False, True, len(raw)), False
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    value, cut = pages.parse(text)
    return Revision(seq, version, op, parse_at(at), value, False, False,
                    len(text.encode("utf-8", "surrogatepass"))), cut


def _explain(rev: Revision, cut: bool, older: Revision | None, older_cut: bool) -> None:
    """What changed from ``older`` (the revision before, None: not kept or none) to ``rev``."""
    if rev.absent:
        if older is not None and not older.absent:
            rev.lines = [Line("-", _ROOT, _shown(older), "")]
        return
    if older is None and rev.version > 1:  # made again, or changed: what it was is not kept
        rev.unknown = True
        return
    if older is None or older.absent:
        rev.lines = [Line("+", _ROOT, "", _shown(rev))]
        return
    if rev.is_bytes or older.is_bytes:
        if (rev.is_bytes, rev.value) != (older.is_bytes, older.value):
            rev.lines = [Line("~", _ROOT, _shown(older), _shown(rev))]
        return
    rev.lines, rev.more, rough = difference(older.value, rev.value)
    rev.rough = rough or cut or older_cut


def _shown(rev: Revision) -> str:
    return f"({rev.size} bytes, not JSON)" if rev.is_bytes else short(rev.value)


def history(db: agentstate.Database, sc: agentstate.Scope, key: str, before: int | None,
            n: int = PAGE) -> tuple[list[Revision], int | None]:
    """A page of the key's kept revisions, newest first, each with what changed from the one
    before it (one more is read for the oldest's), and the ``before`` of the older page."""
    rows = db._ops.kv_history(sc.kind, sc.id, key, 0, before, n + 1)
    read = [_revision(r) for r in rows]
    out = []
    for i, (rev, cut) in enumerate(read[:n]):
        older, older_cut = read[i + 1] if i + 1 < len(read) else (None, False)
        _explain(rev, cut, older, older_cut)
        out.append(rev)
    return out, (out[-1].seq if len(read) > n else None)
