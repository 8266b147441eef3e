"""The connection layer: opening, pragmas, schema and migrations, transactions.

One apsw connection per thread (a connection carries one transaction at a
time), closed when its thread ends; a ``fork()``ed child closes the ones it
inherited and opens its own. Every write goes through :meth:`Store.write`:
``BEGIN IMMEDIATE`` so a writer takes the write lock up front (a deferred
transaction that upgrades later can fail with SQLITE_BUSY regardless of the
timeout), ROLLBACK on any exception, COMMIT only on success, and SAVEPOINTs
when nested inside ``db.transaction()``. Driver errors are translated here,
where they enter the library.

Group commit (:meth:`Store.call_write`): a write outside ``db.transaction()``
that finds no commit under way is a plain write transaction. One that finds a
commit under way queues; when that commit ends, the first queued thread leads:
it runs every queued write in one transaction, each in its own SAVEPOINT (a
refused write rolls back alone), with one COMMIT — one fsync at durability
full — for them all, while the next arrivals queue for the group after. A
caller returns only after the COMMIT that covers its write. Each write has a
deadline (busy_timeout after it arrived); a leader waits for the lock no
longer than the group's earliest, so a write that cannot get the lock fails
with Busy at its own. The main thread's writes never lead (Python runs signal
handlers there, between any two steps: an interrupted leader would strand the
group): they queue as followers, or write alone when no group is under way.
"""

from __future__ import annotations

import contextvars
import errno
import os
import random
import re
import threading
import time
import weakref
from _thread import allocate_lock as _lock  # a bare lock: a cheaper wake-up than an Event
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

import apsw

from ._migrations import MIGRATIONS
from ._owner import check_owner
from .errors import AgentStateError, Busy, Closed, Damaged, InvalidValue, SchemaTooNew, StorageError

APPLICATION_ID = 1634952052  # 'agst'
SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
HOUSEKEEP_EVERY = 8  # write transactions per purge step: a few rows each, so none pays much
PREFETCH = 128 * 1024  # bytes at the start of a file asked of the OS at open (see _create_file)
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


def schema_text() -> str:
    """The schema: shipped inside the wheel, or the repository's top-level file."""
    shipped = resources.files("agentstate").joinpath("schema.sql")
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parent.parent / "schema.sql").read_text(encoding="utf-8")


SCHEMA = schema_text()
SCHEMA_VERSION = int(re.findall(r"PRAGMA user_version = (\d+);", SCHEMA)[-1])



_second = (0, "")  # the last whole second, formatted: strftime is the slow part


def now_iso() -> str:
    """The store's own UTC time, ISO-8601 with microseconds and a Z."""
    global _second
    sec, us = divmod(time.time_ns() // 1000, 1_000_000)
    cached = _second  # one read: another thread may replace it meanwhile
    if cached[0] != sec:
        cached = _second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return "%s.%06dZ" % (cached[1], us)  # %-formatting: ~0.15 us less than an f-string here


def iso(t: float) -> str:
    """A unix time as the store's ISO-8601 UTC text (comparable with now_iso())."""
    sec, us = divmod(int(t * 1_000_000), 1_000_000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(sec))}.{us:06d}Z"


def translate(e: apsw.Error) -> AgentStateError:
    """The agentstate error for a driver error."""
    if isinstance(e, (apsw.BusyError, apsw.LockedError)):
        return Busy(f"the database stayed locked by other writers: {e}")
    if isinstance(e, (apsw.CorruptError, apsw.NotADBError)):
        return Damaged(f"the database file is damaged or not SQLite: {e}")
    if isinstance(e, apsw.ConnectionClosedError):
        return Closed("the database is closed")
    return StorageError(f"storage error: {type(e).__name__}: {e}")


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


def default_path() -> str:
    return os.environ.get("AGENTSTATE_DB") or "agentstate.db"


class Store:
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
        # The transaction the running code is inside of: a token per
        # outermost BEGIN, [True] while it is open. A thread's connection
        # carries one transaction, but asyncio tasks on one thread interleave:
        # a call from a task that did not open the transaction must not
        # silently join it (and vanish with its rollback).
        # Called before each HOUSEKEEP_EVERY-th outermost COMMIT, inside the
        # transaction: the bounded purge of old feed rows and expired keys.
        self.housekeeping: Callable[[apsw.Connection], Any] | None = None
        self._writes = 0
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
            _wait_up_to(c, busy_ms)  # this attempt's share; its own once it is ready
            c.config(apsw.SQLITE_DBCONFIG_DQS_DML, 0)
            c.config(apsw.SQLITE_DBCONFIG_DQS_DDL, 0)
            if c.readonly("main"):
                raise StorageError(f"{self.path} is read-only for this process (file permissions)")
            version = self._check_header(c)
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
            if version != SCHEMA_VERSION:
                self._ensure_schema(c)
            _wait_up_to(c, self.busy_ms)
        except BaseException as e:
            c.close(True)
            if isinstance(e, apsw.Error):
                raise translate(e) from None
            raise
        return c

    def _check_header(self, c: apsw.Connection) -> int:
        """The file's schema version, once it is known to be ours (or empty)."""
        # One statement, so one snapshot: another process may commit the schema (and
        # user_version with it) between two separate reads.
        version, app, objects = c.execute(
            "SELECT user_version, application_id, (SELECT count(*) FROM sqlite_schema) "
            "FROM pragma_user_version, pragma_application_id").fetchone()
        if app not in (0, APPLICATION_ID):
            raise Damaged(f"{self.path} is an SQLite file of another application (id {app})")
        # Before anything is written (the WAL switch rewrites the header): a
        # file without our schema must be empty to become ours, and a file
        # with a schema version must carry our application id (the schema
        # sets both in one transaction), whatever its user_version.
        if version == 0 and objects:
            raise Damaged(f"{self.path} is an SQLite database but not an agentstate one")
        if version != 0 and app != APPLICATION_ID:
            raise Damaged(
                f"{self.path} is an SQLite database of another application (user_version "
                f"{version}, no agentstate application id)"
            )
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has schema version {version}; this agentstate knows up to "
                f"{SCHEMA_VERSION}: upgrade agentstate"
            )
        return version

    def _ensure_schema(self, c: apsw.Connection) -> None:
        """A new file gets the schema, an older one its migrations, in one transaction."""
        c.execute("BEGIN IMMEDIATE")
        try:
            version = self._check_header(c)  # another process may have set it up meanwhile
            if version == 0:
                c.execute(SCHEMA)
            while version < SCHEMA_VERSION and version != 0:
                MIGRATIONS[version](c, SCHEMA)
                version += 1
                c.pragma("user_version", version)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise

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

    def write(self) -> _Write:
        """One write transaction (BEGIN IMMEDIATE), or a savepoint inside one."""
        return _Write(self)

    def call_write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(connection, *args)`` in a write transaction; returns its result once
        committed. Outside ``db.transaction()`` the write joins a group commit
        with other threads' (see the module docstring); inside, it is a savepoint
        of that transaction as with :meth:`write`.

        :raises: what ``fn`` raises (its write alone is rolled back); Busy,
            Closed, StorageError (the group's transaction failed: nothing of it
            is committed, or ``outcome_unknown`` if its COMMIT failed on I/O).
        """
        c = self.conn()
        local = self._local
        if local.depth or c.in_transaction or not self.group_commit:
            # in transaction() a savepoint (in a snapshot: refused there, as always)
            with _Write(self) as c:
                return fn(c, *args)
        self.check_owner()  # inside another thread's transaction(): refused, as with write()
        if local.solo:  # a finalizer run in the bookkeeping below
            return self._alone(c, fn, args)
        # Set while this thread is in the group's bookkeeping: a write that the garbage
        # collector's finalizer starts here (at an allocation under _glock) is a plain one
        # instead of taking _glock again on the same thread.
        local.solo = True
        try:
            with self._glock:
                alone = not self._leading
                if alone:
                    # The main thread takes no leadership: an interrupt there must never
                    # leave _leading set with nobody leading.
                    self._leading = not local.main
                else:
                    item = _Pending(fn, args, time.monotonic() + self.busy_ms / 1000)
                    item.follow = local.main
                    item.wake.acquire()  # released by the leader: done, promoted, or go alone
                    self._queue.append(item)
            if alone and local.main:
                return self._alone(c, fn, args)
            if alone:  # no commit under way: a plain write; what queues meanwhile is the next group
                try:
                    return self._alone(c, fn, args)
                finally:
                    with self._glock:
                        self._hand_off()
            # No timeout of its own: the queue is in arrival order and each leader waits
            # for the lock only until its own write's deadline, so a write that cannot
            # get the lock fails with Busy at its deadline (_begin). (A timed wait here
            # cost ~6% of 16 threads' writes.)
            try:
                item.wake.acquire()
            except BaseException:  # interrupted: leave the queue (a taken write may still commit)
                with self._glock:
                    if item in self._queue:
                        self._queue.remove(item)
                        if item.lead:
                            self._hand_off()
                raise
            if item.alone:  # the main thread's, with no group left to join: a plain write
                return self._alone(c, fn, args)
            if not item.done:  # promoted: lead the group this write is in
                self._lead(c, item)
        finally:
            local.solo = False
        if item.error is not None:
            raise item.error
        return item.result

    def _alone(self, c: apsw.Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """One write in its own transaction: what ``with _Write(self)`` does, minus what
        only a transaction() block needs (its owner token, the second owner check):
        ``fn`` is a repository function, so no other code runs on this thread before
        the COMMIT. Saves ~1 µs a write (benchmarks/PYTHON-COST.md)."""
        local = self._local
        try:
            try:
                c.execute("BEGIN IMMEDIATE")  # in the try: an interrupt just after it rolls back
                local.depth, local.owner = 1, self._txn.get()  # as in _commit_group
                result = fn(c, *args)
                if self.housekeeping is not None:
                    self._writes += 1
                    if self._writes % HOUSEKEEP_EVERY == 0:
                        self.housekeeping(c)
            except BaseException as e:
                local.depth, local.owner = 0, None
                _Write._end(c, 0, e)  # rolls back; a driver error leaves translated
                raise
            try:
                local.depth, local.owner = 0, None
                _Write._end(c, 0, None)  # COMMIT; outcome_unknown if it failed on I/O
            except BaseException:  # an interrupt just before the COMMIT: not left open
                _roll_back(c)
                raise
            return result
        finally:
            if self._closed:
                self.drop_local()

    def _hand_off(self) -> None:
        """With _glock held: wake the first waiting write that may lead (not the main
        thread's) to lead the next group. If only the main thread's waits, it goes alone
        (a plain write) and nobody leads."""
        for item in self._queue:
            if not item.follow:
                item.lead = True
                item.wake.release()
                return
        for item in self._queue:
            item.alone = True
            item.wake.release()
        self._queue = []
        self._leading = False

    def _lead(self, c: apsw.Connection, mine: _Pending) -> None:
        with self._glock:
            group, self._queue = self._queue, []
        try:
            if self._begin(c, group, mine):
                self._commit_group(c, group)
        except BaseException as e:  # neither should raise: if one does, no write reads as done
            _fail([item for item in group if item.error is None], e, commit=True)
            raise
        finally:
            with self._glock:
                for item in group:
                    item.done = True
                self._hand_off()
            for item in group:
                if item is not mine:  # the others wait on their wake lock
                    item.wake.release()
            if self._closed:
                self.drop_local()

    def _commit_group(self, c: apsw.Connection, group: list[_Pending]) -> None:
        """One transaction for the group (begun); each write's outcome on its item."""
        local = self._local
        local.depth, local.owner = 1, self._txn.get()  # a nested write() becomes a savepoint
        try:
            if len(group) == 1:  # alone: no savepoint, as a plain write()
                item = group[0]
                item.result = item.fn(c, *item.args)
            else:
                for item in group:
                    c.execute("SAVEPOINT g")
                    try:
                        item.result = item.fn(c, *item.args)
                    except BaseException as e:
                        item.error = translate(e) if isinstance(e, apsw.Error) else e
                        c.execute("ROLLBACK TO g")  # fails if SQLite rolled back it all: below
                    c.execute("RELEASE g")
            ok = sum(item.error is None for item in group)
            before, self._writes = self._writes, self._writes + ok
            if (self.housekeeping is not None
                    and before // HOUSEKEEP_EVERY != self._writes // HOUSEKEEP_EVERY):
                self.housekeeping(c)
        except BaseException as e:
            local.depth = 0
            _roll_back(c)  # SQLite may have rolled back already (e.g. on SQLITE_FULL)
            _fail([item for item in group if item.error is None], e)
            return
        local.depth = 0
        try:
            c.execute("COMMIT")
        except BaseException as e:
            _roll_back(c)
            _fail([item for item in group if item.error is None], e, commit=True)

    def _begin(self, c: apsw.Connection, group: list[_Pending], mine: _Pending) -> bool:
        """BEGIN IMMEDIATE for the group, waiting for the lock no longer than the earliest
        deadline in it (its first: the queue is in arrival order). At each deadline that
        passes, the writes past theirs fail with Busy; when the leader's own does, the
        rest go back to the front of the queue for the next leader. ``group`` is left
        holding the writes the caller settles."""
        while True:
            wait = group[0].deadline - time.monotonic()
            short = wait * 1000 < self.busy_ms
            try:
                if short:
                    _wait_up_to(c, max(0, int(wait * 1000)))
                c.execute("BEGIN IMMEDIATE")
                return True
            except apsw.BusyError as e:
                now = time.monotonic()
                first = group[0]
                over = [item for item in group if item is first or item.deadline <= now]
                rest = [item for item in group if item is not first and item.deadline > now]
                _fail(over, e)
                if any(item is mine for item in over):
                    with self._glock:
                        self._queue[:0] = rest
                    group[:] = over
                    return False
                with self._glock:  # the others past their deadline: told at once
                    for item in over:
                        item.done = True
                for item in over:
                    item.wake.release()
                group[:] = rest
            except BaseException as e:  # closed meanwhile (db.close()), or a driver error
                _roll_back(c)  # begun, then interrupted: not left open
                _fail(group, e)
                return False
            finally:
                if short:
                    try:
                        _wait_up_to(c, self.busy_ms)
                    except apsw.Error:  # closed meanwhile: the next call says Closed
                        pass

    def read(self) -> _Read:
        """A connection for reading; each statement sees one consistent snapshot."""
        return _Read(self)

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
        """Several reads that must see the same state: a read transaction."""
        c = self.conn()
        if self._local.depth:
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

    def query(self, sql: str, args: Any = ()) -> list[tuple[Any, ...]]:
        with self.read() as c:
            return c.execute(sql, args).fetchall()


class _Pending:
    """One write waiting in a group commit: its function and, once done, its outcome."""

    __slots__ = ("fn", "args", "deadline", "result", "error", "done", "lead", "follow", "alone",
                 "wake")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline: float) -> None:
        self.fn, self.args, self.deadline = fn, args, deadline  # deadline: time.monotonic()
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = self.lead = False
        self.follow = False  # the main thread's: never promoted to lead
        self.alone = False  # set with follow when no group is left: its thread writes alone
        self.wake = _lock()  # acquired by its thread; released by a leader: done, or promoted


class _Patience:
    """The busy handler: try the lock again until ``ms`` after the first try, sleeping a
    random 0.5-1x of min(5 ms, 0.5 ms x 2^tries) in between. SQLite's own handler sleeps
    100 ms a try once a wait is long, so a long waiter tries ten times a second while
    newcomers try every millisecond: among 8 processes writing flat out one could lose
    every try until its busy_timeout (benchmarks/BUSY.md: 16 Busy in 6 s at busy_timeout
    1 s, the slowest process 986 writes; with this none, 1,640; writes/s 0.86-0.98x)."""

    __slots__ = ("ms", "t0")

    def __init__(self, ms: int) -> None:
        self.ms, self.t0 = ms, 0.0

    def __call__(self, tries: int) -> bool:
        now = time.monotonic()
        if tries == 0:  # SQLite counts the tries of each lock wait from 0
            self.t0 = now
        left = self.t0 + self.ms / 1000 - now
        if left <= 0:
            return False
        time.sleep(min(left, (0.5 + random.random() / 2) * min(0.005, 0.0005 * 2 ** min(tries, 4))))
        return True


def _wait_up_to(c: apsw.Connection, ms: int) -> None:
    c.set_busy_handler(_Patience(ms))


def _roll_back(c: apsw.Connection) -> None:
    """Roll back the transaction this connection is in, if any (an interrupted write's)."""
    try:
        if c.in_transaction:
            c.execute("ROLLBACK")
    except apsw.Error:  # closed meanwhile, or SQLite rolled back already
        pass


def _fail(items: list[_Pending], e: BaseException, commit: bool = False) -> None:
    """The group's transaction failed: each write gets its own error (one instance per
    thread that raises it); a failed COMMIT on I/O may still have reached the disk."""
    for item in items:
        if not isinstance(e, apsw.Error):
            item.error = e
            continue
        err = item.error = translate(e)
        if commit and isinstance(e, (apsw.IOError, apsw.FullError)):
            err.outcome_unknown = True  # type: ignore[attr-defined]


class _Write:
    """The context manager behind Store.write (a class: it is on every write's path).

    BEGIN IMMEDIATE (or SAVEPOINT when nested); ROLLBACK on any exception;
    COMMIT only on success. A COMMIT that fails with an I/O error marks the
    error ``outcome_unknown``: its WAL frames may already be on disk.
    """

    __slots__ = ("store", "c", "depth", "token", "reset")

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> apsw.Connection:
        store = self.store
        c = self.c = store.conn()
        local = store._local
        depth = self.depth = local.depth
        store.check_owner()
        if not depth and c.in_transaction:  # a snapshot(): refused before touching it
            raise StorageError("cannot start a write: this thread's connection is already in a "
                               "transaction (a read snapshot)")
        try:
            c.execute("SAVEPOINT w" if depth else "BEGIN IMMEDIATE")
            if not depth:
                self.token = local.owner = [True]
                self.reset = store._txn.set(self.token)
            local.depth = depth + 1
        except BaseException as e:
            # An interrupt (Ctrl-C) can land just after BEGIN: roll back, or this
            # thread's connection would stay in a write transaction, holding the lock.
            if not depth:
                local.owner = None
                token = getattr(self, "token", None)
                if token is not None:  # set before the interrupt: this transaction is over
                    token[0] = False
                _roll_back(c)
            if isinstance(e, apsw.Error):
                raise translate(e) from None
            raise
        return c

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        c, depth, store = self.c, self.depth, self.store
        store._local.depth = depth
        if not depth:
            self.token[0] = False
            store._local.owner = None
            try:
                store._txn.reset(self.reset)
            except ValueError:  # left in another context than it was entered in
                store._txn.set(None)
        try:
            if exc is None and not depth and store.housekeeping is not None:
                store._writes += 1
                if store._writes % HOUSEKEEP_EVERY == 0:
                    try:
                        store.housekeeping(c)
                    except BaseException as e:
                        self._end(c, depth, e)  # rolls back (and translates a driver error)
                        raise
            self._end(c, depth, exc)
        finally:
            if not depth and store._closed:
                store.drop_local()

    @staticmethod
    def _end(c: apsw.Connection, depth: int, exc: BaseException | None) -> None:
        if exc is not None:
            try:
                c.execute("ROLLBACK TO w; RELEASE w" if depth else "ROLLBACK")
            except apsw.Error:
                pass  # SQLite may have rolled back already (e.g. on SQLITE_FULL)
            if isinstance(exc, apsw.Error):
                raise translate(exc) from None
            return
        try:
            c.execute("RELEASE w" if depth else "COMMIT")
        except apsw.Error as e:
            try:
                if not depth and c.in_transaction:
                    c.execute("ROLLBACK")
            except apsw.Error:  # closed meanwhile (db.close()): nothing to roll back here
                pass
            err = translate(e)
            if not depth and isinstance(e, (apsw.IOError, apsw.FullError)):
                # The commit's WAL frames may be written before the fsync that
                # failed; recovery can replay them. Say so instead of "nothing".
                err.outcome_unknown = True  # type: ignore[attr-defined]
            raise err from None


class _Read:
    """Store.read: the connection, with driver errors translated on the way out."""

    __slots__ = ("store",)

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> apsw.Connection:
        store = self.store
        c = store.conn()
        if store._local.depth:
            store.check_owner()
        return c

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        store = self.store
        if store._closed and not store._local.depth:
            store.drop_local()
        if isinstance(exc, apsw.Error):
            raise translate(exc) from None


# Seconds between two looks at data_version while waiting: quick right after a
# change (agents often write in bursts), backing off to POLL_MAX when idle, so
# a wake-up takes at most ~POLL_MAX and an idle waiter looks ~40 times a second.
POLL_MIN, POLL_MAX = 0.005, 0.025


class DataVersionWaiter:
    """Waits for a commit by any other connection, in any process.

    ``PRAGMA data_version`` changes on a connection whenever another one
    commits; reading it looks only at the WAL index in shared memory (no lock,
    no I/O), so polling it costs well under 1% of a core. A connection of its
    own, so the waiter's thread (or event loop) keeps its usual one free.
    """

    def __init__(self, path: str, vfs: str | None) -> None:
        try:
            self.c = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READWRITE, vfs=vfs)
        except apsw.Error as e:
            raise translate(e) from None

    def mark(self) -> int:
        return self.c.pragma("data_version")

    def wait(self, mark: int, deadline: float | None) -> bool:
        """Until a commit after ``mark`` (True) or the monotonic ``deadline`` (False)."""
        interval = POLL_MIN
        while self.c.pragma("data_version") == mark:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            time.sleep(interval if left is None else min(interval, left))
            interval = min(POLL_MAX, interval * 1.5)
        return True

    async def await_change(self, mark: int) -> None:
        import asyncio

        interval = POLL_MIN
        while self.c.pragma("data_version") == mark:
            await asyncio.sleep(interval)
            interval = min(POLL_MAX, interval * 1.5)

    def close(self) -> None:
        self.c.close()
