"""A write (a lone statement, a transaction, a savepoint) and a read, on a pooled connection:
the transaction rules of ``backends/sqlite/transactions.py``, on a server."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg

from ...errors import UsageError
from .errors import lost_connection, translate
from .statements import AFTER_COMMIT, AUTO, CLOSE, READ, RELEASE, SAVEPOINT, TXN, Conn, quiet_rollback

if TYPE_CHECKING:
    from .store import Store


class _Write:
    """Store.write: the transaction rules of ``_connection._Write``, on a server.

    Outermost: a connection from the pool in AUTO mode; if the operation
    begins a transaction (several statements, or a nested write), its
    changes get their ticket and it COMMITs on success, or ROLLBACKs on
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
        if local.snap is not None:
            raise UsageError("a write inside db.snapshot(): the block only reads (one "
                             "consistent state); write after it, or use transaction()")
        if depth == 0:
            self.c = local.conn = Conn(store._checkout(), AUTO, tidy=store.tidy_turn())
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
            quiet_rollback(raw)
            if isinstance(exc, psycopg.Error):
                raise translate(exc) from None
            return
        try:  # the changes' ticket, COMMIT, and the wake-up after it: one round trip
            raw.execute(f"{CLOSE}; COMMIT; {AFTER_COMMIT[c.tidy]}")
        except psycopg.Error as e:
            # The COMMIT may have happened; a refusal before it (still in the block) did not.
            unknown = lost_connection(e) or (
                raw.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)
            quiet_rollback(raw)
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
        if local.snap is not None:  # inside snapshot(): its transaction
            self.own = None
            return local.snap
        self.own = Conn(store._checkout(), READ)
        return self.own

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if self.own is not None:
            self.store._checkin(self.own.raw)
        if isinstance(exc, psycopg.Error):
            raise translate(exc) from None
