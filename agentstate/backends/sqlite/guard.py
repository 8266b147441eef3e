"""Python's ``sqlite3`` module on a file this process holds through agentstate: refused.

Two copies of SQLite in one process (apsw's and the ``sqlite3`` module's) drop each
other's POSIX file locks, and the file can be corrupted (docs/sqlite.md: what was
measured). Python raises the audit event ``sqlite3.connect`` with the path before it
opens anything; the hook below refuses the path of any file an open agentstate store of
this process holds, so the hazard cannot happen by accident (SPEC §16). ``db.sql()`` is
the way to query it from here. The hook is installed once, at the first file opened, and
does nothing for any other event, or while no file is open.
"""

from __future__ import annotations

import os
import sys
import threading
import urllib.parse
from typing import Any

from ...errors import UsageError

_held: dict[tuple[int, int], int] = {}  # the file (device, inode) -> open stores of it
_lock = threading.Lock()
_installed = False


def _file(path: str) -> tuple[int, int] | None:
    """The file a path names (another path of it, a link, names the same), or None."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def hold(path: str) -> tuple[int, int] | None:
    """A store of ``path`` opened: refuse sqlite3.connect of it while it is open. The
    file's key, for ``release`` (kept by the store: the path may be renamed meanwhile)."""
    global _installed
    real = _file(path)
    if real is None:
        return None
    with _lock:
        _held[real] = _held.get(real, 0) + 1
        if not _installed:
            _installed = True
            sys.addaudithook(_hook)
    return real


def release(real: tuple[int, int] | None) -> None:
    """A store closed (``real``: what ``hold`` returned)."""
    if real is None:
        return
    with _lock:
        left = _held.get(real, 0) - 1
        if left > 0:
            _held[real] = left
        else:
            _held.pop(real, None)


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if event != "sqlite3.connect" or not _held:
        return
    path = _file_of(args[0] if args else None)
    if path is not None and _file(path) in _held:
        raise UsageError(
            f"sqlite3.connect({path!r}): this process has that file open through agentstate, "
            "and two copies of SQLite in one process drop each other's file locks (the file "
            "can be corrupted): query it with db.sql(), or from another process (the sqlite3 "
            "shell)")


def _file_of(database: Any) -> str | None:
    """The real path ``sqlite3.connect`` would open, or None (in memory, unreadable)."""
    try:
        name = os.fsdecode(database)
    except TypeError:
        return None
    if name.startswith("file:"):  # a URI (uri=True); as a plain name it is a file so named
        parsed = urllib.parse.urlsplit(name)
        name = urllib.parse.unquote(parsed.path) or name
    if not name or name == ":memory:":
        return None
    return os.path.realpath(name)
