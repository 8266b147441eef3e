"""Group commit: the writes of a process's threads share one transaction and one fsync.

A write outside ``db.transaction()`` that finds no commit under way is a
plain write transaction. One that finds a commit under way queues; when that
commit ends, the first queued thread leads: it runs every queued write in one
transaction, each in its own SAVEPOINT (a refused write rolls back alone),
with one COMMIT — one fsync at durability full — for them all, while the next
arrivals queue for the group after. A caller returns only after the COMMIT
that covers its write. Each write has a deadline (busy_timeout after it
arrived); a leader waits for the lock no longer than the group's earliest, so
a write that cannot get the lock fails with Busy at its own. The main
thread's writes never lead (Python runs signal handlers there, between any two
steps: an interrupted leader would strand the group): they queue as
followers, or write alone when no group is under way.
"""

from __future__ import annotations

import contextvars
import threading
import time
from _thread import allocate_lock as _lock  # a bare lock: a cheaper wake-up than an Event
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import apsw

from .busy import Releases, wait_up_to
from .errors import outcome_unknown, translate
from .transactions import Write, roll_back

if TYPE_CHECKING:
    from .store import Store


class GroupCommit:
    """The group-commit half of :class:`~agentstate.backends.sqlite.store.Store`."""

    # Set by the store: its connection per thread, its settings and housekeeping.
    _local: threading.local
    _glock: threading.Lock
    _queue: list[_Pending]
    _leading: bool
    _writes: int
    _txn: contextvars.ContextVar[list[bool] | None]
    _closed: bool
    _releases: Releases
    busy_ms: int
    group_commit: bool
    housekeep_every: int
    housekeeping: Callable[[apsw.Connection], Any] | None

    def conn(self) -> apsw.Connection:
        raise NotImplementedError

    def check_owner(self) -> None:
        raise NotImplementedError

    def drop_local(self) -> None:
        raise NotImplementedError

    def call_write(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(connection, *args)`` in a write transaction; returns its result once
        committed. Outside ``db.transaction()`` the write joins a group commit
        with other threads' (see the module docstring); inside, it is a savepoint
        of that transaction as with :meth:`write`.

        :raises: what ``fn`` raises (its write alone is rolled back); Busy,
            Closed, StorageError (the group's transaction failed: nothing of it
            is committed, or ``outcome_unknown`` if its COMMIT failed on I/O).
        """
        c = self.conn()
        local = self._local
        if local.depth or c.in_transaction or not self.group_commit:
            # in transaction() a savepoint (in a snapshot: refused there, as always)
            with Write(cast("Store", self)) as c:
                return fn(c, *args)
        self.check_owner()  # inside another thread's transaction(): refused, as with write()
        if local.solo:  # a finalizer run in the bookkeeping below
            return self._alone(c, fn, args)
        # Set while this thread is in the group's bookkeeping: a write that the garbage
        # collector's finalizer starts here (at an allocation under _glock) is a plain one
        # instead of taking _glock again on the same thread.
        local.solo = True
        try:
            with self._glock:
                alone = not self._leading
                if alone:
                    # The main thread takes no leadership: an interrupt there must never
                    # leave _leading set with nobody leading.
                    self._leading = not local.main
                else:
                    item = _Pending(fn, args, time.monotonic() + self.busy_ms / 1000)
                    item.follow = local.main
                    item.wake.acquire()  # released by the leader: done, promoted, or go alone
                    self._queue.append(item)
            if alone and local.main:
                return self._alone(c, fn, args)
            if alone:  # no commit under way: a plain write; what queues meanwhile is the next group
                try:
                    return self._alone(c, fn, args)
                finally:
                    with self._glock:
                        self._hand_off()
            # No timeout of its own: the queue is in arrival order and each leader waits
            # for the lock only until its own write's deadline, so a write that cannot
            # get the lock fails with Busy at its deadline (_begin). (A timed wait here
            # cost ~6% of 16 threads' writes.)
            try:
                item.wake.acquire()
            except BaseException:  # interrupted: leave the queue (a taken write may still commit)
                with self._glock:
                    if item in self._queue:
                        self._queue.remove(item)
                        if item.lead:
                            self._hand_off()
                raise
            if item.alone:  # the main thread's, with no group left to join: a plain write
                return self._alone(c, fn, args)
            if not item.done:  # promoted: lead the group this write is in
                self._lead(c, item)
        finally:
            local.solo = False
        if item.error is not None:
            raise item.error
        return item.result

    def _alone(self, c: apsw.Connection, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """One write in its own transaction: what ``with Write(self)`` does, minus what
        only a transaction() block needs (its owner token, the second owner check):
        ``fn`` is a repository function, so no other code runs on this thread before
        the COMMIT. Saves ~1 µs a write (benchmarks/PYTHON-COST.md)."""
        local = self._local
        try:
            try:
                c.execute("BEGIN IMMEDIATE")  # in the try: an interrupt just after it rolls back
                local.depth, local.owner = 1, self._txn.get()  # as in _commit_group
                result = fn(c, *args)
                if self.housekeeping is not None:
                    self._writes += 1
                    if self._writes % self.housekeep_every == 0:
                        self.housekeeping(c)
            except BaseException as e:
                local.depth, local.owner = 0, None
                Write._end(c, 0, e)  # rolls back; a driver error leaves translated
                raise
            try:
                local.depth, local.owner = 0, None
                Write._end(c, 0, None)  # COMMIT; outcome_unknown if it failed on I/O
            except BaseException:  # an interrupt just before the COMMIT: not left open
                roll_back(c)
                raise
            return result
        finally:
            self._releases.ended()
            if self._closed:
                self.drop_local()

    def _hand_off(self) -> None:
        """With _glock held: wake the first waiting write that may lead (not the main
        thread's) to lead the next group. If only the main thread's waits, it goes alone
        (a plain write) and nobody leads."""
        for item in self._queue:
            if not item.follow:
                item.lead = True
                item.wake.release()
                return
        for item in self._queue:
            item.alone = True
            item.wake.release()
        self._queue = []
        self._leading = False

    def _lead(self, c: apsw.Connection, mine: _Pending) -> None:
        with self._glock:
            group, self._queue = self._queue, []
        try:
            if self._begin(c, group, mine):
                self._commit_group(c, group)
        except BaseException as e:  # neither should raise: if one does, no write reads as done
            _fail([item for item in group if item.error is None], e, commit=True)
            raise
        finally:
            self._releases.ended()
            with self._glock:
                for item in group:
                    item.done = True
                self._hand_off()
            for item in group:
                if item is not mine:  # the others wait on their wake lock
                    item.wake.release()
            if self._closed:
                self.drop_local()

    def _commit_group(self, c: apsw.Connection, group: list[_Pending]) -> None:
        """One transaction for the group (begun); each write's outcome on its item."""
        local = self._local
        local.depth, local.owner = 1, self._txn.get()  # a nested write() becomes a savepoint
        try:
            if len(group) == 1:  # alone: no savepoint, as a plain write()
                item = group[0]
                item.result = item.fn(c, *item.args)
            else:
                for item in group:
                    c.execute("SAVEPOINT g")
                    try:
                        item.result = item.fn(c, *item.args)
                    except BaseException as e:
                        item.error = translate(e) if isinstance(e, apsw.Error) else e
                        c.execute("ROLLBACK TO g")  # fails if SQLite rolled back it all: below
                    c.execute("RELEASE g")
            ok = sum(item.error is None for item in group)
            before, self._writes = self._writes, self._writes + ok
            if (self.housekeeping is not None
                    and before // self.housekeep_every != self._writes // self.housekeep_every):
                self.housekeeping(c)
        except BaseException as e:
            local.depth = 0
            roll_back(c)  # SQLite may have rolled back already (e.g. on SQLITE_FULL)
            _fail([item for item in group if item.error is None], e)
            return
        local.depth = 0
        try:
            c.execute("COMMIT")
        except BaseException as e:
            roll_back(c)
            _fail([item for item in group if item.error is None], e, commit=True)

    def _begin(self, c: apsw.Connection, group: list[_Pending], mine: _Pending) -> bool:
        """BEGIN IMMEDIATE for the group, waiting for the lock no longer than the earliest
        deadline in it (its first: the queue is in arrival order). At each deadline that
        passes, the writes past theirs fail with Busy; when the leader's own does, the
        rest go back to the front of the queue for the next leader. ``group`` is left
        holding the writes the caller settles."""
        while True:
            wait = group[0].deadline - time.monotonic()
            short = wait * 1000 < self.busy_ms
            try:
                if short:
                    wait_up_to(c, max(0, int(wait * 1000)), self._releases)
                c.execute("BEGIN IMMEDIATE")
                return True
            except apsw.BusyError as e:
                now = time.monotonic()
                first = group[0]
                over = [item for item in group if item is first or item.deadline <= now]
                rest = [item for item in group if item is not first and item.deadline > now]
                _fail(over, e)
                if any(item is mine for item in over):
                    with self._glock:
                        self._queue[:0] = rest
                    group[:] = over
                    return False
                with self._glock:  # the others past their deadline: told at once
                    for item in over:
                        item.done = True
                for item in over:
                    item.wake.release()
                group[:] = rest
            except BaseException as e:  # closed meanwhile (db.close()), or a driver error
                roll_back(c)  # begun, then interrupted: not left open
                _fail(group, e)
                return False
            finally:
                if short:
                    try:
                        wait_up_to(c, self.busy_ms, self._releases)
                    except apsw.Error:  # closed meanwhile: the next call says Closed
                        pass


class _Pending:
    """One write waiting in a group commit: its function and, once done, its outcome."""

    __slots__ = ("fn", "args", "deadline", "result", "error", "done", "lead", "follow", "alone",
                 "wake")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], deadline: float) -> None:
        self.fn, self.args, self.deadline = fn, args, deadline  # deadline: time.monotonic()
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = self.lead = False
        self.follow = False  # the main thread's: never promoted to lead
        self.alone = False  # set with follow when no group is left: its thread writes alone
        self.wake = _lock()  # acquired by its thread; released by a leader: done, or promoted


def _fail(items: list[_Pending], e: BaseException, commit: bool = False) -> None:
    """The group's transaction failed: each write gets its own error (one instance per
    thread that raises it); a failed COMMIT on I/O may still have reached the disk."""
    for item in items:
        if not isinstance(e, apsw.Error):
            item.error = e
            continue
        err = item.error = translate(e)
        if commit and outcome_unknown(e):
            err.outcome_unknown = True  # type: ignore[attr-defined]
