"""A writer waiting for the write lock held by another thread of its process tries again
when that transaction ends, not after its busy handler's sleep (issue 31)."""

from __future__ import annotations

import os
import signal
import threading
import time

import agentstate
from agentstate.backends.sqlite import busy

WAIT = 60


def _until(cond, what: str) -> None:
    end = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.005)


def test_a_waiter_goes_on_when_its_process_s_transaction_ends(tmp_path, monkeypatch):
    # Pauses of 5-10 s between tries: a waiter that only slept would go on seconds
    # after the holder's COMMIT; one woken by it goes on at once.
    monkeypatch.setattr(busy.Patience, "FIRST", 10.0)
    monkeypatch.setattr(busy.Patience, "LONGEST", 10.0)
    db = agentstate.open(str(tmp_path / "a.db"), busy_timeout=WAIT)
    s = db.scope("app", "a")
    holding, release = threading.Event(), threading.Event()
    done: dict[str, float] = {}

    def holder():
        with db.transaction():
            s.put("a", 1)
            holding.set()
            assert release.wait(WAIT)
        done["released"] = time.monotonic()

    def waiter():
        with db.transaction():  # a block, as LangGraph's checkpoint put
            s.put("b", 2)
        s.put("c", 3)  # and a lone write after it
        done["waiter"] = time.monotonic()

    h = threading.Thread(target=holder)
    h.start()
    assert holding.wait(WAIT)
    w = threading.Thread(target=waiter)
    w.start()
    _until(lambda: db._store._releases.waiting >= 1, "the waiter waits for the lock")
    release.set()
    h.join(WAIT)
    w.join(WAIT)
    assert not w.is_alive()
    assert done["waiter"] - done["released"] < 4.0  # a sleeping waiter needs 5 s or more
    assert (s.get("a"), s.get("b"), s.get("c")) == (1, 2, 3)
    db.close()


def test_each_process_s_files_have_their_own_waiters(tmp_path):
    a = busy.releases(str(tmp_path / "a.db"))
    assert busy.releases(str(tmp_path / "a.db")) is a
    assert busy.releases(str(tmp_path / "b.db")) is not a


def test_a_forked_child_waits_on_its_own_releases(tmp_path):
    """A child forked while a parent thread held the waiters' lock gets its own (found by
    review: the inherited store kept the parent's, and its first write hung in it)."""
    db = agentstate.open(str(tmp_path / "a.db"), busy_timeout=WAIT)
    db.scope("app", "a").put("parent", 1)
    inherited = db._store._releases
    inherited.cond.acquire()  # as a parent thread inside ended() or wait() at the fork
    try:
        pid = os.fork()
        if pid == 0:  # the child: report by exit code only
            code = 4
            try:
                own = db._store._releases
                fresh = own is busy.releases(db._store.path) and own is not inherited
                db.scope("app", "a").put("child", 1)  # hung in ended() on the copied lock
                code = 0 if fresh else 3
            finally:
                os._exit(code)
    finally:
        inherited.cond.release()
    end = time.monotonic() + WAIT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the child's write never finished")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db.scope("app", "a").get("child") == 1
    db.close()
