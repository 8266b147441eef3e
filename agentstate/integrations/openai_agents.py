"""openai-agents sessions kept in agentstate: ``AgentStateSession``.

The one-line switch (``pip install 'agentstate[openai-agents]'``)::

    session = SQLiteSession("user-42", "agent.db")                     # before
    session = AgentStateSession("user-42", db_path="agent.db")         # after
    await Runner.run(agent, "hi", session=session)

Many processes may use one session at once: every write (``add_items``,
``pop_item``, ``clear_session``) is one transaction, so it lands whole or not
at all and is never lost or doubled; two ``pop_item`` calls never return the
same item.

Layout: one scope per session, ``session:openai-agents:<escaped id>``, holding
nothing else::

    meta              {"format": 1, "last": n, "spills": s}: this layout's version,
                      the last chunk, the next bytes id
    c.00000000 ...    the history, in chunks: lists of up to 1 MiB of JSON (the list
    c.<n>             limit); only the last chunk, n, ever changes, and only it
                      may be empty
    x.<id>.<part>     an item too large for a chunk, or that SPEC §2 does not store
                      as JSON (NUL, NaN, ...): its json.dumps text, 1 MiB per bytes
                      value; its chunk holds ["x", id, parts] in its place

A chunk holds dict items as they are and any other item as ``["v", item]``,
so a marker is never mistaken for an item. Adding a turn reads meta and
appends to the last chunk; when that chunk is full (the store says TooLarge)
or an item needs bytes, the items start a new chunk and meta is rewritten.
``pop_item`` pops the last chunk (left empty when emptied: a later add fills
it) and rewrites meta only when it moves to the chunk before. So adding,
popping and ``get_items(limit)`` (meta and the newest chunks) cost the same
at 10 and 10,000 items.

Reads take no lock. A read sees one state: meta names the chunks, every chunk
but the last is immutable while meta's version stays the same, and the last is
read in one statement; so a read checks meta's version before and after, and
reads again if it changed (a sequence lock), after a few tries inside a
transaction. A large item popped while it was read misses parts: read again.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

from agents.memory.session import SessionABC
from agents.memory.session_settings import (SessionSettings, coerce_session_settings,
                                            resolve_session_limit)

import agentstate
from agentstate import Closed, Damaged, InvalidKey, InvalidValue, SchemaTooNew, TooLarge
from agentstate.integrations._escape import escape, unescape

__all__ = ["AgentStateSession", "SessionClosed", "scope_id", "session_id_of"]

SCOPE_PREFIX = "openai-agents:"
CHUNK_BYTES = 1_000_000  # new chunks are planned below the 1 MiB list limit
PART_BYTES = 1024 * 1024  # the limit of one bytes value
READ_TRIES = 8  # optimistic reads before reading under the write lock
FORMAT = 1  # the layout below; a newer one is refused, never misread

_compact = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")
_T = TypeVar("_T")


class SessionClosed(Closed, RuntimeError):
    """The session was closed; a RuntimeError, as SQLiteSession raises."""


# -- session ids ---------------------------------------------------------------

def scope_id(session_id: str) -> str:
    """The scope id of a session: ``openai-agents:`` and the id, each character
    outside ``A-Z a-z 0-9 . _ -`` written as ``:XX`` per UTF-8 byte (reversible).

    :raises InvalidKey: not a string, or over 200 characters once escaped.
    """
    if not isinstance(session_id, str):
        raise InvalidKey(f"a session id must be a string, got {type(session_id).__name__}")
    sid = SCOPE_PREFIX + escape(session_id, _PLAIN, ":", "02X")
    if len(sid) > 200:
        raise InvalidKey(f"session id too long: its scope id would be {len(sid)} characters "
                         "(limit 200; each character outside A-Z a-z 0-9 . _ - counts 3 per byte)")
    return sid


def session_id_of(scope: str) -> str:
    """The session id back from a scope id made by :func:`scope_id`."""
    if not scope.startswith(SCOPE_PREFIX):
        raise InvalidKey(f"{scope!r} is not an openai-agents session scope")
    return unescape(scope[len(SCOPE_PREFIX):], ":")


def _chunk(n: int) -> str:
    return f"c.{n:08d}"


def _part(spill: int, k: int) -> str:
    return f"x.{spill:08d}.{k:04d}"


# -- how one item is stored ----------------------------------------------------

def _stored(item: Any) -> Any:
    """What a chunk holds for an item: a dict as it is, anything else wrapped."""
    return item if isinstance(item, dict) else ["v", item]


def _plan(item: Any) -> tuple[Any, int] | bytes:
    """(chunk value, its JSON size), or the JSON text to keep as bytes parts.

    :raises TypeError: the item is not JSON (what json.dumps, and so SQLiteSession, says).
    """
    stored = _stored(item)
    try:
        text = _compact(stored)
        size = len(text.encode("utf-8"))
    except ValueError:  # NaN or infinity; a lone surrogate (UnicodeEncodeError)
        return json.dumps(item).encode("ascii")
    if size > CHUNK_BYTES - 2 or "\\u0000" in text:  # SPEC §2 stores no NUL
        return json.dumps(item).encode("ascii")
    return stored, size


def _check_format(meta: dict[str, Any]) -> None:
    if meta.get("format", 0) > FORMAT:
        raise SchemaTooNew(f"this session was written in layout {meta['format']}; this "
                           f"agentstate reads up to {FORMAT}: upgrade agentstate")


def _size(stored: Any) -> int:
    return len(_compact(stored).encode("utf-8"))


class AgentStateSession(SessionABC):
    """An openai-agents session whose history lives in an agentstate database.

    ``db``: an ``agentstate.Database`` (left open by :meth:`close`), or a path,
    as SQLiteSession's second argument. ``db_path``: a file to open (closed by
    :meth:`close`); ``":memory:"`` opens a private temporary file that
    :meth:`close` deletes (agentstate has no in-memory mode: its worker
    threads each need a connection to one file). Neither: ``agentstate.open()``
    (``$AGENTSTATE_DB``, else ``./agentstate.db``). ``session_settings``: a
    ``SessionSettings`` or a dict of its fields; its ``limit`` is the default
    of :meth:`get_items`.

    Every call runs its SQLite work in a worker thread: the event loop never
    waits on a lock or an fsync. Any agentstate error may come out of a call:
    ``Busy`` when another writer held the file past ``busy_timeout``,
    ``StorageError`` on a disk failure, ``SchemaTooNew`` for a session written
    by a newer agentstate; a refused write changes nothing.

    :raises InvalidKey: the session id cannot name a scope (see :func:`scope_id`).
    :raises TypeError: unknown session settings, or both ``db`` and ``db_path``.
    """

    def __init__(self, session_id: str, db: agentstate.Database | str | os.PathLike[str] | None = None,
                 *, db_path: str | os.PathLike[str] | None = None,
                 session_settings: SessionSettings | dict[str, Any] | None = None) -> None:
        if isinstance(db, (str, os.PathLike)):
            if db_path is not None:
                raise TypeError("pass the database path once: as db or as db_path")
            db, db_path = None, db
        if db is not None and db_path is not None:
            raise TypeError("pass db or db_path, not both")
        if db is not None and not isinstance(db, agentstate.Database):
            raise TypeError(f"db must be an agentstate.Database or a path, got {type(db).__name__}")
        self.session_id = session_id
        self.session_settings = (coerce_session_settings(session_settings)
                                 if session_settings is not None else SessionSettings())
        sid = scope_id(session_id)  # refused before any file is made
        self._tmpdir: str | None = None
        self._owns_db = db is None
        if db is None:
            if db_path is not None and os.fspath(db_path) == ":memory:":
                self._tmpdir = tempfile.mkdtemp(prefix="agentstate-session-")
                db_path = os.path.join(self._tmpdir, "session.db")
            try:
                db = agentstate.open(db_path)
            except BaseException:
                self._remove_tmpdir()
                raise
        self.db: agentstate.Database = db
        self._scope = db.scope("session", sid)
        self._closed = False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.session_id!r} in {self.db.path!r}>"

    # -- the Session interface -------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The newest ``limit`` items, oldest first (default: ``session_settings.limit``;
        None: all). As SQLiteSession: 0 gives [], a negative limit all items.
        Takes no lock: a concurrent write never makes it wait.

        :raises Damaged: a large item's bytes were removed by hand.
        """
        self._check_open()
        n = resolve_session_limit(limit, self.session_settings)
        if n == 0:
            return []
        return await asyncio.to_thread(self._get, None if n is None or n < 0 else n)

    async def add_items(self, items: list[Any]) -> None:
        """Add ``items`` at the end of the history, all in one transaction.

        Cancelled, it still waits for that transaction to end before it raises
        CancelledError, so the outcome is settled: all the items or none.

        :raises TypeError: an item is not JSON; nothing is written.
        """
        self._check_open()
        if not items:
            return
        await _settled(self._add, list(items))

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item; None when the history is empty.
        Atomic: two callers, in any processes, never get the same item.

        :raises Damaged: a large item's bytes were removed by hand; nothing is popped.
        """
        self._check_open()
        return await _settled(self._pop)

    async def clear_session(self) -> None:
        """Remove every item of this session, in one transaction."""
        self._check_open()
        await _settled(self._clear)

    def close(self) -> None:
        """Close the session; idempotent. Closes the database if this session
        opened it (and deletes the temporary file of ``":memory:"``)."""
        if self._closed:
            return
        self._closed = True
        if self._owns_db:
            self.db.close()
        self._remove_tmpdir()

    # -- the work, in a worker thread ---------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise SessionClosed(f"{type(self).__name__} is closed")

    def _remove_tmpdir(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None

    def _get(self, limit: int | None) -> list[Any]:
        for _ in range(READ_TRIES):
            items = self._read(limit)
            if items is not None:
                return items
        with self.db.transaction():  # writers kept coming: read under the write lock
            items = self._read(limit)
        if items is None:  # nobody wrote meanwhile: a part is really missing
            raise Damaged(f"{self._scope}: a part of a large item is missing (removed by hand?)")
        return items

    def _read(self, limit: int | None) -> list[Any] | None:
        """The newest ``limit`` items (None: all), or None if a write came in between."""
        meta, version = self._scope.get_versioned("meta")
        if meta is None:
            return []
        _check_format(meta)
        last = meta["last"]
        if limit is None:
            stored = [x for n in range(last + 1) for x in self._scope.slice(_chunk(n))]
        else:
            stored, n = [], last
            while n >= 0 and len(stored) < limit:
                stored = self._scope.slice(_chunk(n), len(stored) - limit) + stored
                n -= 1
        items = [s if type(s) is dict else self._item(s) for s in stored]
        if any(i is _GONE for i in items):
            # A pop from the last chunk leaves meta as it is: a large item read from
            # that chunk and popped before its parts were read is missing them.
            return None
        if self._scope.get_versioned("meta").version != version:
            return None
        return items

    def _add(self, items: list[Any]) -> None:
        with self.db.transaction():
            meta = self._scope.get("meta")
            if meta is not None:
                _check_format(meta)
                try:
                    self._scope.append(_chunk(meta["last"]), [_stored(i) for i in items])
                    return
                except (TooLarge, InvalidValue):
                    pass  # the chunk is full, or an item needs bytes: the careful way
            self._add_chunks(meta or {"format": FORMAT, "last": -1, "spills": 0}, items)

    def _add_chunks(self, meta: dict[str, Any], items: list[Any]) -> None:
        """The items in new chunks of at most CHUNK_BYTES, with bytes where needed."""
        planned = [_plan(item) for item in items]  # TypeError before anything is written
        if meta["last"] < 0 or self._scope.length(_chunk(meta["last"])) > 0:
            meta["last"] += 1  # else the last chunk was emptied by pops: fill it again
        chunk: list[Any] = []
        size = 2  # of the chunk's JSON: "[]"
        for p in planned:
            if isinstance(p, bytes):
                stored = self._spill(meta, p)
                n = _size(stored)
            else:
                stored, n = p
            if chunk and size + 1 + n > CHUNK_BYTES:
                self._append(meta, chunk)
                meta["last"] += 1
                chunk, size = [], 2
            size += n + (1 if chunk else 0)  # a comma before all but the first
            chunk.append(stored)
        self._append(meta, chunk)
        self._scope.put("meta", meta)

    def _append(self, meta: dict[str, Any], chunk: list[Any]) -> None:
        key = _chunk(meta["last"])
        try:
            self._scope.append(key, chunk)
        except InvalidValue:
            # What json.dumps takes and SPEC §2 refuses (integers past 64 bits,
            # nesting past 512, non-string keys): those items go to bytes.
            for stored in chunk:
                try:
                    self._scope.append(key, [stored])
                except InvalidValue:
                    item = stored[1] if isinstance(stored, list) else stored
                    self._scope.append(key, [self._spill(meta, json.dumps(item).encode("ascii"))])

    def _spill(self, meta: dict[str, Any], text: bytes) -> list[Any]:
        n = meta["spills"]
        meta["spills"] = n + 1
        parts = [text[i:i + PART_BYTES] for i in range(0, len(text), PART_BYTES)]
        for k, part in enumerate(parts):
            self._scope.put_bytes(_part(n, k), part)
        return ["x", n, len(parts)]

    def _item(self, stored: Any, *, remove: bool = False) -> Any:
        """The item a chunk value stands for (``_GONE`` if a part is missing)."""
        if isinstance(stored, dict):
            return stored
        if stored[0] == "v":
            return stored[1]
        _, n, count = stored
        parts = [self._scope.get_bytes(_part(n, k)) for k in range(count)]
        if remove:
            for k in range(count):
                self._scope.delete(_part(n, k))
        if None in parts:
            return _GONE
        return json.loads(b"".join(parts))  # type: ignore[arg-type]

    def _pop(self) -> Any | None:
        with self.db.transaction():
            meta = self._scope.get("meta")
            if meta is None:
                return None
            _check_format(meta)
            popped = self._scope.pop(_chunk(meta["last"]))
            while not popped and meta["last"] > 0:  # an emptied last chunk: the one before
                self._scope.delete(_chunk(meta["last"]))
                meta["last"] -= 1
                self._scope.put("meta", meta)
                popped = self._scope.pop(_chunk(meta["last"]))
            if not popped:
                return None
            item = self._item(popped[0], remove=True)
            if item is _GONE:  # raised inside: the pop is rolled back
                raise Damaged(f"{self._scope}: a part of a large item is missing "
                              "(removed by hand?)")
        return item

    def _clear(self) -> None:
        with self.db.transaction():
            for key in self._scope.list():
                self._scope.delete(key)


_GONE: Any = object()


async def _settled(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a worker thread; when cancelled, wait for its outcome first.

    The thread cannot be stopped: a caller that gave up before its commit
    might retry and write twice. So CancelledError is raised only once the
    transaction has committed or rolled back (SQLiteSession does the same).
    """
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError as e:
            cancelled = cancelled or e
    if cancelled is not None:
        if not task.cancelled():
            task.exception()  # retrieved: the cancellation is what the caller asked for
        raise cancelled
    return task.result()
