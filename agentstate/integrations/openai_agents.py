"""openai-agents sessions kept in agentstate: ``AgentStateSession``.

The one-line switch (``pip install 'agentstate-db[openai-agents]'``)::

    session = SQLiteSession("user-42", "agent.db")                     # before
    session = AgentStateSession("user-42", db_path="agent.db")         # after
    await Runner.run(agent, "hi", session=session)

Many processes may use one session at once: every write (``add_items``,
``pop_item``, ``clear_session``) is one transaction, so it lands whole or not
at all and is never lost or doubled; two ``pop_item`` calls never return the
same item.

Layout (2): one scope per session, ``session:openai-agents:<escaped id>``,
holding nothing else::

    meta              {"format": 2, "last": n, "spills": s}: this layout's version,
                      the newest older chunk (-1: none), the next bytes id
    c.00000000 ...    older history, oldest first: lists of at most 1 MiB of JSON (the
    c.<n>             list limit); only c.<n> ever shrinks (pops past c.tail)
    c.tail            ["h", n] and then the newest items: adds append here
    x.<id>.<part>     an item too large for a chunk, or that SPEC §2 does not store
                      as JSON (NUL, NaN, ...): its json.dumps text, 1 MiB per bytes
                      value; its chunk holds ["x", id, parts] in its place

A chunk holds dict items as they are and any other item as ``["v", item]``, so
neither the header ``["h", n]`` nor a bytes marker is ever mistaken for an item.

One store call per framework call, as SQLiteSession runs one query: adding a
turn is one ``append`` to ``c.tail``; ``pop_item`` one ``pop`` of it;
``get_items(limit)`` one ``slice`` of its last ``limit`` items (when that reaches
the header, its ``n`` says whether older chunks hold more); ``get_items()`` one
``items("c.")``, every chunk in key order (``c.tail`` sorts last). Only the
rare cases take a transaction: the tail is full (its items but the newest
quarter become chunk ``c.<n+1>``: copying 1 MiB once per 750 KB added), an item
needs bytes, a pop goes past the tail, the first write of a session object
(which checks ``meta``), a clear. So every call costs the same at 10 and
10,000 items. A one-statement read sees one state; a read of several (older
chunks) runs in ``db.snapshot()``.

Layouts: layout 1 (``meta`` format 1, no ``c.tail``, its chunks read as
above) is read as it is and becomes layout 2 at its first write. A session's
``meta`` is kept by ``clear_session``, so an older agentstate never writes
layout 1 into a session newer ones use (it refuses format 2). The fast calls
do not read ``meta``: a later layout must keep a value that is not a list at
``c.tail``, which sends every call of this one to ``meta`` and SchemaTooNew.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
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
from agentstate import (Closed, Damaged, InvalidKey, InvalidValue, NotAList, SchemaTooNew,
                        TooLarge)
from agentstate.integrations import on_a_file
from agentstate.integrations._escape import escape, unescape

__all__ = ["AgentStateSession", "SessionClosed", "scope_id", "session_id_of"]

SCOPE_PREFIX = "openai-agents:"
CHUNK_BYTES = 1_000_000  # chunks are planned below the 1 MiB list limit
KEEP_FRACTION = 4  # sealing the tail keeps its newest 1/4 of CHUNK_BYTES there
PART_BYTES = 1024 * 1024  # the limit of one bytes value
READ_TRIES = 8  # reads that met a large item popped meanwhile, before reading under the lock
FORMAT = 2  # the layout above; a newer one is refused, never misread
TAIL = "c.tail"
_DEPTH = 511  # SPEC §2 nesting limit (512) less the chunk list an item sits in

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


def _header(last: int) -> list[Any]:
    return ["h", last]


def _is_header(stored: Any) -> bool:
    return type(stored) is list and stored[0] == "h"


# -- how one item is stored ----------------------------------------------------

def _stored(item: Any) -> Any:
    """What a chunk holds for an item: a dict as it is, anything else wrapped."""
    return item if isinstance(item, dict) else ["v", item]


def _storable(value: Any) -> bool:
    """Whether SPEC §2 stores ``value`` as JSON inside a chunk: what json.dumps
    writes differently or not at all (non-string keys, integers past 64 bits,
    nesting past the limit) goes to bytes; NaN, NUL and lone surrogates are
    caught by the encoding in :func:`_plan`."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            if depth > _DEPTH or not all(type(k) is str for k in v):
                return False
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, (list, tuple)):
            if depth > _DEPTH:
                return False
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, int) and not isinstance(v, bool):
            if not -2**63 <= v < 2**63:
                return False
        elif not isinstance(v, (str, float, bool)) and v is not None:
            return False  # json.dumps refuses it too: _plan raises its TypeError
    return True


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
    if size > CHUNK_BYTES - 2 or "\\u0000" in text or not _storable(stored):
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

    The event loop never waits on a lock or an fsync: writes run in a worker
    thread, and so do reads of a PostgreSQL store (a round trip). A read of a
    file runs on the loop's own thread, as one statement costs less than the
    hop to a thread (benchmarks/ADAPTER-OPENAI-AGENTS.md): in WAL mode a read
    never waits for a writer (only for the disk, when its pages are not cached),
    and a read that would have to wait for the write lock goes to a worker
    thread. Any agentstate error may come out of a call:
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
        # This object has seen the session in layout 2 (or made it so): its adds may
        # append to c.tail without reading meta first.
        self._ready = False
        self._inline = on_a_file(db)  # reads run on the caller's thread

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
        n = None if n is None or n < 0 else n
        if self._inline:
            for _ in range(READ_TRIES):
                items = self._read(n)
                if items is not None:
                    return items
            return await asyncio.to_thread(self._get_locked, n)
        return await asyncio.to_thread(self._get, n)

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

    def _damaged(self, what: str) -> Damaged:
        return Damaged(f"{self._scope}: {what}")

    # reading

    def _get(self, limit: int | None) -> list[Any]:
        for _ in range(READ_TRIES):
            items = self._read(limit)
            if items is not None:
                return items
        return self._get_locked(limit)

    def _get_locked(self, limit: int | None) -> list[Any]:
        with self.db.transaction():  # pops kept taking the large items read: read under the lock
            items = self._read(limit)
        if items is None:  # nobody wrote meanwhile: a part is really missing
            raise self._damaged("a part of a large item is missing (removed by hand?)")
        return items

    def _read(self, limit: int | None) -> list[Any] | None:
        """The newest ``limit`` items (None: all); None if a large item's bytes were
        popped between the chunk's read and theirs."""
        try:
            stored = self._newest(limit) if limit is not None else self._everything()
        except NotAList:  # c.tail or a chunk is not a list: a later layout, or damage
            stored = None
        if stored is None:
            with self.db.snapshot():
                stored = self._newest_slowly(limit)
        items = [s if type(s) is dict else self._item(s) for s in stored]
        if any(i is _GONE for i in items):
            return None
        return items

    def _newest(self, limit: int) -> list[Any] | None:
        """The newest ``limit`` stored items in one statement, or None when c.tail
        alone cannot say (older chunks hold some, or it has no header)."""
        got = self._scope.slice(TAIL, -limit)
        if got and _is_header(got[0]):
            self._ready = True
            return got[1:] if got[0][1] < 0 else None
        return got if len(got) == limit else None

    def _everything(self) -> list[Any]:
        """Every stored item in one statement: the chunks in key order, c.tail last."""
        stored: list[Any] = []
        for key, (value, _version) in self._scope.items("c."):
            if type(value) is not list:
                raise NotAList(key)
            if key == TAIL and value and _is_header(value[0]):
                self._ready = True
                value = value[1:]
            stored += value
        return stored

    def _newest_slowly(self, limit: int | None) -> list[Any]:
        """What _newest or _everything read, from meta and the chunks it names (in a
        snapshot or a transaction, so they agree)."""
        meta = self._scope.get("meta")
        if meta is not None:
            _check_format(meta)
        try:
            tail = self._scope.slice(TAIL, 0 if limit is None else -limit - 1)
        except NotAList:
            raise self._damaged(f"{TAIL} is not a list") from None
        if tail and _is_header(tail[0]):
            tail = tail[1:]
        stored, n = tail, (meta or {}).get("last", -1)
        while n >= 0 and (limit is None or len(stored) < limit):
            want = None if limit is None else len(stored) - limit
            stored = self._scope.slice(_chunk(n), 0 if want is None else want) + stored
            n -= 1
        return stored if limit is None else stored[-limit:]

    def _item(self, stored: Any, *, remove: bool = False) -> Any:
        """The item a chunk value stands for (``_GONE`` if a part is missing)."""
        if isinstance(stored, dict):
            return stored
        if stored[0] == "v":
            return stored[1]
        _, n, count = stored
        parts = [self._scope.get_bytes(_part(n, k)) for k in range(count)]
        if None in parts:
            return _GONE
        if remove:
            for k in range(count):
                self._scope.delete(_part(n, k))
        return json.loads(b"".join(parts))  # type: ignore[arg-type]

    # writing

    def _meta(self) -> dict[str, Any]:
        """meta for a write (inside its transaction): checked, layout 1 brought to 2
        (its last chunk, if emptied by pops, removed); a new one if none."""
        meta = self._scope.get("meta")
        if meta is None:
            return {"format": FORMAT, "last": -1, "spills": 0, "new": True}
        _check_format(meta)
        if meta["format"] < FORMAT:
            last = meta["last"]
            if last >= 0 and self._scope.length(_chunk(last)) == 0:
                self._scope.delete(_chunk(last))
                last -= 1
            meta = {"format": FORMAT, "last": last, "spills": meta["spills"], "new": True}
        return meta

    def _save(self, meta: dict[str, Any]) -> None:
        if meta.pop("new", False):
            self._scope.put("meta", meta)
        self._ready = True

    def _tail(self, meta: dict[str, Any]) -> list[Any]:
        """c.tail's items (inside a write), its header put back if it had none."""
        tail = self._scope.slice(TAIL)
        if tail and _is_header(tail[0]):
            if tail[0][1] == meta["last"]:
                return tail[1:]
            tail = tail[1:]
        self._scope.put(TAIL, [_header(meta["last"]), *tail])
        return tail

    def _add(self, items: list[Any]) -> None:
        if self._ready:
            try:
                n = self._scope.append(TAIL, [_stored(i) for i in items]).length
            except (TooLarge, InvalidValue, NotAList):
                pass  # the tail is full, an item needs bytes, or another layout
            else:
                if n == len(items):  # c.tail was not there (removed by hand): its header
                    with self.db.transaction():
                        meta = self._meta()
                        self._tail(meta)
                        self._save(meta)
                return
        self._add_carefully(items)

    def _add_carefully(self, items: list[Any]) -> None:
        planned = [_plan(item) for item in items]  # TypeError before anything is written
        with self.db.transaction():
            meta = self._meta()
            head = self._scope.slice(TAIL, 0, 1)
            if not head or not _is_header(head[0]) or head[0][1] != meta["last"]:
                self._tail(meta)
            stored = [self._spill(meta, p) if isinstance(p, bytes) else p[0] for p in planned]
            try:
                self._scope.append(TAIL, stored)
            except TooLarge:
                self._seal(meta, stored)
            self._save(meta)

    def _seal(self, meta: dict[str, Any], new: list[Any]) -> None:
        """c.tail is full: its items and ``new`` become chunks c.<last+1>..., but the
        newest that fit in CHUNK_BYTES / KEEP_FRACTION, which stay in c.tail."""
        stored = self._scope.slice(TAIL)[1:] + new
        sizes = [_size(s) for s in stored]
        cut, kept = len(stored), 2
        while cut and kept + sizes[cut - 1] + 1 <= CHUNK_BYTES // KEEP_FRACTION:
            cut -= 1
            kept += sizes[cut] + 1
        chunk: list[Any] = []
        size = 2  # of the chunk's JSON: "[]"
        for s, n in zip(stored[:cut], sizes[:cut]):
            if chunk and size + 1 + n > CHUNK_BYTES:
                meta["last"] += 1
                self._scope.put(_chunk(meta["last"]), chunk)
                chunk, size = [], 2
            chunk.append(s)
            size += n + (1 if len(chunk) > 1 else 0)
        if chunk:
            meta["last"] += 1
            self._scope.put(_chunk(meta["last"]), chunk)
        meta["new"] = True
        self._scope.put(TAIL, [_header(meta["last"]), *stored[cut:]])

    def _spill(self, meta: dict[str, Any], text: bytes) -> list[Any]:
        n = meta["spills"]
        meta["spills"], meta["new"] = n + 1, True
        parts = [text[i:i + PART_BYTES] for i in range(0, len(text), PART_BYTES)]
        for k, part in enumerate(parts):
            self._scope.put_bytes(_part(n, k), part)
        return ["x", n, len(parts)]

    def _pop(self) -> Any | None:
        try:
            popped = self._scope.pop(TAIL)
        except NotAList:
            popped = []
        if not popped or _is_header(popped[0]):
            return self._pop_carefully()
        stored = popped[0]
        if type(stored) is dict:
            return stored
        if stored[0] == "v":
            return stored[1]
        with self.db.transaction():  # a large item: its bytes go with it
            item = self._item(stored, remove=True)
            if item is _GONE:  # removed by hand: the marker goes back where it was
                self._scope.append(TAIL, [stored])
        if item is _GONE:
            raise self._damaged("a part of a large item is missing (removed by hand?)")
        return item

    def _pop_carefully(self) -> Any | None:
        """A pop past c.tail's items (or of its header): in one transaction, the newest
        item of c.tail or else of the older chunks; the header put back."""
        with self.db.transaction():
            if self._scope.get("meta") is None and not self._scope.length(TAIL):
                return None  # nothing was ever written here: write nothing
            meta = self._meta()
            tail = self._tail(meta)
            stored = None
            if tail:  # added since the pop that found none: the newest is here
                stored = self._scope.pop(TAIL)[0]
            while stored is None and meta["last"] >= 0:
                key = _chunk(meta["last"])
                got = self._scope.pop(key)
                if got:
                    stored = got[0]
                if not got or not self._scope.length(key):  # emptied: gone, header moves
                    self._scope.delete(key)
                    meta["last"] -= 1
                    meta["new"] = True
                    self._scope.put(TAIL, [_header(meta["last"])])
            self._save(meta)
            if stored is None:
                return None
            item = self._item(stored, remove=True)
            if item is _GONE:  # raised inside: the pop is rolled back
                raise self._damaged("a part of a large item is missing (removed by hand?)")
        return item

    def _clear(self) -> None:
        with self.db.transaction():
            meta = self._scope.get("meta")
            if meta is not None:
                _check_format(meta)
            if self._scope.clear():  # meta stays: older agentstates keep refusing the session
                self._scope.put("meta", {"format": FORMAT, "last": -1, "spills": 0})
                self._scope.put(TAIL, [_header(-1)])
                self._ready = True


_GONE: Any = object()


async def _settled(fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(*args)`` in a worker thread; when cancelled, wait for its outcome first.

    The thread cannot be stopped: a caller that gave up before its commit
    might retry and write twice. So CancelledError is raised only once the
    transaction has committed or rolled back (SQLiteSession does the same).
    The executor's future is awaited through ``shield`` rather than a task of
    its own: ~15 µs less a write (benchmarks/ADAPTER-OPENAI-AGENTS.md).
    """
    loop = asyncio.get_running_loop()
    # The caller's context goes along, as asyncio.to_thread does: a call made inside
    # another thread's transaction() is refused there instead of waiting for it.
    future = loop.run_in_executor(None, functools.partial(contextvars.copy_context().run,
                                                          fn, *args))
    cancelled: asyncio.CancelledError | None = None
    while True:
        try:
            await asyncio.shield(future)
        except asyncio.CancelledError as e:
            cancelled = cancelled or e
            if not future.done():
                continue  # the caller gave up: wait for the outcome all the same
        except BaseException:
            pass  # fn's error: future.result() raises it
        break
    if cancelled is not None:
        if not future.cancelled():
            future.exception()  # retrieved: the cancellation is what the caller asked for
        raise cancelled
    return future.result()
