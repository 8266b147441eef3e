"""The PostgreSQL connection layer: a pool, transactions, the schema, errors, NOTIFY.

A ``psycopg_pool.ConnectionPool`` of autocommit connections is shared by the
threads of a process. Every write is one call of a server function (see
``schema_postgres.sql``), so a call outside ``db.transaction()`` is a single
statement in its own transaction, sent in one round trip with what follows its
COMMIT: ``BEGIN; SELECT kv_put(...); COMMIT; SELECT feed_notify()`` (the
watchers' wake-up, in a transaction of its own: see ``schema_postgres.sql``).
An operation of several statements, and a ``transaction()`` block, runs in
``BEGIN`` ... ``COMMIT`` on one connection held by its thread, with a
SAVEPOINT around each nested write so a refused call undoes only itself.
psycopg errors are translated here, where they enter the library: none
reaches the caller.
"""

from __future__ import annotations

import contextvars
import os
import re
import select
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pgerr
from psycopg.types.numeric import Int8Dumper
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ... import errors
from ..._encoding import MAX_VALUE
from ..base import check_owner
from ...errors import AgentStateError, Busy, Closed, Damaged, SchemaTooNew, StorageError, UsageError

POOL_MAX = 16  # connections per process: one per thread inside a write, at most
RETRIES = 3  # a lone statement that lost a deadlock did nothing: it is run again
OUR_TABLES = ("kv", "list_item", "kv_deleted", "run", "run_entry", "session", "turn", "change",
              "feed_head", "change_new", "change_pending", "setting", "token")
T = TypeVar("T")
RECHECK = 1.0  # seconds a watcher waits for a NOTIFY before it looks again anyway


def schema_text() -> str:
    """The schema: shipped inside the wheel, or the repository's top-level file."""
    shipped = resources.files("agentstate").joinpath("schema_postgres.sql")
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    return (Path(__file__).resolve().parents[3] / "schema_postgres.sql").read_text(encoding="utf-8")


SCHEMA = schema_text()
SCHEMA_VERSION = int(re.findall(r"INSERT INTO agentstate_version \(version\) VALUES \((\d+)\);",
                                SCHEMA)[-1])


def schema_function(name: str) -> str:
    """The CREATE OR REPLACE statement of one function of the schema, for a migration
    (so that its definition exists once: in the schema)."""
    m = re.search(rf"^CREATE FUNCTION {name}\(.*?\$\$;$", SCHEMA, re.S | re.M)
    if m is None:
        raise LookupError(f"schema_postgres.sql has no function {name}")
    return "CREATE OR REPLACE" + m.group(0)[len("CREATE"):]


def _v1_to_v2(c: psycopg.Connection) -> None:
    """Issue 26: key locks (versions never reused, reads of absent keys in a transaction
    lock them), times of the write itself, a feed purged by prefix, fork(upto) overflow."""
    for name in ("kv_next_version", "kv_key_lock", "kv_read_lock", "kv_put", "kv_delete", "kv_touch",
                 "kv_append", "kv_pop", "kv_drop_scope", "kv_purge_expired", "feed_purge_step",
                 "feed_number", "feed_notify", "run_fork"):
        c.execute(schema_function(name))


# MIGRATIONS[n](conn) takes a store from schema version n to n + 1, inside the
# one transaction (under the advisory lock) that opens it.
MIGRATIONS: dict[int, Callable[[psycopg.Connection], None]] = {1: _v1_to_v2}


def redact(url: str) -> str:
    """The URL without its password, for messages and ``db.path``."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


# -- errors --------------------------------------------------------------------

_BUSY = (pgerr.LockNotAvailable, pgerr.DeadlockDetected, pgerr.SerializationFailure,
         pgerr.QueryCanceled)
_RETRY = (pgerr.DeadlockDetected, pgerr.SerializationFailure)


def lost_connection(e: BaseException) -> bool:
    """The connection broke (server restart, network): not an answer to the statement."""
    if isinstance(e, (pgerr.AdminShutdown, pgerr.CrashShutdown, pgerr.CannotConnectNow)):
        return True
    return isinstance(e, psycopg.OperationalError) and (e.sqlstate is None
                                                         or e.sqlstate.startswith("08"))


def translate(e: psycopg.Error, outcome_unknown: bool = False) -> AgentStateError:
    """The agentstate error for a psycopg error; ``outcome_unknown`` when a lost
    connection leaves a write's fate unknown (a COMMIT, or a lone statement)."""
    hint = e.diag.message_hint or "" if e.diag is not None else ""
    if hint.startswith("agentstate:"):
        cls = getattr(errors, hint[len("agentstate:"):])
        msg = e.diag.message_primary or str(e)
        detail = e.diag.message_detail or ""
        if cls is errors.VersionConflict:
            return cls(msg, int(detail))
        if cls is errors.SessionBusy:
            return cls(msg, detail)
        if cls is errors.TooLarge:
            return cls(msg, int(detail), MAX_VALUE)
        return cls(msg)
    if isinstance(e, _BUSY):
        return Busy(f"the server kept the rows locked by other writers: {e.sqlstate}: "
                    f"{_first_line(e)}")
    if isinstance(e, (pgerr.UndefinedTable, pgerr.UndefinedFunction)):
        return Damaged(f"the store's tables or functions are missing (dropped outside agentstate?): "
                       f"{_first_line(e)}")
    if isinstance(e, pgerr.InFailedSqlTransaction):
        return UsageError("an earlier error aborted this transaction(): leave the block")
    if lost_connection(e):
        err = StorageError(f"lost the connection to the server: {_first_line(e)}")
        err.outcome_unknown = outcome_unknown
        return err
    return StorageError(f"the server refused: {e.sqlstate or type(e).__name__}: {_first_line(e)}")


def _first_line(e: BaseException) -> str:
    return str(e).strip().split("\n", 1)[0]


# -- one connection as the repositories see it --------------------------------

AUTO, TXN, READ = "auto", "txn", "read"
# What opens a write transaction; set_config(..., true) lasts until its end, and
# tells feed_add() to hold the changes until feed_flush() at COMMIT.
BEGIN_WRITE = ("BEGIN", "SELECT set_config('agentstate.block', 'on', true)")
BEGIN_SNAPSHOT = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",)
# Before a read of the feed: number the committed changes, and commit that,
# before the read's snapshot is taken (sent in the same round trip).
SEQUENCE = ("BEGIN ISOLATION LEVEL READ COMMITTED", "SELECT feed_sequence()", "COMMIT")
# What follows a write's COMMIT, in the same round trip: the wake-up.
AFTER_COMMIT = "SELECT feed_notify()"
SAVEPOINT, RELEASE = "SAVEPOINT w", "RELEASE SAVEPOINT w"


# -- a lone write and its wake-up in one round trip --------------------------------

_PLACEHOLDER = re.compile(r"%(?:\((\w+)\))?s|%%")
_SPLIT: dict[str, list[str | tuple[str | int]]] = {}  # query -> text pieces and placeholders
_FLOATS = {float("inf"): "'Infinity'::float8", float("-inf"): "'-Infinity'::float8"}


class AfterCommit(psycopg.Cursor):
    """The cursor of ``...; COMMIT; SELECT feed_notify()``: the wake-up sent after a
    COMMIT may fail (a lock timeout waiting for the server's NOTIFY lock, a full
    notification queue) without making the committed write an error: its error is
    dropped and the results before it stand (watchers look again within RECHECK
    seconds). An error before the COMMIT skips it, so a COMMIT result means committed.
    (Overrides psycopg's private check of a query's results.)"""

    def _check_results(self, results: list[Any]) -> None:
        if (len(results) >= 2 and results[-1].status == psycopg.pq.ExecStatus.FATAL_ERROR
                and results[-2].command_status == b"COMMIT"):
            del results[-1]
        super()._check_results(results)


class _NotInline(Exception):
    """A parameter this module does not write as a literal: sent the ordinary way."""


def _split(query: str) -> list[str | tuple[str | int]]:
    parts = _SPLIT.get(query)
    if parts is None:
        parts, pos, n = [], 0, 0
        for m in _PLACEHOLDER.finditer(query):
            parts.append(query[pos:m.start()])
            if m.group(0) == "%%":
                parts.append("%")
            else:
                parts.append((m.group(1) if m.group(1) else n,))
                n += 1
            pos = m.end()
        parts.append(query[pos:])
        if len(_SPLIT) < 1000:
            _SPLIT[query] = parts
    return parts


def _literal(v: Any) -> str:
    if v is None:
        return "NULL"
    t = type(v)
    if t is str:
        if "\x00" in v:
            raise _NotInline
        return "'" + v.replace("'", "''") + "'"
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return str(v)
    if t is float:
        if v != v:
            return "'NaN'::float8"
        return _FLOATS.get(v) or f"'{v!r}'::float8"
    if t is bytes or t is bytearray or t is memoryview:
        return "'\\x" + bytes(v).hex() + "'::bytea"
    if t is list:
        if not v:
            return "'{}'"
        if all(type(x) is str for x in v):
            return "ARRAY[" + ",".join(map(_literal, v)) + "]::text[]"
        if all(type(x) is int for x in v):
            return "ARRAY[" + ",".join(map(str, v)) + "]::int8[]"
    raise _NotInline


def inline(query: Any, params: Any) -> str | None:
    """The statement with its parameters written in as literals (standard_conforming_strings
    is on), or None for a parameter it does not know (then it is sent the ordinary way)."""
    if type(query) is not str:
        return None
    if params is None:
        return query
    try:
        out = []
        for part in _split(query):
            if type(part) is str:
                out.append(part)
            else:
                out.append(_literal(params[part[0]]))
        return "".join(out)
    except (_NotInline, KeyError, IndexError, TypeError):
        return None


class Conn:
    """A checked-out connection: ``execute`` and, for several statements, ``begin``.

    Modes: AUTO (a write not yet begun: each statement is its own transaction,
    retried when it lost a deadlock), TXN (a write transaction), READ (a read,
    or a snapshot). Statements that open something (BEGIN, SAVEPOINT) or close
    a savepoint wait in ``pending`` until a statement needs them, and then go
    out together in one simple query: a savepoint that saw no statement costs
    nothing, and a RELEASE rides with the next SAVEPOINT (or COMMIT drops it).
    (psycopg's pipeline mode would send them with the statement itself, but
    costs more client time than a round trip to a local server.)
    """

    __slots__ = ("raw", "mode", "ran", "pending", "open", "flushes")

    def __init__(self, raw: psycopg.Connection, mode: str, pending: tuple[str, ...] = ()) -> None:
        self.raw = raw
        self.mode = mode
        self.ran = False  # AUTO: a statement has run (and committed on its own)
        self.pending = list(pending)
        self.open = False  # a BEGIN has been sent
        self.flushes = 0

    def execute(self, query: Any, params: Any = None) -> psycopg.Cursor:
        if self.pending:
            return self._with_pending(query, params)
        if self.mode is not AUTO:
            return self.raw.execute(query, params)
        self.ran = True
        text = inline(query, params)
        if text is not None:
            text = f"BEGIN; {text}; COMMIT; {AFTER_COMMIT}"
        for attempt in range(RETRIES):
            try:
                return self._lone(query, params, text)
            except _RETRY:
                if attempt == RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def _lone(self, query: Any, params: Any, text: str | None) -> psycopg.Cursor:
        """One statement in a transaction of its own, then the wake-up (feed_notify)."""
        raw = self.raw
        if text is None:  # two round trips: a parameter not written as a literal
            cur = raw.execute(query, params)
            try:
                raw.execute(AFTER_COMMIT)
            except psycopg.Error:
                pass  # committed: the watchers look again within RECHECK seconds
            return cur
        try:
            cur = raw.execute(text, prepare=False)
        except UnicodeEncodeError:  # not UTF-8 (lone surrogates): let psycopg say so
            return self._lone(query, params, None)
        except psycopg.Error as e:
            status = raw.info.transaction_status
            if status == psycopg.pq.TransactionStatus.INERROR:  # refused before its COMMIT
                _quiet_rollback(raw)
            elif status == psycopg.pq.TransactionStatus.IDLE:
                # Refused at or after its COMMIT: whether it committed is not known here.
                e.agentstate_outcome_unknown = True  # type: ignore[attr-defined]
            raise
        cur.nextset()  # past BEGIN: the statement's rows
        return cur

    def _with_pending(self, query: Any, params: Any) -> psycopg.Cursor:
        pending, self.pending = self.pending, []
        self.flushes += 1
        for p in pending:  # open: a BEGIN without its COMMIT
            if p.startswith("BEGIN"):
                self.open = True
            elif p == "COMMIT":
                self.open = False
        self.raw.execute("; ".join(pending))
        return self.raw.execute(query, params)

    def begin(self) -> None:
        """Make the statements from here on one transaction (a no-op if they are)."""
        if self.mode is AUTO:
            if self.ran:
                raise AssertionError("begin() after a statement already committed on its own")
            self.pending[:0] = BEGIN_WRITE
            self.mode = TXN


# -- the store ------------------------------------------------------------------

# Every connection is opened so: UTF-8 whatever PGCLIENTENCODING says (values are Unicode).
CONNECT = {"autocommit": True, "client_encoding": "UTF8"}

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
    encoding = c.execute("SHOW server_encoding").fetchone()[0]
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
        self._waiters: list[NotifyWaiter] = []
        self._conns: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()  # every one opened
        self._inherited: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()  # after fork()
        # The transaction the running code is inside of (see _connection.Store).
        self._txn: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
            "agentstate_pg_txn", default=None)
        with self._connect() as c:  # a clear error for a bad URL or an unreachable server
            _check_encoding(c, self.path)
            self.schema = ensure_schema(c, self.path)
            self.channel = c.execute("SELECT feed_channel()").fetchone()[0]
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
            raise StorageError(f"cannot connect to {self.path}: {_first_line(e)}") from None
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
        while True:
            try:
                raw = self.pool.getconn()
            except PoolClosed:
                raise Closed(f"the database {self.path} is closed") from None
            except PoolTimeout:
                stats = self.pool.get_stats()
                if stats.get("pool_size", 0) < POOL_MAX:
                    raise StorageError(f"cannot reach the server of {self.path} (no connection "
                                       f"within {self.busy_timeout:g} s)") from None
                raise Busy(f"all {POOL_MAX} connections to {self.path} stayed in use for "
                           f"{self.busy_timeout:g} s") from None
            if not _readable(raw):
                return raw
            # An idle connection has nothing to read unless the server hung up
            # on it (a restart): drop it and take another, before using it.
            raw.close()
            self.pool.putconn(raw)

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
            local.depth, local.conn, local.owner = 0, None, None
        return local

    def check_owner(self) -> None:
        """Refuse a call from code that is not inside this thread's open transaction."""
        check_owner(self._txn, self._thread())

    # -- transactions ---------------------------------------------------------

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
        """Several reads that must see the same state: a repeatable-read transaction."""
        self.check_open()
        if self._thread().depth:
            with self.read() as c:
                yield c
            return
        raw = self._checkout()
        try:
            c = Conn(raw, READ, BEGIN_SNAPSHOT)  # BEGIN goes out before the first read
            yield c
            if c.open:
                raw.execute("COMMIT")
        except psycopg.Error as e:
            _quiet_rollback(raw)
            raise translate(e) from None
        except BaseException:
            _quiet_rollback(raw)
            raise
        finally:
            self._checkin(raw)

    def in_write(self) -> bool:
        return bool(getattr(self._local, "depth", 0))

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


def _readable(raw: psycopg.Connection) -> bool:
    try:
        return bool(select.select([raw.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


def _quiet_rollback(raw: psycopg.Connection) -> None:
    try:
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raw.execute("ROLLBACK")
    except psycopg.Error:
        pass


class _Write:
    """Store.write: the transaction rules of ``_connection._Write``, on a server.

    Outermost: a connection from the pool in AUTO mode; if the operation
    begins a transaction (several statements, or a nested write), its
    changes are moved to the feed and it COMMITs on success, or ROLLBACKs on
    any exception. A COMMIT (or a lone statement) cut off by a lost
    connection raises ``StorageError`` with ``outcome_unknown``.
    Nested: a SAVEPOINT (sent before its first statement; none if it sends
    none), released on success, rolled back to on an exception.
    """

    __slots__ = ("store", "c", "depth", "token", "reset")  # token: the txn's, or (nested) c.flushes

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> Conn:
        store = self.store
        local = store._thread()
        depth = self.depth = local.depth
        store.check_owner()
        if depth == 0:
            self.c = local.conn = Conn(store._checkout(), AUTO)
            self.token = local.owner = [True]
            self.reset = store._txn.set(self.token)
        else:
            c = self.c = local.conn
            c.begin()
            c.pending.append(SAVEPOINT)  # sent before the first statement inside, if any
            self.token = c.flushes
        local.depth = depth + 1
        return self.c

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        store, c, depth = self.store, self.c, self.depth
        local = store._local
        local.depth = depth
        if depth:
            self._end_savepoint(exc)
            return
        self.token[0] = False
        local.owner = local.conn = None
        try:
            store._txn.reset(self.reset)
        except ValueError:  # left in another context than it was entered in
            store._txn.set(None)
        try:
            if c.mode is TXN:
                self._end_transaction(exc)
            elif isinstance(exc, psycopg.Error):
                raise translate(exc, outcome_unknown=lost_connection(exc) or getattr(
                    exc, "agentstate_outcome_unknown", False)) from None
        finally:
            store._checkin(c.raw)

    def _end_savepoint(self, exc: BaseException | None) -> None:
        c = self.c
        if c.flushes == self.token:  # nothing was sent inside: the savepoint never existed
            c.pending.pop()
        elif exc is None:
            c.pending.append(RELEASE)  # goes out with the next statement (or COMMIT drops it)
        else:  # pending holds only the RELEASEs of savepoints inside this one
            undo, c.pending = [*c.pending, "ROLLBACK TO SAVEPOINT w", RELEASE], []
            try:
                c.raw.execute("; ".join(undo))
            except psycopg.Error:
                pass  # the connection is gone: the outermost end says so
        if isinstance(exc, psycopg.Error):
            raise translate(exc) from None

    def _end_transaction(self, exc: BaseException | None) -> None:
        c, raw = self.c, self.c.raw
        c.pending = []  # unsent BEGIN (nothing happened) or RELEASEs (COMMIT releases them)
        if not c.open:
            if isinstance(exc, psycopg.Error):
                raise translate(exc) from None
            return
        if exc is not None:
            _quiet_rollback(raw)
            if isinstance(exc, psycopg.Error):
                raise translate(exc) from None
            return
        try:  # the changes to the feed, COMMIT, and the wake-up after it: one round trip
            raw.execute(f"SELECT feed_flush(); COMMIT; {AFTER_COMMIT}")
        except psycopg.Error as e:
            # The COMMIT may have happened; a refusal before it (still in the block) did not.
            unknown = lost_connection(e) or (
                raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
            _quiet_rollback(raw)
            raise translate(e, outcome_unknown=unknown) from None


class _Read:
    """Store.read: the thread's transaction if it is in one, else a pooled connection."""

    __slots__ = ("store", "own")

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> Conn:
        store = self.store
        local = store._thread()
        if local.depth:
            store.check_owner()
            self.own = None
            c = local.conn
            c.begin()  # a read inside a write: what follows depends on it
            return c
        self.own = Conn(store._checkout(), READ)
        return self.own

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self.own is not None:
            self.store._checkin(self.own.raw)
        if isinstance(exc, psycopg.Error):
            raise translate(exc) from None


# -- the schema -------------------------------------------------------------------


def ensure_schema(c: psycopg.Connection, where: str) -> str:
    """Create or migrate the store in the connection's current schema; its name.

    In one transaction under an advisory lock on the schema's name, so two
    clients opening a fresh store at once create it once.

    :raises SchemaTooNew: the store was written by a newer agentstate.
    :raises Damaged: the schema holds tables of the same names that are not a store.
    :raises StorageError: the search_path names no existing schema.
    """
    try:
        schema = c.execute("SELECT current_schema()").fetchone()[0]
        if schema is None:
            raise StorageError(
                f"{where}: the search_path names no existing schema: create it (CREATE SCHEMA) "
                "or name another one in options=-csearch_path%3D...")
        version = _version(c, schema)
        if version == SCHEMA_VERSION:
            return schema
        _refuse_newer(version, schema, where)
        c.execute("BEGIN")
        try:
            c.execute("SELECT pg_advisory_xact_lock(hashtext('agentstate:' || current_schema()))")
            version = _version(c, schema)  # another client may have set it up meanwhile
            _refuse_newer(version, schema, where)
            if version == 0:
                clash = c.execute("SELECT string_agg(tablename, ', ') FROM pg_tables "
                                  "WHERE schemaname = current_schema() AND tablename = ANY(%s)",
                                  (list(OUR_TABLES),)).fetchone()[0]
                if clash:
                    raise Damaged(f"{where}: schema {schema!r} has tables named {clash} but is not "
                                  "an agentstate store: use another schema")
                c.execute(SCHEMA)
                version = SCHEMA_VERSION
            while version < SCHEMA_VERSION:
                MIGRATIONS[version](c)
                version += 1
                c.execute("UPDATE agentstate_version SET version = %s", (version,))
            c.execute("COMMIT")
        except BaseException:
            _quiet_rollback(c)
            raise
    except psycopg.Error as e:
        raise translate(e) from None
    return schema


def _version(c: psycopg.Connection, schema: str) -> int:
    # A query of the catalog, not to_regclass(): its cache may still say "no such table"
    # after another client created it while this one waited for the lock.
    exists = c.execute("SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema() "
                       "AND tablename = 'agentstate_version')").fetchone()[0]
    if not exists:
        return 0
    row = c.execute(psycopg.sql.SQL("SELECT version FROM {}.agentstate_version").format(
        psycopg.sql.Identifier(schema))).fetchone()
    return 0 if row is None else row[0]


def _refuse_newer(version: int, schema: str, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise SchemaTooNew(f"{where}: schema {schema!r} has agentstate schema version {version}; "
                           f"this agentstate knows up to {SCHEMA_VERSION}: upgrade agentstate")


# -- waiting for commits -----------------------------------------------------------


class NotifyWaiter:
    """Waits for a commit by any client of the store: LISTEN on its channel.

    A notification is only a wake-up (the table is the feed): ``mark`` counts
    the ones received so far, ``wait`` returns once one more arrives. A
    connection of its own; a lost one is opened again, and the wake-up it
    may have missed is assumed (the caller looks again). A writer sends its
    NOTIFY right after its COMMIT, in a transaction of its own; one that dies
    in between sends none, so ``wait`` also returns after RECHECK seconds
    without one: a watcher looks again at least that often, and a change
    whose wake-up was lost is seen within RECHECK seconds. Idle in the
    store's pool it is parked (UNLISTEN): the server keeps a notification
    until every listener has read it, in a queue shared by every database on
    the server, and nobody reads an idle waiter's.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.count = 0
        self.conn = self._listen()

    def _listen(self) -> psycopg.Connection:
        c = self.store._connect()
        try:
            c.execute(self._listen_sql())
        except psycopg.Error as e:
            c.close()
            raise translate(e) from None
        return c

    def _listen_sql(self) -> psycopg.sql.Composed:
        return psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self.store.channel))

    def park(self) -> bool:
        """Stop listening, to wait idle in the store's pool; False if the connection broke."""
        try:
            self.conn.execute("UNLISTEN *")
            pg = self.conn.pgconn
            pg.consume_input()  # what arrived before the UNLISTEN
            while pg.notifies() is not None:
                pass
            return pg.status == psycopg.pq.ConnStatus.OK
        except psycopg.Error:
            return False

    def resume(self) -> bool:
        """Listen again, out of the pool (a commit from here on wakes it); False if the
        connection broke meanwhile."""
        try:
            self.conn.execute(self._listen_sql())
        except psycopg.Error:
            self.conn.close()
            return False
        self.count += 1  # nothing was heard while parked: look again
        return True

    def _drain(self) -> None:
        """Count what has arrived, without blocking; reconnect if the connection broke."""
        pg = self.conn.pgconn
        try:
            pg.consume_input()
            while pg.notifies() is not None:
                self.count += 1
            if pg.status != psycopg.pq.ConnStatus.OK:
                raise psycopg.OperationalError("the connection is broken")
        except psycopg.Error:
            self.conn.close()
            self.conn = self._listen()
            self.count += 1  # something may have been missed meanwhile: look again

    def mark(self) -> int:
        self._drain()
        return self.count

    def wait(self, mark: int, deadline: float | None) -> bool:
        """Until a notification after ``mark`` or RECHECK seconds (True: look again), or the
        monotonic ``deadline`` (False)."""
        recheck = time.monotonic() + RECHECK
        while True:
            self._drain()
            if self.count > mark:
                return True
            now = time.monotonic()
            if deadline is not None and deadline <= now:
                return False
            if recheck <= now:
                return True
            select.select([self.conn.fileno()], [], [],
                          min(recheck, deadline if deadline is not None else recheck) - now)

    async def await_change(self, mark: int) -> None:
        """The same, on the event loop: it sleeps until the socket has something to read
        (or RECHECK seconds pass)."""
        import asyncio

        loop = asyncio.get_running_loop()
        recheck = loop.time() + RECHECK
        while True:
            self._drain()
            left = recheck - loop.time()
            if self.count > mark or left <= 0:
                return
            ready = loop.create_future()
            fd = self.conn.fileno()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            timer = loop.call_later(left, lambda: ready.done() or ready.set_result(None))
            try:
                await ready
            finally:
                timer.cancel()
                loop.remove_reader(fd)

    def close(self) -> None:
        self.conn.close()
