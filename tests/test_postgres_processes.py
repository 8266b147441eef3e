"""Real processes on one PostgreSQL server: a mixed load, a killed client, a restarted
server, and the change feed's order under concurrent committers (SPEC §9, §11)."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import subprocess
import time

import pytest

import agentstate

from . import pgserver, workers
from .conftest import pg_unavailable
from .test_postgres import psql_bin

ALICE = agentstate.Principal("alice")
PSQL_QUERIES = [
    "SELECT count(*) FROM state",
    "SELECT seq FROM run_history WHERE run_id = 'soak-run' ORDER BY seq DESC LIMIT 10",
    "SELECT session_id, status FROM active_turns",
    "SELECT value -> -1 FROM state WHERE key = 'shared-list'",
]


def test_eight_processes_mixed_load(pg_url):
    """8 processes update, append, write a run and take turns on one store while psql reads
    the views: no lost update, no lost or doubled item, no gap, one turn at a time."""
    seconds, n = 3.0, 8
    with agentstate.open(pg_url) as db:
        sid = db.sessions.create(ALICE).id
        db.scope("app", "soak").put("session_id", sid)
        db.runs.write("soak-run", [], None, create=True)
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=workers.mixed_worker, args=(pg_url, w, seconds, start, results))
             for w in range(n)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    start.set()
    psql, reads = psql_bin(), 0
    t0 = time.monotonic()
    while psql and time.monotonic() - t0 < seconds:
        for q in PSQL_QUERIES:
            r = subprocess.run([psql, pg_url, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", q],
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
            reads += 1
    out = dict(results.get(timeout=seconds + 180) for _ in procs)
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    for who, done in out.items():
        assert done["errors"] == [] and done["busy"] == [], (who, done["errors"][:3], done["busy"])
    with agentstate.open(pg_url) as db:
        assert db.check() == []
        kv = db.scope("app", "soak")
        assert kv.get("counter", 0) == sum(d["inc"] for d in out.values())
        items = kv.slice("shared-list")
        assert len(items) == len({tuple(x) for x in items})
        for who, done in out.items():
            assert [i for w, i in items if w == who] == done["appended"]
        history = db.runs.read("soak-run").entries
        assert [e["seq"] for e in history] == list(range(len(history)))
        for who, done in out.items():
            assert [e["i"] for e in history if e["who"] == who] == done["entries"]
        turns = db.sessions.turns(sid, ALICE)
        assert sum(1 for t in turns if t.status == "finished") == sum(d["turns"] for d in out.values())
        assert not [t for t in turns if t.status in ("queued", "running")]
    ops = sum(d["inc"] + len(d["appended"]) + len(d["entries"]) + d["turns"] for d in out.values())
    assert ops > 100 and (reads > 0 or psql is None)


# -- a client killed with SIGKILL in the middle of a transaction ----------------------

def _block_writer(url: str, inside) -> None:
    """Transactions of four writes each, forever; says when it is inside one, then dawdles."""
    with agentstate.open(url) as db:
        kv = db.scope("app", "k")
        i = kv.get("last", -1) + 1
        while True:
            with db.transaction():
                kv.put(f"a{i}", i)
                kv.append("log", [i])
                db.runs.write("r", [{"seq": i}], {"i": i}, create=i == 0)
                inside.put(i)
                time.sleep(random.random() * 0.02)
                kv.put("last", i)
            i += 1


@pytest.mark.parametrize("trial", range(2))
def test_a_client_killed_mid_transaction_leaves_nothing_half_done(pg_url, trial):
    """SIGKILL while a transaction of several writes is open: none of them stays, every
    earlier one is whole, the server frees its locks at once, check() holds."""
    ctx = mp.get_context("spawn")
    inside = ctx.Queue()
    p = ctx.Process(target=_block_writer, args=(pg_url, inside))
    p.start()
    target = 3 + trial * 9
    while (i := inside.get(timeout=120)) < target:
        pass
    os.kill(p.pid, signal.SIGKILL)  # block i is open: a{i}, log and run written, last not
    p.join(30)
    with agentstate.open(pg_url, busy_timeout=10) as db:
        kv = db.scope("app", "k")
        last = kv.get("last")
        assert last in (i - 1, i)  # the kill may land after the block's last statement
        assert [k for k in kv.list("a")] == sorted(f"a{n}" for n in range(last + 1))
        assert kv.get("log") == list(range(last + 1))
        assert [e["seq"] for e in db.runs.read("r").entries] == list(range(last + 1))
        assert db.runs.read("r").snapshot == {"i": last}
        kv.put(f"a{last + 1}", "next")  # its row locks are gone
        assert db.check() == []


# -- the server restarted mid-run ------------------------------------------------------

def _acking_writer(url: str, who: int, seconds: float, start, results) -> None:
    """Append (who, i) again and again, noting what was acknowledged and every error."""
    acked, unknown, errors = [], [], []
    with agentstate.open(url, busy_timeout=20) as db:
        kv = db.scope("app", "acks")
        start.wait()
        t0, i = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            i += 1
            try:
                kv.append("items", [[who, i]])
                acked.append(i)
            except agentstate.StorageError as e:
                errors.append(str(e))
                if e.outcome_unknown:
                    unknown.append(i)
            except Exception as e:  # anything else is a failure the test reports
                errors.append(f"UNEXPECTED {type(e).__name__}: {e}")
    results.put((who, acked, unknown, errors))


def _block_across_restart(url: str, inside, go_on, results) -> None:
    """Hold a transaction open while the server restarts: its next statement must fail
    clearly, nothing of the block stays, and a new block works."""
    with agentstate.open(url, busy_timeout=20) as db:
        kv = db.scope("app", "block")
        try:
            with db.transaction():
                kv.put("before", 1)
                inside.put("in")
                go_on.wait(120)
                kv.put("after", 1)
            results.put(("committed", ""))
        except agentstate.AgentStateError as e:
            results.put((type(e).__name__, str(e)))
        with db.transaction():
            kv.put("again", 1)
        results.put(("again", kv.list()))


def test_the_server_restarted_mid_run(tmp_path):
    """pg_ctl restart -m fast under 4 writing processes and an open transaction: clients get
    a clear StorageError, reconnect by themselves, and nothing acknowledged is lost."""
    bin_dir = pgserver.bindir()
    if bin_dir is None:
        pg_unavailable("restarting a server needs the PostgreSQL binaries (apt-get install postgresql)")
    server = pgserver.Server(bin_dir).start()
    try:
        url = server.admin_url
        agentstate.open(url).close()
        ctx = mp.get_context("spawn")
        start, results = ctx.Event(), ctx.Queue()
        inside, go_on, block_results = ctx.Queue(), ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_acking_writer, args=(url, w, 4.0, start, results))
                 for w in range(4)]
        procs.append(ctx.Process(target=_block_across_restart, args=(url, inside, go_on, block_results)))
        for p in procs:
            p.start()
        assert inside.get(timeout=120) == "in"
        start.set()
        time.sleep(1.5)
        server.restart()
        go_on.set()
        out = [results.get(timeout=180) for _ in range(4)]
        block = [block_results.get(timeout=120) for _ in range(2)]
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 5
        errors = [e for _, _, _, errs in out for e in errs]
        assert not [e for e in errors if e.startswith("UNEXPECTED")], errors
        assert block[0][0] == "StorageError" and "lost the connection" in block[0][1], block
        assert block[1] == ("again", ["again"])  # "before" went with the broken block
        with agentstate.open(url) as db:
            items = [tuple(x) for x in db.scope("app", "acks").slice("items")]
            assert len(items) == len(set(items))  # nothing doubled
            for who, acked, unknown, _ in out:
                mine = [i for w, i in items if w == who]
                assert set(acked) <= set(mine)  # nothing acknowledged is lost
                assert set(mine) <= set(acked) | set(unknown)  # nothing appears from nowhere
                assert acked and max(acked) > max(unknown, default=0)  # and they went on after
            assert db.check() == []
    finally:
        server.stop()


# -- the change feed under concurrent committers ---------------------------------------

def _feed_writer(url: str, who: int, n: int, start, results) -> None:
    """Single writes, blocks of three, appends, run writes and turns, interleaved."""
    rnd = random.Random(who)
    blocks = []
    with agentstate.open(url) as db:
        kv = db.scope("agent", f"w{who}")
        run = f"run-{who}"
        db.runs.write(run, [], None, create=True)
        sid = db.sessions.create(ALICE).id
        start.wait()
        for i in range(n):
            op = rnd.randrange(5)
            if op == 0:
                with db.transaction():
                    for j in range(3):
                        kv.put(f"b{i}-{j}", j)
                blocks.append(i)
            elif op == 1:
                kv.append("list", [i])
            elif op == 2:
                db.runs.write(run, [{"seq": len(db.runs.entries(run))}], None)
            elif op == 3:
                with db.sessions.turn(sid, ALICE):
                    pass
            else:
                db.scope("app", "shared").update("n", lambda v: v + 1, default=0)
    results.put((who, blocks))


def test_a_polling_reader_sees_the_feed_in_commit_order(pg_url):
    """8 processes commit concurrently while a reader polls: the seqs it sees rise one by one
    and are exactly what the feed holds afterwards (no change <= N ever appears after N was
    seen), a block's changes are consecutive, and a key's versions rise with the seqs."""
    n = 40
    with agentstate.open(pg_url) as db:
        ctx = mp.get_context("spawn")
        start, results = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_feed_writer, args=(pg_url, w, n, start, results))
                 for w in range(8)]
        for p in procs:
            p.start()
        time.sleep(1.0)
        start.set()
        seen, since, polls = [], 0, 0
        while any(p.is_alive() for p in procs) or db.changes(since):
            got = db.changes(since)
            polls += 1
            seen += got
            since = got[-1].seq if got else since
        blocks = dict(results.get(timeout=60) for _ in procs)
        for p in procs:
            p.join(60)
        assert [p.exitcode for p in procs] == [0] * 8
        final = db.changes(0, limit=10_000)
        assert [c.seq for c in seen] == list(range(1, len(final) + 1)) and seen == final
        assert polls > 10
        where = {(c.scope_id, c.key): c.seq for c in final if c.topic == "kv"}
        for who, done in blocks.items():
            for i in done:
                seqs = [where[(f"w{who}", f"b{i}-{j}")] for j in range(3)]
                assert seqs == [seqs[0], seqs[0] + 1, seqs[0] + 2], (who, i, seqs)
        versions: dict[tuple, int] = {}
        for c in final:
            if c.topic == "kv":
                k = (c.kind, c.scope_id, c.key)
                assert c.version > versions.get(k, 0), c
                versions[k] = c.version
        assert db.scope("app", "shared").get("n") == sum(
            1 for c in final if c.key == "n" and c.op == "put")
        assert db.check() == []
