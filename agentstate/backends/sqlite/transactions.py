"""A write transaction and a read, on one thread's connection: the rules every write follows.

``BEGIN IMMEDIATE`` so a writer takes the write lock up front (a deferred
transaction that upgrades later can fail with SQLITE_BUSY regardless of the
timeout), ROLLBACK on any exception, COMMIT only on success, and SAVEPOINTs
when nested inside ``db.transaction()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import apsw

from ...errors import UsageError
from .errors import outcome_unknown, translate

if TYPE_CHECKING:
    from .store import Store


def roll_back(c: apsw.Connection) -> None:
    """Roll back the transaction this connection is in, if any (an interrupted write's)."""
    try:
        if c.in_transaction:
            c.execute("ROLLBACK")
    except apsw.Error:  # closed meanwhile, or SQLite rolled back already
        pass


class Write:
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
            raise UsageError("a write inside db.snapshot(): the block only reads (one "
                             "consistent state); write after it, or use transaction()")
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
                roll_back(c)
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
                if store._writes % store.housekeep_every == 0:
                    try:
                        store.housekeeping(c)
                    except BaseException as e:
                        self._end(c, depth, e)  # rolls back (and translates a driver error)
                        raise
            self._end(c, depth, exc)
        finally:
            if not depth:
                store._releases.ended()
                if store._closed:
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
            if not depth and outcome_unknown(e):
                # The commit's WAL frames may be written before the fsync that
                # failed; recovery can replay them. Say so instead of "nothing".
                err.outcome_unknown = True  # type: ignore[attr-defined]
            raise err from None


class Read:
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
