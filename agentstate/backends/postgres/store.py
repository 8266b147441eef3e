"""The PostgreSQL store: a pool of connections shared by a process's threads, and fork().

A ``psycopg_pool.ConnectionPool`` of autocommit connections is shared by the
threads of a process. Every write is one call of a server function (see
``schema_postgres.sql``), so a call outside ``db.transaction()`` is a single
statement in its own transaction, sent in one round trip with what follows its
COMMIT (``statements.py``). An operation of several statements, and a
``transaction()`` block, runs in ``BEGIN`` ... ``COMMIT`` on one connection held
by its thread, with a SAVEPOINT around each nested write so a refused call
undoes only itself (``transactions.py``). psycopg errors are translated where
they enter the library (``errors.py``).
"""

from __future__ import annotations

import contextvars
import os
import threading
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
from psycopg.types.numeric import Int8Dumper
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ...errors import Busy, Closed, StorageError
from ..base import check_owner
from .errors import first_line, translate
from .schema import ensure_schema
from .statements import BEGIN_SNAPSHOT, READ, AfterCommit, Conn, first, quiet_rollback, readable
from .transactions import _Read, _Write
from .waiter import NotifyWaiter

POOL_MAX = 16  # connections per process: one per thread inside a write, at most
T = TypeVar("T")


def redact(url: str) -> str:
    """The URL without its password, for messages and ``db.path``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


# Every connection is opened so: UTF-8 whatever PGCLIENTENCODING says (values are Unicode).
CONNECT: dict[str, Any] = {"autocommit": True, "client_encoding": "UTF8"}

# The open stores of this process, and what a fork()ed child inherited of them:
# kept, so that garbage collection never closes them (see Store._after_fork).
_stores: weakref.WeakSet[Store] = weakref.WeakSet()
_abandoned: list[Any] = []


def _after_fork_in_child() -> None:
    for store in list(_stores):
        store._after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _check_encoding(c: psycopg.Connection, where: str) -> None:
    """Refuse a database that cannot hold every value (any Unicode text)."""
    encoding = first(c.execute("SHOW server_encoding"))
    if encoding != "UTF8":
        raise StorageError(
            f"{where}: the database's encoding is {encoding}, which cannot hold every value: "
            "agentstate needs a UTF8 database (CREATE DATABASE name ENCODING 'UTF8' "
            "TEMPLATE template0)")


class Store:
    """Connections to one store (the tables in one schema), shared by a process's threads."""

    def __init__(self, url: str, durability: str, busy_timeout: float) -> None:
        self.url = url
        self.path = redact(url)
        self.durability = durability
        self.busy_timeout = busy_timeout
        self._local = threading.local()
        self._lock = threading.Lock()
        self._closed = False
        self._writes = 0  # counts the writes; every 16th asks whether the feed has work due
        self._waiters: list[NotifyWaiter] = []
        self._conns: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()  # every one opened
        self._inherited: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()  # after fork()
        # The transaction the running code is inside of (see _connection.Store).
        self._txn: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
            "agentstate_pg_txn", default=None)
        with self._connect() as c:  # a clear error for a bad URL or an unreachable server
            _check_encoding(c, self.path)
            self.schema = ensure_schema(c, self.path)
            self.channel = first(c.execute("SELECT feed_channel()"))
        self.pool: ConnectionPool | None = None
        self._open_pool()
        _stores.add(self)

    def _open_pool(self) -> None:
        pool = ConnectionPool(
            self.url, min_size=1, max_size=POOL_MAX, kwargs=CONNECT, configure=self._configure,
            open=False, name="agentstate", timeout=max(self.busy_timeout, 0.05))
        try:  # with its first connection ready (else the first call would open a second)
            pool.open(wait=True, timeout=max(self.busy_timeout, 10.0))
        except PoolTimeout:
            pool.close()
            raise StorageError(f"cannot open connections to {self.path}") from None
        self.pool = pool

    def _after_fork(self) -> None:
        """In a fork()ed child: the connections are the parent's (the same server sessions).
        Their sockets are pointed at /dev/null, so that nothing is ever sent on them from
        here (not even the goodbye their garbage collection would send), and they are
        kept, never used; the child opens a pool of its own on its first call."""
        devnull = os.open(os.devnull, os.O_RDWR)
        try:
            for conn in list(self._conns):
                try:
                    os.dup2(devnull, conn.pgconn.socket)
                except (psycopg.Error, OSError):
                    pass  # closed already
        finally:
            os.close(devnull)
        _abandoned.append((self.pool, list(self._conns), self._waiters))
        self._inherited, self._conns = self._conns, weakref.WeakSet()
        self._lock = threading.Lock()  # the parent's may be held by a thread not copied
        self._local = threading.local()
        self._waiters = []
        self.pool = None

    # -- connections ----------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        """A connection of its own (schema setup, NOTIFY waiters), set up like the pool's."""
        try:
            c = psycopg.connect(self.url, **CONNECT)
        except psycopg.Error as e:
            raise StorageError(f"cannot connect to {self.path}: {first_line(e)}") from None
        try:
            self._configure(c)
        except BaseException:
            c.close()
            raise
        return c

    def _configure(self, c: psycopg.Connection) -> None:
        self._conns.add(c)
        c.cursor_factory = AfterCommit  # what follows a COMMIT never fails a committed write
        # One int type for every integer parameter, so a statement is prepared
        # once, whatever the size of the numbers it is called with.
        c.adapters.register_dumper(int, Int8Dumper)
        lock_ms = max(1, int(self.busy_timeout * 1000))  # 0 would mean "wait forever"
        sync = "on" if self.durability == "full" else "off"
        # READ COMMITTED whatever the server's default: the functions count on a new
        # snapshot per statement. Standard strings: inline() writes literals so.
        c.execute(f"SET lock_timeout = {lock_ms}; SET synchronous_commit = {sync}; "
                  "SET TimeZone = 'UTC'; SET default_transaction_isolation = 'read committed'; "
                  "SET standard_conforming_strings = on")

    def _checkout(self) -> psycopg.Connection:
        if self._closed:
            raise Closed(f"the database {self.path} is closed")
        if self.pool is None:  # a fork()ed child's first call
            with self._lock:
                if self.pool is None and not self._closed:
                    self._open_pool()
        pool = self.pool
        if pool is None:
            raise Closed(f"the database {self.path} is closed")
        while True:
            try:
                raw = pool.getconn()
            except PoolClosed:
                raise Closed(f"the database {self.path} is closed") from None
            except PoolTimeout:
                stats = pool.get_stats()
                if stats.get("pool_size", 0) < POOL_MAX:
                    raise StorageError(f"cannot reach the server of {self.path} (no connection "
                                       f"within {self.busy_timeout:g} s)") from None
                raise Busy(f"all {POOL_MAX} connections to {self.path} stayed in use for "
                           f"{self.busy_timeout:g} s") from None
            if not readable(raw):
                return raw
            # An idle connection has nothing to read unless the server hung up
            # on it (a restart): drop it and take another, before using it.
            raw.close()
            pool.putconn(raw)

    def _checkin(self, raw: psycopg.Connection) -> None:
        if raw in self._inherited:  # the parent's, in use when this process was forked
            return
        try:
            self.pool.putconn(raw)  # type: ignore[union-attr]
        except PoolClosed:
            raw.close()

    def _thread(self) -> threading.local:
        local = self._local
        if not hasattr(local, "depth"):
            local.depth, local.conn, local.owner, local.snap = 0, None, None, None
        return local

    def check_owner(self) -> None:
        """Refuse a call from code that is not inside this thread's open transaction."""
        check_owner(self._txn, self._thread())

    # -- transactions ---------------------------------------------------------

    def tidy_turn(self) -> bool:
        """Whether this write asks if the feed has work due (feed_due: expired keys, old
        feed rows, changes nobody numbered): every 16th write of the store's process, the
        first one included. (Threads may count a write twice or not at all: harmless.)"""
        self._writes += 1
        return self._writes % 16 == 1

    def write(self) -> _Write:
        """One write: a lone statement, a transaction, or a savepoint inside one."""
        return _Write(self)

    def read(self) -> _Read:
        """A connection for reading; each statement sees one consistent snapshot."""
        return _Read(self)

    def call_write(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(connection, *args)`` in one write: a lone statement in one round trip, or
        (several statements) one transaction; a savepoint inside ``transaction()``."""
        with _Write(self) as c:
            return fn(c, *args)

    def call_read(self, fn: Callable[..., T], *args: Any) -> T:
        with _Read(self) as c:
            return fn(c, *args)

    @contextmanager
    def snapshot(self) -> Iterator[Conn]:
        """Several reads that must see the same state: a repeatable-read transaction. Every
        read of this thread inside it (``read()``) uses it; a write is UsageError."""
        self.check_open()
        local = self._thread()
        if local.depth or local.snap is not None:
            with self.read() as c:
                yield c
            return
        raw = self._checkout()
        try:
            c = local.snap = Conn(raw, READ, BEGIN_SNAPSHOT)  # BEGIN before the first read
            try:
                yield c
            finally:
                local.snap = None
            if c.open:
                raw.execute("COMMIT")
        except psycopg.Error as e:
            quiet_rollback(raw)
            raise translate(e) from None
        except BaseException:
            quiet_rollback(raw)
            raise
        finally:
            self._checkin(raw)

    def in_write(self) -> bool:
        return bool(getattr(self._local, "depth", 0))

    def in_snapshot(self) -> bool:
        return getattr(self._local, "snap", None) is not None

    def query(self, sql: str, args: Any = None) -> list[tuple[Any, ...]]:
        with self.read() as c:
            return c.execute(sql, args).fetchall()

    def clock(self) -> float:
        """The server's clock (unix time): the store's clock, for cutoffs."""
        with self.read() as c:
            return c.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]

    # -- the change feed's wake-ups ------------------------------------------

    @contextmanager
    def waiter(self) -> Iterator[NotifyWaiter]:
        """Something to wait on for another client's commit (LISTEN on the store's channel)."""
        self.check_open()
        with self._lock:
            w = self._waiters.pop() if self._waiters else None
        if w is None or not w.resume():
            w = NotifyWaiter(self)
        try:
            yield w
        finally:
            # Idle, it listens to nothing: nobody would read its notifications, and
            # the server keeps each one (in a queue shared by every database on it)
            # until its slowest listener has read it.
            pooled = False
            if len(self._waiters) < 4 and w.park():
                with self._lock:
                    if not self._closed and len(self._waiters) < 4:
                        self._waiters.append(w)
                        pooled = True
            if not pooled:
                w.close()

    # -- closing --------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise Closed(f"the database {self.path} is closed")

    def close(self) -> None:
        """Close the pool; a connection in use by another thread closes as it is returned."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            waiters, self._waiters = self._waiters, []
        for w in waiters:
            w.close()
        if self.pool is not None:
            self.pool.close(timeout=1.0)
