"""Waiting for a commit by any client of the store: LISTEN on its channel."""

from __future__ import annotations

import select
import time
from typing import TYPE_CHECKING

import psycopg

from .errors import translate

if TYPE_CHECKING:
    from .store import Store

RECHECK = 1.0  # seconds a watcher waits for a NOTIFY before it looks again anyway


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
