"""The busy handler: how a connection waits for the write lock."""

from __future__ import annotations

import random
import time

import apsw


class Patience:
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


def wait_up_to(c: apsw.Connection, ms: int) -> None:
    c.set_busy_handler(Patience(ms))
