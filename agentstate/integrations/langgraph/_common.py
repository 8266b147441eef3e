"""What the LangGraph saver and store share.

- Key tokens: LangGraph ids (thread ids, namespaces, task ids, item keys) are
  free text, agentstate keys are ``[A-Za-z0-9._:-]{1,200}``. ``esc`` maps text
  to key characters reversibly; a token too long for its slot becomes a
  128-bit hash (``_h...``), and the original always travels in the value.
- Payloads: serialized bytes up to ``INLINE`` ride inside the JSON record
  (base64); bigger ones get their own bytes keys, 1 MiB each (the core's limit
  for one value), so nothing is too large to store.
- ``conn_string``: open an agentstate file where LangGraph's SQLite classes
  take a path (``from_conn_string``), including ``":memory:"``.
- ``on_pool``: where a sync call runs. LangGraph runs a step's checkpoint
  writes on threads it has just started, and an agentstate ``Database``
  opens one connection per thread (about 2 ms each under load): a call from a
  thread new to the adapters runs on a small pool of long-lived threads of
  the database instead, which keep theirs (benchmarks/ADAPTER-LANGGRAPH.md).
"""

from __future__ import annotations

import base64
import concurrent.futures
import functools
import hashlib
import json
import os
import shutil
import string
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import agentstate
from agentstate.backends.remote import RemoteOps
from agentstate.backends.sqlite.store import Store as SqliteStore
from agentstate.integrations._escape import escape, unescape

INLINE = 2048  # bytes: a payload this small stays inside its JSON record
CHUNK = 1 << 20  # bytes: the core's limit for one value
PAGE = 500  # keys per list() call when scanning a prefix

_KEEP = frozenset(string.ascii_letters + string.digits + "-")
_COMPLEMENT = str.maketrans("0123456789abcdef", "fedcba9876543210")


class Missing(LookupError):
    """A payload key a record points at is gone: the record was deleted meanwhile."""


def esc(text: str) -> str:
    """``text`` in key characters, reversibly: ``[A-Za-z0-9-]`` stay, every other
    UTF-8 byte becomes ``_xx``. The result never contains ``.`` or ``:``, so
    those separate the parts of a key."""
    return escape(text, _KEEP, "_")


def unesc(text: str) -> str:
    """The text ``esc`` was given."""
    return unescape(text, "_")


def digest(text: str) -> str:
    """A 128-bit hash of ``text`` in key characters (26 of ``a-z2-7``)."""
    raw = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    return base64.b32encode(raw).decode("ascii").rstrip("=").lower()


def token(text: str, limit: int) -> str:
    """``esc(text)`` when it fits in ``limit`` characters, else ``_h`` + its hash.
    (``esc`` never writes ``_h``: after ``_`` come two hex digits.)"""
    e = esc(text)
    return e if len(e) <= limit else "_h" + digest(text)


def descending(text: str, max_bytes: int = 64) -> str:
    """A key part that sorts in the opposite order of ``text`` (by UTF-8 bytes):
    the complemented hex digits, then ``z``, which sorts after every hex digit,
    so a longer id that extends a shorter one sorts before it.

    :raises InvalidKey: ``text`` is longer than ``max_bytes`` bytes.
    """
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > max_bytes:
        raise agentstate.InvalidKey(
            f"id {text[:40]!r}... is {len(raw)} bytes; at most {max_bytes} keep their order"
        )
    return raw.hex().translate(_COMPLEMENT) + "z"


def keys(scope: agentstate.Scope, prefix: str, after: str | None = None, first: int = PAGE
         ) -> Iterator[str]:
    """Every key of ``scope`` starting with ``prefix`` (after ``after``), in pages
    that start at ``first`` keys and double up to PAGE: a caller that stops early
    reads little."""
    size = max(1, min(first, PAGE))
    while True:
        page = scope.list(prefix, after=after, limit=size)
        yield from page
        if len(page) < size:
            return
        after, size = page[-1], min(2 * size, PAGE)


def get_json(scope: agentstate.Scope, key: str) -> Any:
    """A JSON value, parsed here: the same as ``scope.get`` for the values we write,
    a little faster for large ones. None when absent."""
    raw = scope.get_bytes(key)
    return None if raw is None else json.loads(raw)


# -- payloads ---------------------------------------------------------------------


def segment(base: str, data: bytes | memoryview, pending: list[tuple[str, Any]]) -> dict[str, Any]:
    """The segment that finds ``data`` again: inline when small, else the keys
    ``base.0``, ``base.1``, ... which are added to ``pending`` for ``write``."""
    if len(data) <= INLINE:
        return {"data": base64.b64encode(data).decode("ascii")}
    pending.append((base, data))
    return {"key": base, "size": len(data)}


def write(scope: agentstate.Scope, pending: list[tuple[str, Any]], start: int = 0) -> None:
    """Store the chunks of ``pending`` segments, from chunk ``start`` on (call
    inside a transaction)."""
    for base, data in pending:
        for k in range(start, (len(data) + CHUNK - 1) // CHUNK):
            scope.put_bytes(f"{base}.{k}", bytes(data[k * CHUNK:(k + 1) * CHUNK]))


def stash(scope: agentstate.Scope, base: str, data: bytes | memoryview) -> dict[str, Any]:
    """``segment`` and ``write`` at once (call inside a transaction)."""
    pending: list[tuple[str, Any]] = []
    seg = segment(base, data, pending)
    write(scope, pending)
    return seg


def seg_size(seg: dict[str, Any]) -> int:
    return seg["size"] if "key" in seg else len(base64.b64decode(seg["data"]))


def seg_keys(seg: dict[str, Any]) -> list[str]:
    """The keys holding a segment's bytes ([] for inline data)."""
    if "key" not in seg:
        return []
    return [f"{seg['key']}.{k}" for k in range((seg["size"] + CHUNK - 1) // CHUNK)]


class BytesCache:
    """Recently read payloads of content-addressed keys (whose bytes never change),
    least recently used first out, at most ``limit`` bytes. Thread-safe."""

    def __init__(self, limit: int = 32 << 20) -> None:
        self.limit, self.size = limit, 0
        self._items: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> bytes | None:
        with self._lock:
            data = self._items.get(key)
            if data is not None:
                self._items.move_to_end(key)
            return data

    def put(self, key: tuple[str, str], data: bytes) -> None:
        if len(data) > self.limit // 4:
            return
        with self._lock:
            if key not in self._items:
                self._items[key] = data
                self.size += len(data)
            while self.size > self.limit:
                _, old = self._items.popitem(last=False)
                self.size -= len(old)


def fetch(scope: agentstate.Scope, seg: dict[str, Any], cache: BytesCache | None = None) -> bytes:
    """The bytes of a segment; ``cache`` only for content-addressed keys.

    :raises Missing: a chunk key is gone (deleted meanwhile).
    """
    if "key" not in seg:
        return base64.b64decode(seg["data"])
    name = (scope.id, seg["key"])
    if cache is not None and (data := cache.get(name)) is not None:
        return data
    parts = []
    for key in seg_keys(seg):
        part = scope.get_bytes(key)
        if part is None:
            raise Missing(key)
        parts.append(part)
    data = b"".join(parts)
    if cache is not None:
        cache.put(name, data)
    return data


# -- opening and threads ------------------------------------------------------------


@contextmanager
def conn_string(path: str) -> Iterator[agentstate.Database]:
    """An agentstate database at ``path``, closed on exit. ``":memory:"`` is a
    file in a private temporary folder, removed on exit (agentstate is
    file-based: its guarantees are across processes)."""
    folder = tempfile.mkdtemp(prefix="agentstate-") if path == ":memory:" else None
    db = agentstate.open(str(Path(folder) / "memory.db") if folder else path)
    try:
        yield db
    finally:
        db.close()
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


# -- which thread a sync call runs on -------------------------------------------------

POOL_THREADS = 4  # at most this many calls of one database's adapters run on the pool at once
DIRECT_AFTER = 16  # a thread that made this many calls is long-lived: it keeps its own connection

_here = threading.local()
_pools: weakref.WeakKeyDictionary[agentstate.Database, concurrent.futures.ThreadPoolExecutor] = \
    weakref.WeakKeyDictionary()
_pools_lock = threading.Lock()


def _after_fork() -> None:
    """A fork()ed child has none of the pools' threads (a pool would wait for them
    forever), and the lock may have been held by a thread it does not have."""
    global _pools_lock
    _pools_lock = threading.Lock()
    _pools.clear()


os.register_at_fork(after_in_child=_after_fork)


def _mark_pool_thread() -> None:
    _here.calls = DIRECT_AFTER


def _direct(db: agentstate.Database) -> bool:
    """Whether this thread runs its calls itself: always, unless the database is a
    SQLite file (whose connections are per thread) and this thread has no connection
    to it yet and is new here: not the main thread, not one of the pool's, and not
    one that made DIRECT_AFTER calls (it is no throwaway). A thread inside
    ``db.transaction()`` or ``db.snapshot()`` has its connection, so its calls are
    part of that (on the pool they would wait for its lock, or not see its snapshot)."""
    store = getattr(db._ops, "store", None)
    if not isinstance(store, SqliteStore) or getattr(store._local, "conn", None) is not None:
        return True
    n = getattr(_here, "calls", 0)
    if n >= DIRECT_AFTER:
        return True
    if threading.current_thread() is threading.main_thread():
        _here.calls = DIRECT_AFTER
        return True
    _here.calls = n + 1
    return False


def local(db: agentstate.Database, who: str) -> agentstate.Database:
    """``db``, if it is a file or a PostgreSQL server: the adapters' deletes, first puts
    and fallbacks run in ``transaction()``, which cannot span HTTP calls, so a remote
    database is refused here rather than failing on some calls only."""
    if isinstance(db._ops, RemoteOps):
        raise agentstate.UsageError(
            f"{who} needs a database opened with agentstate.open() (a file or a PostgreSQL "
            "server), not a remote one: some of its calls are transaction() blocks, which "
            "cannot span HTTP calls")
    return db


def pool(db: agentstate.Database) -> concurrent.futures.ThreadPoolExecutor:
    """The database's pool for the adapters' calls (made at first use; its idle threads
    end when the database object is dropped)."""
    with _pools_lock:
        found = _pools.get(db)
        if found is None:
            found = _pools[db] = concurrent.futures.ThreadPoolExecutor(
                POOL_THREADS, thread_name_prefix="agentstate-langgraph",
                initializer=_mark_pool_thread)
            weakref.finalize(db, found.shutdown, wait=False)
        return found


def on_pool(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A sync method that runs in the calling thread if that thread keeps its connection
    (``_direct``), else on the database's pool, waiting for it there. The object must
    have ``db``."""

    @functools.wraps(fn)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _direct(self.db):
            return fn(self, *args, **kwargs)
        return pool(self.db).submit(fn, self, *args, **kwargs).result()

    return method
