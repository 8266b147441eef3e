"""The file's connections: opening, one connection per thread, fork, transactions.

One apsw connection per thread (a connection carries one transaction at a
time), closed when its thread ends; a ``fork()``ed child closes the ones it
inherited and opens its own. A write outside ``db.transaction()`` is
:meth:`Store.call_write` (group commit, ``group_commit.py``); a
``transaction()`` block is :meth:`Store.write` (``transactions.py``); reads
take the thread's connection (each statement sees one snapshot) or a read
transaction (:meth:`Store.snapshot`). Driver errors are translated where they
enter the library (``errors.py``).
"""

from __future__ import annotations

import contextvars
import errno
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import apsw

from ..._encoding import fs_path
from ...errors import Busy, Closed, StorageError
from ..base import check_owner
from .busy import Releases, releases, wait_up_to
from .errors import translate
from . import guard, schema
from .group_commit import GroupCommit, _Pending
from .transactions import Read, Write
from .waiter import DataVersionWaiter

SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
PREFETCH = 192 * 1024  # bytes at the start of a file asked of the OS at open (see _create_file)
_fadvise = getattr(os, "posix_fadvise", None)  # not on macOS or Windows

# Connections that were in use when this process was fork()ed: SQLite state
# copied mid-call, so they are neither used nor closed here (kept alive, so
# garbage collection does not close them either), and their files are refused.
_abandoned: list[apsw.Connection] = []
_tainted: set[str] = set()
_stores: weakref.WeakSet[Store] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """SQLite's lock bookkeeping is per process and a fork copies it: a child that
    kept the parent's connections would hold locks it does not really hold, and
    every connection it opens to the same file would trust them. So the child
    closes the idle inherited connections at once (their close releases nothing
    of the parent's, and a checkpoint needs a lock the parent's holds); a file
    with a connection caught mid-transaction is refused in the child."""
    pid = os.getpid()
    for store in list(_stores):
        store._after_fork(pid)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_thread_conn(store_ref: Any, c: apsw.Connection, pid: int) -> None:
    """Close a thread's connection when the thread ends (not in a forked child)."""
    if os.getpid() != pid:
        return
    store = store_ref()
    if store is not None:
        with store._lock:
            if c in store._conns:
                store._conns.remove(c)
    try:
        c.close(True)
    except apsw.Error:
        pass


class _ThreadConn:
    """Lives in a thread's local storage: when the thread ends, its connection closes."""

    __slots__ = ("__weakref__",)


class Store(GroupCommit):
    """Connections to one database file, shared by the threads of a process."""

    def __init__(
        self, path: str | os.PathLike[str], durability: str, busy_timeout: float,
        vfs: str | None = None,
    ) -> None:
        self.path = os.path.abspath(fs_path(path))
        self.durability = durability
        self.busy_ms = max(0, int(busy_timeout * 1000))
        self.vfs = vfs
        self._lock = threading.Lock()
        self._local = threading.local()
        self._conns: list[apsw.Connection] = []
        self._pid = os.getpid()
        self._closed = False
        self._releases: Releases = releases(self.path)  # wakes this process's lock waiters
        # Called before each housekeep_every-th outermost COMMIT, inside the
        # transaction: the bounded purge of old feed rows and expired keys.
        self.housekeeping: Callable[[apsw.Connection], Any] | None = None
        self.housekeep_every = 8  # a few rows each step, so no write pays much
        self._writes = 0
        # The transaction the running code is inside of: a token per
        # outermost BEGIN, [True] while it is open. A thread's connection
        # carries one transaction, but asyncio tasks on one thread interleave:
        # a call from a task that did not open the transaction must not
        # silently join it (and vanish with its rollback).
        self._txn: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
            "agentstate_txn", default=None)
        # Group commit: writes waiting for a leader, and whether one is leading.
        self._glock = threading.Lock()
        self._queue: list[_Pending] = []
        self._leading = False
        # At durability normal too: there is no fsync to share, but a writer that
        # waits queues here instead of sleeping in SQLite's busy handler, which
        # doubles a server's PUTs (benchmarks/SERVER-GROUP-COMMIT.md).
        self.group_commit = True  # False: one transaction per write (for comparison)
        if self.path in _tainted:
            raise StorageError(
                f"{self.path} was in use by another thread when this process was forked: "
                "open it in a process started with the spawn method, or fork while idle"
            )
        self._create_file()
        self.conn()  # opens, applies the schema or refuses the file
        _stores.add(self)
        self._held = guard.hold(self.path)

    # -- opening -------------------------------------------------------------

    def _create_file(self) -> None:
        try:
            try:
                # Owner-only from the first byte; SQLite gives -wal and -shm the
                # same mode as the database file.
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except FileNotFoundError:  # its folder is missing: made, then again
                os.makedirs(os.path.dirname(self.path), mode=0o700, exist_ok=True)
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            if e.errno == errno.EISDIR or os.path.isdir(self.path):
                raise StorageError(f"{self.path} is a directory, not a database file") from None
            raise StorageError(f"cannot open {self.path}: {e.strerror or e}") from None
        try:
            if os.fstat(fd).st_size == 0:
                os.fchmod(fd, 0o600)  # whatever the umask
            elif _fadvise is not None:
                # Opening reads the header, the schema's pages and the tables'
                # root pages: in a file made from schema.sql all of them lie in
                # its first PREFETCH bytes. Asked for at once, they come in one
                # read instead of one read each when the file is not in the OS
                # page cache (a cold open; benchmarks/PYTHON-COST.md).
                _fadvise(fd, 0, PREFETCH, os.POSIX_FADV_WILLNEED)
        finally:
            os.close(fd)

    def _connect(self) -> apsw.Connection:
        """A new connection, ready. While another process creates the file, switches it
        to WAL or recovers it, SQLite can answer SQLITE_BUSY at once, without calling the
        busy handler: opening then starts again, each attempt waiting no longer than what
        is left of busy_timeout."""
        deadline = time.monotonic() + self.busy_ms / 1000
        pause = 0.001
        while True:
            try:
                return self._connect_once(max(0, int((deadline - time.monotonic()) * 1000)))
            except Busy:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    def _connect_once(self, busy_ms: int) -> apsw.Connection:
        try:
            c = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READWRITE, vfs=self.vfs)
        except apsw.Error as e:
            raise StorageError(f"cannot open {self.path}: {e}") from None
        try:
            wait_up_to(c, busy_ms, self._releases)  # this attempt's share; its own once ready
            c.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
            c.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
            # A plan that never depends on bound values. Without this, SQLite (built
            # with STAT4, as apsw's is) prepares a statement again whenever a value
            # bound to a LIMIT or a range with ORDER BY changes: a range read of a few
            # keys took ~13 us instead of ~6 (benchmarks/PYTHON-COST.md). No statement
            # of the store has a plan that differs with it (its tests' statements,
            # checked with EXPLAIN QUERY PLAN).
            c.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
            if c.readonly("main"):
                raise StorageError(f"{self.path} is read-only for this process (file permissions)")
            version = schema.check_header(c, self.path)
            mode = c.pragma("journal_mode", "wal")
            if mode != "wal":
                raise StorageError(f"cannot switch {self.path} to WAL mode (got {mode})")
            c.pragma("synchronous", SYNCHRONOUS[self.durability])
            c.pragma("foreign_keys", "ON")
            c.pragma("cache_size", -16384)  # 16 MiB
            # Statement journals in memory: with temp files allowed, SQLite gives
            # each write statement's journal a 64 KiB first chunk, and once the
            # page cache has grown the heap, freeing it at the heap's top trims
            # the heap and the next statement grows it again (a brk pair and
            # fresh pages per statement): a put at NORMAL then costs ~3x the
            # CPU. In memory the chunks are 1 KiB. (VACUUM builds its copy in
            # the temp store: it wants temp_store FILE around it.)
            c.pragma("temp_store", "MEMORY")
            if version != schema.SCHEMA_VERSION:
                schema.ensure_schema(c, self.path)
            wait_up_to(c, self.busy_ms, self._releases)
        except BaseException as e:
            c.close(True)
            if isinstance(e, apsw.Error):
                raise translate(e) from None
            raise
        return c

    def clock(self) -> float:
        """The store's clock: this machine's (unix time)."""
        return time.time()

    # -- per-thread connections ---------------------------------------------

    def conn(self) -> apsw.Connection:
        if self._closed:
            self.drop_local()
            raise Closed(f"the database {self.path} is closed")
        c = getattr(self._local, "conn", None)
        if c is None:
            if self.path in _tainted:
                raise StorageError(
                    f"{self.path} was in use by another thread when this process was forked: "
                    "open it in a process started with the spawn method, or fork while idle"
                )
            c = self._connect()
            with self._lock:
                if self._closed:
                    c.close(True)
                    raise Closed(f"the database {self.path} is closed")
                self._conns.append(c)
            holder = _ThreadConn()
            weakref.finalize(holder, _close_thread_conn, weakref.ref(self), c, os.getpid())
            self._local.holder = holder
            self._local.conn = c
            self._local.depth = 0
            self._local.owner = None
            self._local.solo = False  # see call_write
            # Python runs signal handlers (KeyboardInterrupt) in the main thread,
            # between any two steps: its writes never lead a group (see call_write).
            self._local.main = threading.current_thread() is threading.main_thread()
        return c

    def drop_local(self) -> None:
        """After close(): close this thread's connection if close() could not (it was busy)."""
        c = getattr(self._local, "conn", None)
        if c is not None and os.getpid() == self._pid:
            self._local.conn = None
            try:
                c.close(True)
            except apsw.Error:
                pass

    def check_owner(self) -> None:
        """Refuse a call from code that is not inside this thread's open transaction."""
        check_owner(self._txn, self._local)

    def _after_fork(self, pid: int) -> None:
        """In a fork()ed child: drop the parent's connections (see _after_fork_in_child)."""
        if pid == self._pid:
            return
        conns, self._conns = self._conns, []
        self._lock = threading.Lock()  # the parent's may be held by a thread not copied
        self._glock = threading.Lock()
        self._queue, self._leading = [], False  # the parent's waiting threads are not copied
        self._releases = releases(self.path)  # the child's own (busy.py forgot the parent's)
        self._local = threading.local()
        self._pid = pid
        for c in conns:
            try:
                if c.in_transaction:
                    raise RuntimeError("in a transaction")
                c.close(True)
            except Exception:  # in use by a parent thread at fork time
                _abandoned.append(c)
                _tainted.add(self.path)

    def close(self) -> None:
        """Close every connection. One in use by another thread at this moment
        cannot be closed from here: that thread closes it as its call returns."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conns, self._conns = self._conns, []
        guard.release(self._held)
        for c in conns:
            try:
                c.close(True)
            except apsw.Error:
                pass

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            self.drop_local()  # one close() found busy in this thread
            raise Closed(f"the database {self.path} is closed")

    @contextmanager
    def waiter(self) -> Iterator[DataVersionWaiter]:
        """Something to wait on for another connection's commit (the change feed)."""
        self.check_open()
        w = DataVersionWaiter(self.path, self.vfs)
        try:
            yield w
        finally:
            w.close()

    # -- transactions --------------------------------------------------------

    def write(self) -> Write:
        """One write transaction (BEGIN IMMEDIATE), or a savepoint inside one."""
        return Write(self)
    def read(self) -> Read:
        """A connection for reading; each statement sees one consistent snapshot."""
        return Read(self)

    def call_read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(connection, *args)``: what ``with self.read() as c`` does, as one call
        (no context manager's two method calls: ~0.3 µs less on get, the hottest read)."""
        c = self.conn()
        local = self._local
        if local.depth:
            self.check_owner()
        try:
            return fn(c, *args)
        except apsw.Error as e:
            raise translate(e) from None
        finally:
            if self._closed and not local.depth:
                self.drop_local()

    @contextmanager
    def snapshot(self) -> Iterator[apsw.Connection]:
        """Several reads that must see the same state: a read transaction (inside one
        already, or inside a write transaction, that one)."""
        c = self.conn()
        if self._local.depth or c.in_transaction:
            with self.read() as c:
                yield c
            return
        try:
            c.execute("BEGIN")
        except apsw.Error as e:
            raise translate(e) from None
        try:
            yield c
        except apsw.Error as e:
            raise translate(e) from None
        finally:
            try:
                c.execute("COMMIT")
            except apsw.Error:
                pass
            if self._closed:
                self.drop_local()

    def in_write(self) -> bool:
        return bool(getattr(self._local, "depth", 0))

    def in_snapshot(self) -> bool:
        """A read transaction of this thread is open outside a write: snapshot()."""
        c = getattr(self._local, "conn", None)
        return not self.in_write() and c is not None and c.in_transaction

    def query(self, sql: str, args: Any = ()) -> list[tuple[Any, ...]]:
        with self.read() as c:
            return c.execute(sql, args).fetchall()
