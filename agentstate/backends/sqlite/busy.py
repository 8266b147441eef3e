"""The busy handler: how a connection waits for the write lock."""

from __future__ import annotations

import os
import random
import threading
import time

import apsw


class Releases:
    """This process's write transactions on one file, as its lock waiters see them: a
    waiter sleeps on ``wait`` instead of ``time.sleep``, and the end of any of this
    process's transactions on the file (``ended``) wakes it to try the lock at once.
    A holder in another process ends unseen: the waiter sleeps its time, as before.
    (Two write transactions of one process, say LangGraph's checkpoint put on a
    background thread and a node's store put, met in the busy handler's sleeps:
    ~8 sleeps and ~9 ms a graph turn; benchmarks/ADAPTER-LANGGRAPH.md.)"""

    __slots__ = ("cond", "waiting")

    def __init__(self) -> None:
        self.cond = threading.Condition(threading.Lock())
        self.waiting = 0

    def wait(self, seconds: float) -> None:
        with self.cond:
            self.waiting += 1
            try:
                self.cond.wait(seconds)
            finally:
                self.waiting -= 1

    def ended(self) -> None:
        # Read without the lock: a waiter that registers just after sleeps its time.
        if self.waiting:
            with self.cond:
                self.cond.notify_all()


_releases: dict[str, Releases] = {}
_releases_lock = threading.Lock()


def releases(path: str) -> Releases:
    """The file's ``Releases`` in this process (one per path, shared by its stores)."""
    with _releases_lock:
        found = _releases.get(path)
        if found is None:
            found = _releases[path] = Releases()
        return found


def _forget_in_child() -> None:  # a forked child starts with no waiter and free locks
    global _releases_lock
    _releases_lock = threading.Lock()
    _releases.clear()


os.register_at_fork(after_in_child=_forget_in_child)


class Patience:
    """The busy handler: try the lock again until ``ms`` after the first try, sleeping a
    random 0.5-1x of min(5 ms, 0.5 ms x 2^tries) in between, or less: the end of a
    transaction of this process on the file wakes it (``Releases``). SQLite's own handler sleeps
    100 ms a try once a wait is long, so a long waiter tries ten times a second while
    newcomers try every millisecond: among 8 processes writing flat out one could lose
    every try until its busy_timeout (benchmarks/BUSY.md: 16 Busy in 6 s at busy_timeout
    1 s, the slowest process 986 writes; with this none, 1,640; writes/s 0.86-0.98x)."""

    __slots__ = ("ms", "t0", "releases")
    FIRST, LONGEST = 0.0005, 0.005  # seconds: the first pause, and the longest

    def __init__(self, ms: int, releases: Releases | None = None) -> None:
        self.ms, self.t0, self.releases = ms, 0.0, releases

    def __call__(self, tries: int) -> bool:
        now = time.monotonic()
        if tries == 0:  # SQLite counts the tries of each lock wait from 0
            self.t0 = now
        left = self.t0 + self.ms / 1000 - now
        if left <= 0:
            return False
        pause = min(left, (0.5 + random.random() / 2) * min(self.LONGEST, self.FIRST * 2 ** min(tries, 4)))
        if self.releases is None:
            time.sleep(pause)
        else:
            self.releases.wait(pause)
        return True


def wait_up_to(c: apsw.Connection, ms: int, releases: Releases | None = None) -> None:
    c.set_busy_handler(Patience(ms, releases))
