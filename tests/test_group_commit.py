"""Group commit: concurrent threads' writes share one transaction and one COMMIT.

The grouping is forced, not hoped for: a first write holds the commit (its
function waits) until the others have queued, so they all meet in the next
group. Commits are counted with a commit hook on every connection.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import agentstate

from benchmarks import group_commit as bench


def store_of(db: agentstate.Database):
    return db._ops.store


def count_commits(db: agentstate.Database) -> list[int]:
    """A commit hook on every connection the store holds (open them first)."""
    n = [0]

    def hook() -> bool:
        n[0] += 1
        return False  # let it commit

    for c in store_of(db)._conns:
        c.set_commit_hook(hook)
    return n


def hold_commit(store) -> tuple[threading.Thread, threading.Event]:
    """A write that holds its group open until released: what arrives meanwhile queues."""
    release = threading.Event()

    def held() -> None:
        try:
            store.call_write(lambda c: release.wait(30))
        except agentstate.StorageError:
            pass  # a test may veto this commit too

    holder = threading.Thread(target=held, daemon=True)  # a test that fails may leave it stuck
    holder.start()
    deadline = time.monotonic() + 30
    while not store._leading:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    return holder, release


def wait_queued(store, n: int) -> None:
    """Until ``n`` writes wait in the queue for the next group."""
    deadline = time.monotonic() + 30
    while len(store._queue) < n:
        assert time.monotonic() < deadline, len(store._queue)
        time.sleep(0.001)


def test_queued_writes_of_many_threads_commit_once_each_outcome_their_own(db):
    """A conflicting CAS, a list append to a non-list and an append past 1 MiB fail alone;
    the other writes of the same group commit; the whole group is one COMMIT."""
    kv = db.scope("session", "g")
    kv.put("v", 1)  # version 1
    kv.put("scalar", "not a list")
    kv.append("big", ["x" * 600_000])
    store = store_of(db)
    calls = [lambda i=i: kv.put(f"k{i}", i) for i in range(8)]
    calls += [lambda: kv.put("v", 2, if_version=7),  # VersionConflict (before or after the last)
              lambda: kv.append("scalar", [1]),  # NotAList
              lambda: kv.append("big", ["y" * 600_000]),  # TooLarge: the list would pass 1 MiB
              lambda: kv.put("v", 3, if_version=1)]  # succeeds
    holder, release = hold_commit(store)
    outcomes: list = [None] * len(calls)
    conns_ready = threading.Barrier(len(calls) + 1)

    def run(i: int) -> None:
        store.conn()  # this thread's connection, before the hooks are counted
        conns_ready.wait()
        conns_ready.wait()
        try:
            outcomes[i] = calls[i]()
        except Exception as e:
            outcomes[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    conns_ready.wait()
    commits = count_commits(db)
    head = db.last_change()
    conns_ready.wait()
    wait_queued(store, len(calls))  # the holder's own write is taken, not queued
    release.set()
    for t in threads + [holder]:
        t.join(30)
    assert commits[0] == 2  # the holder's group, then all the queued writes in one
    assert outcomes[:8] == [1] * 8
    assert isinstance(outcomes[8], agentstate.VersionConflict) and outcomes[8].current_version in (1, 2)
    assert isinstance(outcomes[9], agentstate.NotAList)
    assert isinstance(outcomes[10], agentstate.TooLarge)
    assert outcomes[11] == 2
    assert [kv.get(f"k{i}") for i in range(8)] == list(range(8))
    assert kv.get_versioned("v") == (3, 2)
    assert kv.get("scalar") == "not a list" and kv.length("big") == 1
    # one change row per committed write, none for the refused ones
    changes = db.changes(head)
    assert sorted((c.key, c.op) for c in changes) == sorted(
        [(f"k{i}", "put") for i in range(8)] + [("v", "put")])


def test_a_failed_commit_fails_every_write_of_its_group(db):
    """No write is acknowledged before the COMMIT that covers it: when that COMMIT
    fails, every write of the group raises and none is there."""
    kv = db.scope("session", "g")
    store = store_of(db)
    holder, release = hold_commit(store)
    outcomes: list = [None] * 6

    def run(i: int) -> None:
        try:
            outcomes[i] = kv.put(f"k{i}", i)
        except Exception as e:
            outcomes[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    wait_queued(store, 6)
    # the next group is led by the first queued thread: veto every commit from now on
    for c in store._conns:
        c.set_commit_hook(lambda: True)
    release.set()
    for t in threads + [holder]:
        t.join(30)
    for c in store._conns:
        c.set_commit_hook(None)
    assert all(isinstance(o, agentstate.StorageError) for o in outcomes), outcomes
    assert kv.list() == []
    assert kv.put("after", 1) == 1  # the store goes on


def test_concurrent_updates_lose_nothing(db_path):
    """update()'s compare-and-set under group commit: 16 threads x 40 increments."""
    with agentstate.open(db_path) as db:
        counter = db.scope("agent", "a")

        def work() -> None:
            for _ in range(40):
                counter.update("n", lambda v: v + 1, default=0)

        threads = [threading.Thread(target=work) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert counter.get("n") == 640
        assert len([c for c in db.changes(0, limit=10_000) if c.key == "n"]) == 640


def test_many_threads_fewer_commits_than_writes(db_path):
    """Without forcing: 16 threads writing at once share commits (at least some)."""
    with agentstate.open(db_path) as db:
        kv = db.scope("session", "s")
        ready = threading.Barrier(17)
        store = store_of(db)

        def work(w: int) -> None:
            store.conn()
            ready.wait()
            ready.wait()
            for n in range(50):
                kv.put(f"w{w}-{n}", n)

        threads = [threading.Thread(target=work, args=(w,)) for w in range(16)]
        for t in threads:
            t.start()
        ready.wait()
        commits = count_commits(db)
        ready.wait()
        for t in threads:
            t.join()
        assert len(kv.list()) == 800
        assert commits[0] < 800


def test_a_transaction_stays_all_or_nothing_beside_groups(db):
    """An explicit transaction() in one thread while other threads group-commit: its
    rollback takes all of its writes, theirs all commit."""
    kv = db.scope("session", "t")
    stop = threading.Event()
    written: list[int] = []

    def writer() -> None:
        n = 0
        while not stop.is_set():
            kv.put(f"w{n}", n)
            written.append(n)
            n += 1

    others = [threading.Thread(target=writer) for _ in range(4)]
    for t in others:
        t.start()
    for round_ in range(5):
        with pytest.raises(RuntimeError):
            with db.transaction():
                kv.put(f"inside{round_}", 1)
                kv.append(f"list{round_}", [1, 2])
                raise RuntimeError("roll back")
        with db.transaction():
            kv.put(f"kept{round_}", 1)
            kv.append(f"klist{round_}", [1, 2])
    stop.set()
    for t in others:
        t.join()
    keys = set(kv.list())
    assert not any(k.startswith(("inside", "list")) for k in keys)
    assert all(f"kept{r}" in keys and kv.slice(f"klist{r}") == [1, 2] for r in range(5))
    assert written and all(f"w{n}" in keys for n in written)


def test_async_tasks_group_and_keep_the_owner_rule(db):
    """Async twins from many tasks commit (grouped in worker threads); a plain call from
    another task inside an open transaction on the loop's thread is still refused."""
    kv = db.scope("session", "a")

    async def main() -> list:
        return await asyncio.gather(*(kv.aput(f"k{i}", i) for i in range(64)))

    assert asyncio.run(main()) == [1] * 64
    assert len(kv.list()) == 64


def test_one_thread_writes_without_savepoints(db):
    """A write alone in its group is a plain BEGIN IMMEDIATE ... COMMIT (no SAVEPOINT):
    a single thread pays nothing for group commit."""
    kv = db.scope("session", "one")
    kv.put("warm", 0)
    statements: list[str] = []
    c = store_of(db).conn()
    c.exec_trace = lambda cur, sql, bindings: statements.append(sql.split()[0].upper()) or True
    kv.put("k", 1)
    c.exec_trace = None
    assert "SAVEPOINT" not in statements and statements[0] == "BEGIN" and statements[-1] == "COMMIT"


def test_benchmark_smoke(tmp_path):
    """The group-commit benchmark's quick mode produces its table (speed is not asserted)."""
    res = bench.measure(repeats=1, seconds=0.1, writers=3)
    text = bench.table(res, 3)
    assert "| 3 threads | full | agentstate, group commit |" in text
    assert "| 3 processes | full | raw apsw, one transaction per write |" in text
    cost = bench.cost_table(res, 3)  # CPU and context switches a write, from getrusage
    row = next(line for line in cost.splitlines() if line.startswith("| 3 threads | agentstate, group commit |"))
    user, kernel, switches = (float(x) for x in row.strip("|").split("|")[4:7])
    assert user > 0 and kernel >= 0 and switches >= 0


def test_percall_benchmark_smoke():
    """The per-call benchmark runs each variant and restores the store as shipped."""
    from benchmarks import percall
    from agentstate.backends.sqlite import feed as _feed

    record = _feed.record
    res = percall.measure("normal", rounds=1, calls=5)
    text = percall.table("normal", res)
    assert "| put | temp_store FILE |" in text and "| raw apsw put | (the floor) |" in text
    assert _feed.record is record  # the no-feed variant did not leak


def test_purge_step_takes_the_oldest_batch_and_never_the_newest_row(db):
    """The housekeeping every commit group pays for: at most ``batch`` of the oldest
    rows past the retention, never the newest row (its seq is not handed out again)."""
    from agentstate.backends.sqlite import admin

    store = store_of(db)
    store.housekeeping = None  # only the calls below purge
    kv = db.scope("app", "p")
    with db.transaction():
        for i in range(40):
            kv.put(f"k{i}", i)
    db.set_setting("feed_retention", 1)
    time.sleep(1.1)
    counts = []
    for _ in range(3):
        with store.write() as c:
            counts.append(admin.purge(c, 32))
    assert counts == [32, 7, 0]
    assert [c.seq for c in db.changes(db.last_change() - 1)] == [db.last_change()]
    kv.put("after", 1)
    assert db.changes(db.last_change() - 1)[0].seq == 41  # 41: set_setting records no row



def test_durability_normal_groups_too(db_path):
    """At normal, writes that arrive while a commit is under way queue for the next
    group (in Python, not in SQLite's busy handler) and each still commits."""
    with agentstate.open(db_path, durability="normal") as db:
        kv = db.scope("session", "s")
        store = store_of(db)
        holder, release = hold_commit(store)
        writers = [threading.Thread(target=kv.put, args=(f"w{w}", w)) for w in range(4)]
        for t in writers:
            t.start()
        wait_queued(store, 4)
        release.set()
        holder.join()
        for t in writers:
            t.join()
        assert {k: kv.get(k) for k in kv.list()} == {f"w{w}": w for w in range(4)}


def test_the_main_thread_never_leads_a_group(db, monkeypatch):
    """KeyboardInterrupt lands in the main thread between any two steps: its writes
    queue in groups (fairly, beside the other threads') but never lead one, so an
    interrupt there cannot strand the group or become other threads' outcome. When
    only its write is left waiting, it goes alone."""
    kv = db.scope("session", "m")
    store = store_of(db)
    leaders: list[threading.Thread] = []
    lead = store._lead
    monkeypatch.setattr(store, "_lead", lambda c, mine: leaders.append(
        threading.current_thread()) or lead(c, mine))
    for round_ in range(2):  # with workers queued behind it; then with none
        holder, release = hold_commit(store)
        workers = [threading.Thread(target=kv.put, args=(f"w{round_}-{i}", i)) for i in range(2)]

        def queue_behind_main() -> None:
            wait_queued(store, 1)  # the main thread's put, first in the queue
            for t in workers[:2 - 2 * round_]:
                t.start()
            wait_queued(store, 3 - 2 * round_)
            release.set()

        t = threading.Thread(target=queue_behind_main)
        t.start()
        assert kv.put(f"main{round_}", round_) == 1
        t.join(30)
        holder.join(30)
        for w in workers[:2 - 2 * round_]:
            w.join(30)
    assert threading.main_thread() not in leaders and len(leaders) == 1
    assert sorted(kv.list()) == ["main0", "main1", "w0-0", "w0-1"]


def test_ctrl_c_storms_in_the_main_thread_strand_no_writer(tmp_path):
    """16 threads and the main thread write while SIGINT arrives every ~2 ms and the
    main thread shrugs off each KeyboardInterrupt: no write hangs, no worker thread
    ever gets an interrupt as its outcome, nothing acknowledged is missing."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    path = str(tmp_path / "storm.db")
    script = Path(__file__).with_name("interruptwriter.py")
    out = subprocess.run([sys.executable, str(script), path, "4"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-2000:])
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["worker_interrupts"] == [] and got["errors"] == [] and got["alive"] == 0
    assert got["main_interrupted"] > 0  # the storm did reach the main thread's calls
    with agentstate.open(path) as db:
        keys = set(db.scope("agent", "a").list())
        assert len(got["acked"]) > 100 and set(got["acked"]) <= keys
        assert db.check() == []


def test_a_finalizer_that_writes_during_the_bookkeeping_does_not_deadlock(db, monkeypatch):
    """The garbage collector may run a finalizer at any allocation, one made while the
    group's lock is held included; a finalizer that writes then makes a plain write
    instead of taking that lock again on the same thread (which never returns)."""
    from agentstate.backends.sqlite import group_commit

    kv = db.scope("session", "f")
    store = store_of(db)
    entered = threading.Event()
    wrote: list[int] = []

    class Pending(group_commit._Pending):
        __slots__ = ()

        def __init__(self, *args) -> None:
            super().__init__(*args)
            if not entered.is_set():  # what a finalizer run by the GC here would do
                entered.set()
                wrote.append(kv.put("from-finalizer", 1))

    monkeypatch.setattr(group_commit, "_Pending", Pending)
    holder, release = hold_commit(store)
    t = threading.Thread(target=kv.put, args=("k", 1), daemon=True)
    t.start()
    assert entered.wait(30)
    release.set()
    t.join(30)
    holder.join(30)
    assert not t.is_alive(), "the thread deadlocked on the group's lock"
    assert wrote == [1] and kv.get("from-finalizer") == 1 and kv.get("k") == 1
    assert kv.put("after", 1) == 1


def test_a_queued_write_waits_no_longer_than_busy_timeout(db_path):
    """SPEC §1: writers wait for each other up to busy_timeout, then Busy. Writes that
    queue behind a group whose leader is itself waiting for the lock (held here by
    another connection, as another process would) fail at their own deadline, not
    after the leader's wait plus their own."""
    import apsw

    with agentstate.open(db_path, busy_timeout=1.0) as db:
        kv = db.scope("session", "b")
        kv.put("warm", 1)
        other = apsw.Connection(db_path)
        other.execute("BEGIN IMMEDIATE")
        waited: dict[int, tuple[str, float]] = {}

        def write(i: int, delay: float) -> None:
            time.sleep(delay)
            t0 = time.monotonic()
            try:
                kv.put(f"k{i}", i)
                waited[i] = ("ok", time.monotonic() - t0)
            except agentstate.Busy:
                waited[i] = ("Busy", time.monotonic() - t0)

        threads = [threading.Thread(target=write, args=(i, 0.2 * i)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        other.execute("ROLLBACK")
        other.close()
        assert sorted(waited) == [0, 1, 2, 3]
        assert all(how == "Busy" and 0.95 <= s <= 1.4 for how, s in waited.values()), waited
        assert kv.put("after", 1) == 1  # the lock is free again: writes go on


def test_close_while_threads_write_loses_nothing_acknowledged(tmp_path):
    """db.close() while 32 threads write: every thread ends (Closed), every write that
    returned is in the file, and no raw driver error leaks out of a group."""
    import random

    for run in range(4):
        path = str(tmp_path / f"close{run}.db")
        db = agentstate.open(path)
        kv = db.scope("agent", "a")
        kv.put("warm", 1)
        acked: list[str] = []
        errors: list[BaseException] = []

        def write(t: int) -> None:
            n = 0
            while True:
                k = f"{t}-{n}"
                n += 1
                try:
                    kv.put(k, n)
                    acked.append(k)
                except agentstate.Closed:
                    return
                except BaseException as e:  # noqa: BLE001 - the test fails on it
                    errors.append(e)
                    return

        threads = [threading.Thread(target=write, args=(t,), daemon=True) for t in range(32)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30  # writes under way (a loaded machine starts threads slowly)
        while len(acked) < 32 and not errors and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(random.uniform(0, 0.2))
        db.close()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert errors == []
        with agentstate.open(path) as again:
            keys = set(again.scope("agent", "a").list())
        assert acked and set(acked) <= keys


class _InterruptAfterBegin:
    """Stands in for the store's context variable: KeyboardInterrupt (once) at the
    first get or set made while this thread's connection is in a transaction, i.e.
    right after BEGIN returned, as a Ctrl-C landing there would."""

    def __init__(self, store) -> None:
        self.store, self.real = store, store._txn
        store._txn = self

    def _maybe(self) -> None:
        if self.store.conn().in_transaction:
            self.store._txn = self.real
            raise KeyboardInterrupt

    def get(self):
        self._maybe()
        return self.real.get()

    def set(self, value):
        self._maybe()
        return self.real.set(value)

    def reset(self, token):
        return self.real.reset(token)


@pytest.mark.parametrize("how", ["put", "transaction"])
def test_an_interrupt_just_after_begin_leaves_no_transaction_open(db_path, how):
    """Ctrl-C can land in the main thread right after BEGIN IMMEDIATE returned, before
    the write's bookkeeping: the transaction is rolled back, not left holding the lock."""
    with agentstate.open(db_path, busy_timeout=1.0) as db:
        kv = db.scope("session", "i")
        kv.put("warm", 1)
        store = store_of(db)
        _InterruptAfterBegin(store)
        with pytest.raises(KeyboardInterrupt):
            if how == "put":
                kv.put("k", 1)
            else:
                with db.transaction():
                    kv.put("k", 1)
        assert not store.conn().in_transaction
        other: list = []
        t = threading.Thread(target=lambda: other.append(kv.put("from-thread", 1)))
        t.start()
        t.join(30)
        assert other == [1]  # not Busy: the lock was given back
        assert kv.put("k", 2) == 1 and kv.get("k") == 2


def test_a_write_refused_inside_a_snapshot_leaves_the_snapshot_alone(db):
    """A write attempted on a connection inside a read snapshot is refused before it
    touches the connection: the snapshot stays open and consistent, and takes no write
    lock (other threads keep writing)."""
    kv = db.scope("session", "s")
    kv.put("x", 1)
    store = store_of(db)
    with store.snapshot() as c:
        assert kv.get("x") == 1
        with pytest.raises(agentstate.UsageError):  # SPEC: writes inside snapshot() (0.3)
            kv.put("y", 1)
        assert c.in_transaction
        other: list = []
        t = threading.Thread(target=lambda: other.append(kv.put("x", 2)))
        t.start()
        t.join(30)
        assert other == [2]  # not Busy: the refused write took no lock
        assert kv.get("x") == 1  # still the snapshot's view
    assert kv.get("x") == 2 and kv.get("y") is None
