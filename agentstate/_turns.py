"""Turns: updates of one key in one process go one at a time, so none retries for a sibling.

update() and aupdate() are a read, a function, and a compare-and-set: two of them
on one key at once both read version n, one wins and the other runs its function
again. Correctness never rests on a turn (clients in other processes still race
and the compare-and-set decides); turns only spare the retries. Bounded both
ways: a lock exists only while its key is in use, so memory stays flat (and an
event loop is never kept alive by one), and a turn not had within TURN_WAIT is
gone without, so a function that waits for another update of its key, or two
updates nested in opposite orders, cost that wait instead of hanging. A thread
or task holds one turn at most: an update inside an update's function (or in a
task it starts, while the turn lasts) goes without.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

TURN_WAIT = 1.0  # seconds an update waits for its key's turn before going without

Key = tuple[str, str, str]


class _Held:
    """The turn the current thread or task is in. A task started inside it inherits it
    (contexts are copied) and goes without only while it lasts."""

    __slots__ = ("over",)

    def __init__(self) -> None:
        self.over = False


_held: contextvars.ContextVar[_Held | None] = contextvars.ContextVar("agentstate_turn", default=None)


def _in_turn() -> bool:
    held = _held.get()
    return held is not None and not held.over


@contextlib.contextmanager
def _holding(release: Any) -> Iterator[None]:
    """Marks the context as in a turn; on the way out frees the lock first, so a reset
    that fails (a context left from another one) cannot keep it."""
    held = _Held()
    token = _held.set(held)
    try:
        yield
    finally:
        held.over = True
        release()
        with contextlib.suppress(ValueError):
            _held.reset(token)


def _nothing() -> None:
    pass


class Turns:
    """update()'s turns among the threads of one remote client (a local store's update()
    retries under the write lock instead). Without them, 8 threads x 100 update()s of
    one key through one client lost 3,399 compare-and-sets (19 s; 3.8 s with turns)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._keys: dict[Key, list[Any]] = {}  # key in use -> [its lock, threads using it]

    @contextlib.contextmanager
    def turn(self, key: Key) -> Iterator[None]:
        if _in_turn():
            yield
            return
        with self._mutex:
            entry = self._keys.get(key)
            if entry is None:
                entry = self._keys[key] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            lock = entry[0]
            with _holding(lock.release if lock.acquire(timeout=TURN_WAIT) else _nothing):
                yield
        finally:
            with self._mutex:
                entry[1] -= 1
                if not entry[1]:
                    del self._keys[key]


_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Key, list[Any]]] = (
    weakref.WeakKeyDictionary())
_made = threading.Lock()  # loops run in different threads; each loop's own dict is its thread's


def _freer(lock: asyncio.Lock, loop: asyncio.AbstractEventLoop) -> Any:
    def free() -> None:
        if not loop.is_closed():  # a task the GC closes after its loop: nobody to wake
            lock.release()
    return free


@contextlib.asynccontextmanager
async def aturn(key: Key) -> AsyncIterator[None]:
    """aupdate()'s turn among the tasks of the running event loop. Without it, 8 tasks
    x 25 aupdate()s of one key ran the function 1,267 times for 200 updates (local
    file, one loop): each task's compare-and-set lost to its siblings and retried."""
    if _in_turn():
        yield
        return
    loop = asyncio.get_running_loop()
    keys = _loops.get(loop)
    if keys is None:
        with _made:
            # A loop closed while a task waited here is referred to by that waiter's
            # lock, so its weak key would never go: drop the dicts of closed loops.
            for closed in [other for other in _loops if other.is_closed()]:
                _loops.pop(closed, None)
            keys = _loops.setdefault(loop, {})
    entry = keys.get(key)
    if entry is None:
        entry = keys[key] = [asyncio.Lock(), 0]
    entry[1] += 1
    try:
        lock = entry[0]
        if entry[1] == 1:  # no other task holds or waits for this key: granted at once
            await lock.acquire()
            release = _freer(lock, loop)
        else:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # lands as the lock is granted. (A free lock may still have a waiter woken
            # ahead of us: only the count above says none.)
            task = asyncio.current_task()
            cancels = task.cancelling() if task is not None else 0
            bound = asyncio.timeout(TURN_WAIT)
            try:
                async with bound:
                    await lock.acquire()
                release = _freer(lock, loop)
            except (TimeoutError, asyncio.CancelledError):
                # Python 3.11.0-3.11.2 raise the bound's own cancel as CancelledError in
                # a task being cancelled already (cleanup in an except clause): only a
                # cancel beyond the bound's is the caller's.
                if not bound.expired() or (task is not None and task.cancelling() > cancels):
                    raise
                release = _nothing
        with _holding(release):
            yield
    finally:
        entry[1] -= 1
        if not entry[1]:
            del keys[key]
