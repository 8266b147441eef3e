"""The change feed on PostgreSQL without a lock every writer shares (issue 12, SPEC §9).

Writers add their changes unnumbered (change_new) and commit side by side; a
reader numbers the committed ones before it reads (feed_sequence), one at a
time; the wake-up (NOTIFY) goes out after the write's COMMIT. These tests hold
the backend to that: an uncommitted write holds up no writer of other rows,
seqs only ever appear in increasing order to readers in several processes,
every acknowledged change is in the feed once, a reader sees its own writes,
a watcher wakes on another process's write and finds one whose wake-up was
lost, and a feed nobody reads is still numbered and purged.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import threading
import time

import psycopg

import agentstate

ALICE = agentstate.Principal("alice")


def _raw(url: str) -> psycopg.Connection:
    return psycopg.connect(url, autocommit=True)


# -- no lock shared by all writers ------------------------------------------------------

def test_an_uncommitted_write_holds_up_no_writer_of_other_rows(pg_url):
    """Another client's lone write to key a (a run, a session's turn) stays uncommitted:
    writes to other keys, runs and sessions commit at once, with a short busy_timeout, and
    readers of the feed neither wait nor see the uncommitted change; once it commits, it is
    in the feed after them."""
    with agentstate.open(pg_url, busy_timeout=0.3) as db:
        kv = db.scope("app", "a")
        db.runs.write("r1", [], None, create=True)
        db.runs.write("r2", [], None, create=True)
        s1, s2 = db.sessions.create(ALICE).id, db.sessions.create(ALICE).id
        head = db.last_change()
        with _raw(pg_url) as other:
            other.execute("BEGIN")
            other.execute("SELECT kv_put('app', 'a', 'key-a', 'json', '1', NULL, 1, NULL, NULL, NULL, false)")
            other.execute("SELECT o_end FROM run_write('r1', ARRAY[0], ARRAY['{\"seq\":0}'], NULL, false)")
            other.execute("SELECT id FROM turn_start('t-held', %s, 'running', NULL, 60)", (s1,))
            t0 = time.monotonic()
            assert kv.put("key-b", 2) == 1
            assert kv.append("list-b", [1]).length == 1
            db.runs.write("r2", [{"seq": 0}], None)
            db.sessions.start_turn(s2, ALICE).finish({"ok": True})
            with db.transaction():
                kv.put("key-c", 3)
                kv.put("key-d", 4)
            assert time.monotonic() - t0 < 3
            mine = db.changes(head)
            assert len(mine) == 7 and db.last_change() == head + 7
            assert not [c for c in mine if c.key in ("key-a", "t-held") or c.scope_id == "r1"]
            other.execute("COMMIT")
        after = db.changes(head + 7)
        assert [(c.op, c.key or c.scope_id) for c in after] == [
            ("put", "key-a"), ("write", "r1"), ("running", "t-held")]
        assert [c.seq for c in after] == [head + 8, head + 9, head + 10]
        assert db.check() == []


def test_a_transaction_that_waited_for_another_comes_after_it_whole(pg_url):
    """Block B writes x; then block A writes y; then B wants y and waits for A, which
    commits. In the feed A's change comes before B's, and B's two are consecutive: a
    transaction's changes are ordered by a ticket taken at its COMMIT, after everything it
    waited for. (Ordered as each write happens, B's x would come first and split B, or, a
    block ordered by its first write, B's y would come before A's y: versions 2, then 1.)"""
    with agentstate.open(pg_url, busy_timeout=10) as db:
        kv = db.scope("app", "o")
        head = db.last_change()
        b_wrote_x, a_holds_y, b_done = threading.Event(), threading.Event(), threading.Event()

        def block_b() -> None:
            with db.transaction():
                kv.put("x", "b")
                b_wrote_x.set()
                a_holds_y.wait(10)
                kv.put("y", "b")  # waits for A's row lock
            b_done.set()

        t = threading.Thread(target=block_b)
        t.start()
        assert b_wrote_x.wait(10)
        with db.transaction():
            kv.put("y", "a")
            a_holds_y.set()
            time.sleep(0.3)  # B is waiting for y now
        t.join(30)
        assert b_done.is_set()
        got = [(c.key, c.version) for c in db.changes(head)]
        assert got == [("y", 1), ("x", 1), ("y", 2)]
        assert kv.get("y") == "b"


# -- readers number the feed ------------------------------------------------------------

def test_a_writer_sees_its_own_change_at_once(pg_url):
    """Read-your-writes: a write that returned is in changes() and last_change() of the same
    client and of another one, at either durability; numbering is durable even when the
    session's commits are not."""
    for durability in ("full", "normal"):
        with agentstate.open(pg_url, durability=durability) as db, agentstate.open(pg_url) as other:
            kv = db.scope("app", durability)
            for i in range(5):
                before = db.last_change()
                kv.put("k", i)
                assert db.last_change() == before + 1
                assert [(c.key, c.version) for c in db.changes(before)] == [("k", i + 1)]
                kv.append("l", [i])
                assert other.changes(before)[-1].key == "l" and other.last_change() == before + 2
    with _raw(pg_url) as c:
        c.execute("SET synchronous_commit = off")
        c.execute("SELECT kv_put('app', 'z', 'k', 'json', '1', NULL, 1, NULL, NULL, NULL, false)")
        c.execute("BEGIN")
        assert c.execute("SELECT feed_sequence()").fetchone()[0] >= 1
        assert c.execute("SELECT current_setting('synchronous_commit')").fetchone()[0] == "on"
        c.execute("COMMIT")


def test_a_reader_with_nothing_to_number_takes_no_lock_and_writes_nothing(pg_url):
    """Polling an idle feed costs no transaction id (so no commit record and no flush) and
    waits for no one, even while a sequencer holds the sequencers' lock; a sequencer that
    waited for another and finds nothing left to number writes nothing either."""
    with agentstate.open(pg_url, busy_timeout=0.2) as db:
        db.scope("app", "a").put("k", 1)
        head = db.last_change()
        with _raw(pg_url) as c, _raw(pg_url) as holder:
            for _ in range(3):
                c.execute("BEGIN")
                assert c.execute("SELECT feed_sequence()").fetchone()[0] == head
                assert c.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0] is None
                c.execute("COMMIT")
            holder.execute("BEGIN")
            holder.execute("SELECT pg_advisory_xact_lock(feed_lock_key())")  # a sequencer's
            for _ in range(3):
                assert db.changes(head) == [] and db.last_change() == head
            holder.execute("ROLLBACK")
            db.scope("app", "a").put("k", 2)
            holder.execute("BEGIN")
            holder.execute("SELECT pg_advisory_xact_lock(feed_lock_key())")
            c.execute("BEGIN")
            c.execute("SET LOCAL lock_timeout = '10s'")
            got: list = []
            waiter = threading.Thread(
                target=lambda: got.append(c.execute("SELECT feed_sequence()").fetchone()[0]))
            waiter.start()  # sees a change to number: waits for holder's lock
            time.sleep(0.3)
            assert not got
            assert holder.execute("SELECT feed_number()").fetchone()[0] == head + 1
            holder.execute("COMMIT")
            waiter.join(10)
            assert got == [head + 1]  # numbered by the holder, and nothing left
            assert c.execute("SELECT pg_current_xact_id_if_assigned()").fetchone()[0] is None
            c.execute("COMMIT")


def _acked_writer(url: str, who: int, seconds: float, start, results) -> None:
    """Lone writes, blocks, appends, run writes, turns and a shared counter, for ``seconds``:
    (scope, key, version) of each kv change it was told committed, its run writes and turns."""
    rnd = random.Random(who)
    acked: list[tuple[str, str, int]] = []
    runs = turns = 0
    with agentstate.open(url, durability="normal" if who % 2 else "full") as db:
        kv = db.scope("agent", f"w{who}")
        run = f"run-{who}"
        db.runs.write(run, [], None, create=True)
        sid = db.sessions.create(ALICE).id
        start.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            op = rnd.randrange(6)
            if op == 0:
                with db.transaction():
                    got = [(f"b{j}", kv.put(f"b{j}", j)) for j in range(3)]
                acked += [(f"w{who}", k, v) for k, v in got]
            elif op == 1:
                acked.append((f"w{who}", "list", kv.append("list", [1]).version))
            elif op == 2:
                acked.append((f"w{who}", "p", kv.put("p", rnd.random())))
            elif op == 3:
                db.runs.write(run, [{"seq": runs}], None)
                runs += 1
            elif op == 4:
                db.sessions.start_turn(sid, ALICE).finish()
                turns += 1
            else:
                db.scope("app", "shared").update("n", lambda v: v + 1, default=0)
    results.put((who, sid, acked, runs, turns))


def _polling_reader(url: str, stop, results) -> None:
    """Polls changes() and last_change() until told to stop, then reads what is left."""
    seen: list[int] = []
    heads: list[int] = []
    with agentstate.open(url) as db:
        since = db.last_change()
        first = since
        while True:
            stopping = stop.is_set()
            got = db.changes(since)
            seen += [c.seq for c in got]
            since = got[-1].seq if got else since
            heads.append(db.last_change())
            if stopping and not got:
                break
    results.put((first, seen, heads))


def test_concurrent_writers_and_readers_in_processes_see_one_order(pg_url):
    """6 writer processes (half at durability normal) and 3 reader processes that number the
    feed as they poll, for a few seconds: every acknowledged change is in the feed exactly
    once; the seqs are contiguous; each reader saw them one by one (never a seq at or below
    one it had seen appear later) and exactly as the feed holds them; last_change() never
    went back; a block's changes are consecutive; a key's versions rise with the seqs."""
    ctx = mp.get_context("spawn")
    start, stop, results, reads = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    writers = [ctx.Process(target=_acked_writer, args=(pg_url, w, 3.0, start, results))
               for w in range(6)]
    readers = [ctx.Process(target=_polling_reader, args=(pg_url, stop, reads)) for _ in range(3)]
    for p in writers + readers:
        p.start()
    time.sleep(1.5)
    start.set()
    done = [results.get(timeout=180) for _ in writers]
    stop.set()
    read = [reads.get(timeout=120) for _ in readers]
    for p in writers + readers:
        p.join(60)
    assert [p.exitcode for p in writers + readers] == [0] * 9
    with agentstate.open(pg_url) as db:
        final: list = []
        while got := db.changes(final[-1].seq if final else 0, limit=10_000):
            final += got
        assert [c.seq for c in final] == list(range(1, len(final) + 1))
        by_seq = {c.seq: c for c in final}
        for first, seen, heads in read:
            assert seen == list(range(first + 1, first + 1 + len(seen))), seen[:20]
            assert heads == sorted(heads)
            assert seen[-1] == final[-1].seq
        kv_changes = [(c.scope_id, c.key, c.version) for c in final if c.topic == "kv"]
        assert len(kv_changes) == len(set(kv_changes))  # none twice
        ours = {k for k in kv_changes if k[0] != "shared"}
        acked = {a for _, _, got, _, _ in done for a in got}
        assert ours == acked  # every acknowledged change, and nothing else
        for who, sid, _, runs, turns in done:
            writes = [c.start for c in final if c.scope_id == f"run-{who}" and c.op == "write"]
            assert writes == list(range(runs))
            assert sum(1 for c in final if c.scope_id == sid and c.op == "finished") == turns
        versions: dict[tuple[str, str], int] = {}
        for c in final:
            if c.topic == "kv":
                k = (c.scope_id, c.key)
                assert c.version > versions.get(k, 0), c
                versions[k] = c.version
                if c.key == "b0":  # a block's three puts: consecutive
                    assert [(by_seq[c.seq + j].scope_id, by_seq[c.seq + j].key)
                            for j in range(3)] == [(c.scope_id, f"b{j}") for j in range(3)]
        assert db.scope("app", "shared").get("n") == sum(
            1 for c in final if c.key == "n" and c.op == "put")
        assert db.check() == []


# -- wake-ups -----------------------------------------------------------------------------

def _write_later(url: str, delay: float, q) -> None:
    with agentstate.open(url) as db:
        time.sleep(delay)
        db.scope("app", "w").put("k", 1)
        q.put(time.time())


def test_watch_and_awatch_wake_on_another_process_within_a_second(pg_url):
    with agentstate.open(pg_url) as db:
        ctx = mp.get_context("spawn")
        for way in ("watch", "awatch"):
            head = db.last_change()
            q = ctx.Queue()
            p = ctx.Process(target=_write_later, args=(pg_url, 2.0, q))
            p.start()
            if way == "watch":
                got = db.watch(head, timeout=60)
            else:
                async def first():
                    async for ch in db.awatch(head):
                        return ch
                got = [asyncio.run(asyncio.wait_for(first(), 60))]
            woke = time.time()
            written = q.get(timeout=60)
            p.join(30)
            assert [(c.key, c.version) for c in got] == [("k", 1 if way == "watch" else 2)]
            assert woke - written < 1.0, way


def test_a_lost_wake_up_is_made_up_for_within_a_second_or_so(pg_url):
    """A client that commits a write and dies before its NOTIFY (here: raw psycopg calling the
    write function, which sends none): a waiting watch still returns it, within RECHECK."""
    with agentstate.open(pg_url) as db:
        head = db.last_change()
        found: list = []
        t = threading.Thread(target=lambda: found.append(db.watch(head, timeout=30)))
        t.start()
        time.sleep(0.5)
        with _raw(pg_url) as c:
            c.execute("SELECT kv_put('app', 'q', 'k', 'json', '1', NULL, 1, NULL, NULL, NULL, false)")
        written = time.monotonic()
        t.join(30)
        # the look-again is every second; without it the watch would sleep its whole 30 s
        assert time.monotonic() - written < 5.0
        assert [(c.scope_id, c.key) for c in found[0]] == [("q", "k")]


# -- a feed nobody reads ------------------------------------------------------------------

def test_a_feed_nobody_reads_is_still_numbered_and_purged(pg_url):
    """Without readers, writers number the feed themselves every second or so (after their
    COMMIT, never waiting), so the retention purge keeps it bounded."""
    with agentstate.open(pg_url) as db:
        db.set_setting("feed_retention", 1)
        kv = db.scope("app", "n")
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < 3.5:
            kv.put(f"k{i % 10}", i)
            i += 1
            time.sleep(0.002)
        with _raw(pg_url) as c:
            unnumbered = c.execute("SELECT count(*) FROM change_new").fetchone()[0]
            numbered, low = c.execute("SELECT count(*), min(seq) FROM change").fetchone()
        assert unnumbered < i / 2, (unnumbered, i)
        assert low > 1 and numbered < i  # the oldest were purged
        assert db.check() == []


def test_a_reader_s_look_for_new_changes_costs_the_same_after_many(pg_url):
    """The numbered changes leave dead rows in change_new until VACUUM; a reader's look for
    new ones starts at the fence (an index scan), so it touches as many buffers after 5,000
    numbered changes as on a new store."""
    from .test_postgres import _buffers

    with agentstate.open(pg_url, durability="normal") as db:
        db.scope("app", "f").put("k", 0)
        db.last_change()
        before = _buffers(pg_url, "SELECT feed_pending()", ())
        for i in range(5000):
            db.scope("app", "f").put(f"k{i % 20}", i)
            if i % 100 == 99:
                db.last_change()
        after = _buffers(pg_url, "SELECT feed_pending()", ())
        with _raw(pg_url) as c:
            pages = c.execute("SELECT pg_relation_size('change_new') / 8192").fetchone()[0]
        assert after <= before + 2, (before, after, pages)
        assert db.check() == []


def test_a_client_that_may_not_write_reads_what_others_numbered(pg_url, pg_admin_url):
    """A read-only client (default_transaction_read_only, or a role with SELECT only) numbers
    nothing and is not refused: it reads the changes the others numbered."""
    import uuid

    ro_url = pg_url + "%20-cdefault_transaction_read_only%3Don"
    role = "r_" + uuid.uuid4().hex[:12]
    schema = pg_url.rsplit("%3D", 1)[1]
    with agentstate.open(pg_url) as db, _raw(pg_admin_url) as admin:
        db.scope("app", "r").put("k", 1)
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        admin.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {schema} TO {role}")
        admin.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {schema} TO {role}")
        role_url = pg_url.replace("postgres@", f"{role}@", 1)
        try:
            with agentstate.open(ro_url) as ro, agentstate.open(role_url) as reader:
                for r in (ro, reader):
                    assert r.changes(0) == [] and r.last_change() == 0  # not numbered yet
                assert db.last_change() == 1  # numbered by a client that may write
                for r in (ro, reader):
                    assert [c.key for c in r.changes(0)] == ["k"] and r.last_change() == 1
                db.scope("app", "r").put("k", 2)
                assert reader.watch(1, timeout=0.5) == []  # nobody numbers it...
                assert db.changes(1)[0].version == 2
                assert [c.version for c in reader.watch(1, timeout=5)] == [2]  # ...until one does
        finally:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")
