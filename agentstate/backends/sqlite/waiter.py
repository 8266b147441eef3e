"""Waiting for a commit by another connection, in any process: the change feed's wake-up."""

from __future__ import annotations

import time

import apsw

from .errors import translate

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
