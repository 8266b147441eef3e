"""Waiting for a commit by any client of the store: LISTEN on its channel."""

from __future__ import annotations

import select
import time
from typing import TYPE_CHECKING

import psycopg

from .errors import translate
from .statements import first

if TYPE_CHECKING:
    from .store import Store

RECHECK = 1.0  # seconds a watcher waits for a NOTIFY before it looks again anyway
LEASE = 10  # seconds a watcher's registration lasts (feed_watch in schema_postgres.sql)
RENEW = 3.0  # seconds between its renewals while it is in use
POLL = 0.025  # seconds between looks at the writers that may have missed a registration
GRACE = 5.0  # seconds it looks at them at most (a write's commit follows its statement)


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

    Writers send a NOTIFY only while someone has said it listens (the lease
    of ``feed_watch``, which a waiter renews every RENEW seconds while in use).
    A write that read the lease (after taking its transaction id) before a
    registration may commit after the watcher's first look, and send nothing:
    such a write was running when the registration was done, so its
    transaction is in the snapshot taken right after it; the waiter looks at
    those transactions every POLL seconds, and looks again once they are all
    over (for GRACE seconds at most). A client that may not register (a
    standby) is woken by its look-again every RECHECK seconds only.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.count = 0
        self.renewed = -float(LEASE)  # time.monotonic() of the last registration
        self.suspects: list[str] = []  # transactions that may have missed the registration
        self.suspects_until = 0.0
        self.conn = self._listen()

    def _listen(self) -> psycopg.Connection:
        c = self.store._connect()
        try:
            c.execute(self._listen_sql())
        except psycopg.Error as e:
            c.close()
            raise translate(e) from None
        self._register(c)
        return c

    def _register(self, c: psycopg.Connection) -> None:
        """Say (again) that this waiter listens; after a lapse, note the transactions
        running right after it (see the class docstring)."""
        now = time.monotonic()
        lapsed = now - self.renewed > LEASE - 2 * RENEW
        try:
            c.execute("BEGIN READ WRITE; SELECT feed_watch(%s); COMMIT" % LEASE)
            self.renewed = now
            if lapsed:
                running = first(c.execute("SELECT coalesce(array_agg(x::text), '{}') "
                                          "FROM pg_snapshot_xip(pg_current_snapshot()) x"))
                self.suspects, self.suspects_until = running, now + GRACE
        except psycopg.Error:
            try:
                if c.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    c.execute("ROLLBACK")
            except psycopg.Error:
                pass

    def _renew(self) -> None:
        if time.monotonic() - self.renewed >= RENEW:
            self._register(self.conn)

    def _suspects_over(self) -> bool:
        """Whether the transactions that may have missed the registration have all ended
        (or GRACE passed): then the caller looks again, once."""
        if time.monotonic() > self.suspects_until:
            self.suspects = []
            return True
        try:
            self.suspects = first(self.conn.execute(
                "SELECT coalesce(array_agg(x), '{}') FROM unnest(%s::text[]) x "
                "WHERE pg_xact_status(x::xid8) = 'in progress'", (self.suspects,)))
        except psycopg.Error:
            self.suspects = []
        return not self.suspects

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
        self._renew()
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
        """The notifications counted so far; the registration renewed first, so that a
        write after the look that follows wakes this waiter."""
        self._drain()
        self._renew()
        return self.count

    def wait(self, mark: int, deadline: float | None) -> bool:
        """Until a notification after ``mark`` or RECHECK seconds (True: look again), or the
        monotonic ``deadline`` (False)."""
        recheck = time.monotonic() + RECHECK
        while True:
            self._drain()
            if self.count > mark:
                return True
            if self.suspects and self._suspects_over():
                return True
            self._renew()
            now = time.monotonic()
            if deadline is not None and deadline <= now:
                return False
            if recheck <= now:
                return True
            until = min(recheck, deadline if deadline is not None else recheck)
            if self.suspects:
                until = min(until, now + POLL)
            select.select([self.conn.fileno()], [], [], max(0.0, until - now))

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
            # (queries: in a worker thread, the loop's thread never waits for the server)
            if self.suspects:
                if await asyncio.to_thread(self._suspects_over):
                    return
            if time.monotonic() - self.renewed >= RENEW:
                await asyncio.to_thread(self._renew)
            if self.suspects:
                left = min(left, POLL)
            ready = loop.create_future()
            fd = self.conn.fileno()

            def wake(ready: asyncio.Future[None] = ready) -> None:
                if not ready.done():
                    ready.set_result(None)

            loop.add_reader(fd, wake)
            timer = loop.call_later(left, wake)
            try:
                await ready
            finally:
                timer.cancel()
                loop.remove_reader(fd)

    def close(self) -> None:
        self.conn.close()
