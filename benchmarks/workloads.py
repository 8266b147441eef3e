"""The eight workloads: data, setup (untimed) and one measured run each.

A workload's ``measure(system, durability, round)`` is a generator: it yields
between timed chunks so that the runner can interleave the systems of one
round chunk by chunk (all of them then see the same disk and CPU weather),
and returns ``{metric: value}``: rates (higher is better) except cold open's
seconds; keys starting with ``_`` are extras, not ratioed.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from . import systems

_TEXT = "The quick brown fox jumps over the lazy dog; agents keep state between turns. " * 40


def kv_value(i: int) -> dict:
    """~200 bytes of compact JSON."""
    return {"id": i, "kind": "note", "user": f"u-{i % 97}", "tags": ["alpha", "beta"],
            "score": i * 0.5, "text": _TEXT[i % 50 : i % 50 + 108]}


def big_value(i: int) -> dict:
    """~2 KB of compact JSON (cold-open data)."""
    return {"id": i, "text": _TEXT[i % 50 : i % 50 + 2000]}


def message(i: int) -> dict:
    """~300 bytes of compact JSON: one chat message."""
    return {"id": f"m{i:06d}", "role": "user" if i % 2 else "assistant",
            "content": _TEXT[i % 50 : i % 50 + 257]}


def entry(seq: int) -> dict:
    """~200 bytes: one history entry."""
    return {"seq": seq, "type": "message", "role": "assistant", "content": _TEXT[seq % 50 : seq % 50 + 140]}


def snapshot(seq: int) -> dict:
    """~2 KB: the replaceable run snapshot."""
    return {"task": "benchmark the store", "turn": seq, "finished": False, "stopped_by": None,
            "memory": {"facts": [_TEXT[j : j + 60] for j in range(0, 600, 60)]},
            "notes": _TEXT[seq % 50 : seq % 50 + 1300]}


@dataclass
class Sizes:
    put: int = 5000
    chunks: int = 20  # a run is cut into this many timed chunks, interleaved with the others
    get_keys: int = 10_000
    get_reads: int = 20_000
    update: int = 3000
    procs: int = 4
    per_proc: int = 500
    append_lengths: tuple[int, ...] = (100, 1000, 3000)
    append_ops: int = 100
    history_lengths: tuple[int, ...] = (100, 1000, 10_000, 100_000)
    history_ops: int = 100
    tail_n: int = 20
    list_total: int = 100_000
    list_match: int = 1000
    read_budget: float = 0.5  # seconds per timed read loop (list, tail), in 5 chunks of >= 1 call
    read_max: int = 100
    cold_bytes: int = 100 * 1024 * 1024


QUICK = Sizes(put=100, chunks=4, get_keys=200, get_reads=300, update=50, procs=4, per_proc=20,
              append_lengths=(10, 100, 300), append_ops=5, history_lengths=(10, 100, 500),
              history_ops=5, list_total=2000, list_match=100, read_budget=0.01, read_max=5,
              cold_bytes=2 * 1024 * 1024)


Run = Generator[None, None, dict[str, float]]


def _chunked(fn: Any, args: list[Any], chunks: int, acc: list[float]) -> Generator[None, None, None]:
    """Call ``fn(*a)`` for each ``a`` in ``args``, timed, yielding between ``chunks`` slices."""
    step = max(1, -(-len(args) // chunks))
    for i in range(0, len(args), step):
        part = args[i : i + step]
        t0 = time.perf_counter()
        for a in part:
            fn(*a)
        acc[0] += time.perf_counter() - t0
        yield


def _timebox(fn: Any, budget: float, most: int, out: list[float]) -> Generator[None, None, None]:
    """Calls per second of ``fn()`` into ``out[0]``: 5 chunks of >= 1 call, ``budget`` s or ``most`` calls in all."""
    n, spent = 0, 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        while True:
            fn()
            n += 1
            dt = time.perf_counter() - t0
            if n >= most or dt >= budget / 5:
                break
        spent += dt
        yield
        if n >= most:
            break
    out[0] = n / spent


def settle(path: str) -> None:
    """After untimed setup, with the system's handles closed: leave nothing of it
    for the timed part to pay, whatever the system.

    Every SQLite file under ``path`` gets its WAL checkpointed and truncated (a
    system whose close() leaves a WAL would otherwise pay the setup's
    checkpoint inside its first timed writes), then ``os.sync()`` writes back
    every dirty page and commits the filesystem's journal: on ext4 an fsync
    commits the journal for *all* files, so the next system to fsync at FULL
    would otherwise pay for the file growth, WAL deletions and copies of
    everyone's setup.
    """
    import apsw

    for d, _, files in os.walk(path):
        for f in files:
            fp = os.path.join(d, f)
            if f.endswith(("-wal", "-shm", "-journal")):
                continue
            try:
                with open(fp, "rb") as fh:
                    if fh.read(16) != b"SQLite format 3\x00":
                        continue
                c = apsw.Connection(fp, flags=apsw.SQLITE_OPEN_READWRITE)
            except (OSError, apsw.Error):
                continue
            try:
                c.set_busy_timeout(5000)
                if c.pragma("journal_mode") == "wal":
                    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                c.close()
    os.sync()


def _sysdir(root: str, sysname: str, *parts: str) -> str:
    p = os.path.join(root, sysname, *parts)
    os.makedirs(p, exist_ok=True)
    return p


class Workload:
    name = ""
    title = ""
    metrics: tuple[str, ...] = ()
    higher_is_better = True
    how: dict[str, str] = {}

    def __init__(self, sizes: Sizes, root: str) -> None:
        self.z = sizes
        self.root = os.path.join(root, self.name)

    def metric_names(self) -> list[str]:
        return list(self.metrics)

    def setup(self, sysname: str) -> None:
        """Untimed preparation, once per system (shared by its runs)."""

    def measure(self, sysname: str, dur: str, r: int) -> Run:
        raise NotImplementedError

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class Put(Workload):
    name = "put"
    title = "put: distinct keys, ~200-byte JSON values, one durable write each"
    metrics = ("put/s",)
    how = {
        "agentstate": "`scope.put(key, value)`",
        "apsw": "`BEGIN IMMEDIATE; INSERT ... ON CONFLICT DO UPDATE; COMMIT` (json.dumps'd value)",
        "apsw_same": "agentstate's statements on its schema: `BEGIN IMMEDIATE`; its upsert (version, "
                     "tombstone probe, expiry) `RETURNING version`; the change row; `COMMIT`",
        "diskcache": "`cache.set(key, value)` (pickled)",
        "sqlitedict": "`d[key] = value; d.commit()` (pickled)",
        "lg_store": '`store.put(("kv",), key, value)`',
    }

    def measure(self, sysname, dur, r):
        path = _sysdir(self.root, sysname, f"{dur}-{r}")
        h = systems.get(sysname).open(path, dur)
        acc = [0.0]
        try:
            vals = [(f"p{i:06d}", kv_value(i)) for i in range(self.z.put)]
            yield from _chunked(h.put, vals, self.z.chunks, acc)
        finally:
            h.close()
        shutil.rmtree(path, ignore_errors=True)
        return {"put/s": self.z.put / acc[0]}


class Get(Workload):
    name = "get"
    title = "get: random reads of existing keys"
    metrics = ("get/s",)
    how = {
        "agentstate": "`scope.get(key)`",
        "apsw": "`SELECT value FROM kv WHERE key = ?` + json.loads",
        "apsw_same": "agentstate's `SELECT` (expiry, list items) + json.loads",
        "diskcache": "`cache.get(key)`",
        "sqlitedict": "`d.get(key)` (through its worker thread)",
        "lg_store": '`store.get(("kv",), key).value`',
    }

    def setup(self, sysname):
        h = systems.get(sysname).open(_sysdir(self.root, sysname), "normal")
        try:
            h.bulk_put([(f"g{i:06d}", kv_value(i)) for i in range(self.z.get_keys)])
        finally:
            h.close()
        settle(_sysdir(self.root, sysname))

    def measure(self, sysname, dur, r):
        rng = random.Random(r)
        keys = [(f"g{rng.randrange(self.z.get_keys):06d}",) for _ in range(self.z.get_reads)]
        h = systems.get(sysname).open(_sysdir(self.root, sysname), dur)
        acc = [0.0]
        try:
            yield from _chunked(h.get, keys, self.z.chunks, acc)
            if h.get(keys[-1][0]) is None:
                raise RuntimeError("a read found nothing")
        finally:
            h.close()
        return {"get/s": self.z.get_reads / acc[0]}


class Update(Workload):
    name = "update"
    title = "update: increments of one counter, one process"
    metrics = ("update/s",)
    how = {
        "agentstate": "`scope.update(key, lambda n: n + 1, default=0)`",
        "apsw": "`BEGIN IMMEDIATE; SELECT; (Python +1); INSERT ... ON CONFLICT DO UPDATE; COMMIT`",
        "apsw_same": "agentstate's statements: its `SELECT`; (Python +1); `BEGIN IMMEDIATE`; the "
                     "compare-and-set `UPDATE ... WHERE version = ? RETURNING version`; the change row; `COMMIT`",
        "diskcache": "`cache.incr(key)` (atomic)",
        "sqlitedict": "`d[k] = d.get(k, 0) + 1; d.commit()` (read-modify-write)",
        "lg_store": "`store.get` then `store.put` (read-modify-write)",
    }

    def measure(self, sysname, dur, r):
        key = f"u-{r}"
        h = systems.get(sysname).open(_sysdir(self.root, sysname, dur), dur)
        acc = [0.0]
        try:
            yield from _chunked(h.incr, [(key,)] * self.z.update, self.z.chunks, acc)
            final = h.counter(key)
        finally:
            h.close()
        if final != self.z.update:
            raise RuntimeError(f"counter is {final}, expected {self.z.update}")
        return {"update/s": self.z.update / acc[0]}


def _contention_worker(conn: Any, barrier: Any) -> None:
    """A long-lived spawned process: open, wait at the barrier, increment, report."""
    while True:
        task = conn.recv()
        if task is None:
            return
        sysname, path, dur, key, n = task
        h, err = None, None
        try:
            h = systems.get(sysname).open(path, dur)
        except BaseException as e:  # still meet the others at the barrier
            err = f"{type(e).__name__}: {e}"
        try:
            barrier.wait(timeout=300)
        except Exception as e:
            conn.send((0.0, 0.0, n, f"barrier: {e!r}"))
            continue
        t0 = time.perf_counter()
        exc, first = 0, err
        if h is None:
            exc = n
        else:
            for _ in range(n):
                try:
                    h.incr(key)
                except Exception as e:
                    exc += 1
                    first = first or f"{type(e).__name__}: {e}"
        t1 = time.perf_counter()
        try:
            if h is not None:
                h.close()
        except Exception as e:
            exc += 1
            first = first or f"close: {type(e).__name__}: {e}"
        conn.send((t0, t1, exc, first))


class Contention(Workload):
    name = "contention"
    title = "contention: processes incrementing one counter, started together"
    metrics = ("incr/s",)
    how = dict(Update.how)

    def __init__(self, sizes, root):
        super().__init__(sizes, root)
        self.procs: list[Any] = []
        self.pipes: list[Any] = []
        self.barrier: Any = None

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self.barrier = ctx.Barrier(self.z.procs + 1)
        for _ in range(self.z.procs):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_contention_worker, args=(b, self.barrier), daemon=True)
            p.start()
            self.procs.append(p)
            self.pipes.append(a)

    def setup(self, sysname):
        # create the files and schema before the workers race to
        for dur in ("full", "normal"):
            systems.get(sysname).open(_sysdir(self.root, sysname, dur), "normal").close()
        if not self.procs:
            self._start()

    def measure(self, sysname, dur, r):  # not interleaved: it owns the worker processes
        if False:
            yield
        key = f"c-{r}"
        path = _sysdir(self.root, sysname, dur)
        total = self.z.procs * self.z.per_proc
        for a in self.pipes:
            a.send((sysname, path, dur, key, self.z.per_proc))
        self.barrier.wait(timeout=300)
        res = [a.recv() for a in self.pipes]
        exc = sum(x[2] for x in res)
        errors = [x[3] for x in res if x[3]]
        t0, t1 = min(x[0] for x in res), max(x[1] for x in res)
        h = systems.get(sysname).open(path, dur)
        try:
            final = h.counter(key)
        finally:
            h.close()
        return {"incr/s": total / (t1 - t0) if t1 > t0 else float("nan"),
                "_final": final, "_expected": total, "_exceptions": exc,
                "_lost": total - exc - final, "_error": errors[0] if errors else ""}

    def teardown(self):
        for a in self.pipes:
            try:
                a.send(None)
            except Exception:
                pass
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
        self.procs, self.pipes = [], []
        super().teardown()


class Append(Workload):
    name = "append"
    title = "append: one ~300-byte message to a list already holding N items"
    how = {
        "agentstate": "`scope.append(key, [message])`",
        "apsw": "`BEGIN IMMEDIATE; INSERT INTO item SELECT ?, coalesce(max(idx)+1, 0), ? ...; COMMIT`",
        "apsw_same": "agentstate's statements: `BEGIN IMMEDIATE`; read the key's row; `UPDATE` its "
                     "version, length, size; `INSERT` the item; the change row; `COMMIT`",
        "diskcache": "`cache.push(message, prefix=key)` (its own queue append)",
        "sqlitedict": "`lst = d[key]; lst.append(m); d[key] = lst; d.commit()` (whole list rewritten)",
        "lg_store": '`store.get` + `store.put(ns, key, {"items": [...]})` (whole list rewritten)',
        "oai_session": "`session.add_items([message])` (its own append)",
    }

    def metric_names(self):
        return [f"append/s @{n}" for n in self.z.append_lengths]

    def measure(self, sysname, dur, r):
        path = _sysdir(self.root, sysname, dur)
        h = systems.get(sysname).open(path, dur)
        out = {}
        try:
            for n in self.z.append_lengths:
                key = f"l-{r}-{n}"
                h.set_list(key, [message(i) for i in range(n)])
                # closed, checkpointed and synced (settle), then reopened: no
                # system starts its timed appends with the list-building
                # transaction still in its WAL or the filesystem's journal
                h.close()
                settle(path)
                h = systems.get(sysname).open(path, dur)
                yield
                acc = [0.0]
                msgs = [(key, message(n + i)) for i in range(self.z.append_ops)]
                yield from _chunked(h.append, msgs, max(1, self.z.chunks // 2), acc)
                out[f"append/s @{n}"] = self.z.append_ops / acc[0]
        finally:
            h.close()
        return out


class History(Workload):
    name = "history"
    title = "history: write 1 entry + replace a ~2 KB snapshot on a run of N entries; read the last 20"
    how = {
        "agentstate": "`db.runs.write(run_id, [entry], snapshot)`; `db.runs.tail(run_id, 20)`",
        "apsw": "`BEGIN IMMEDIATE; INSERT INTO entry; UPDATE run SET snapshot; COMMIT`; "
                "`SELECT ... ORDER BY seq DESC LIMIT 20`",
        "apsw_same": "agentstate's statements: `BEGIN IMMEDIATE`; read next_seq; `UPDATE run` "
                     "(snapshot, next_seq); `INSERT` the entry (its no-gap trigger); the change row; "
                     "`COMMIT`; the same tail `SELECT`",
        "diskcache": "`with cache.transact(): set(entry key); set(snapshot key)`; 20 `get`s of the "
                     "last seq keys",
        "sqlitedict": "`d[entry key] = e; d[snapshot key] = s; d.commit()`; 20 `d[...]` reads",
        "lg_store": "`store.batch([PutOp(entry), PutOp(snapshot)])` (one transaction); "
                    "`store.batch([GetOp(...)] * 20)` of the last seq keys (`search(ns, limit=20)` "
                    "orders by updated_at, whose ties in the same second give the wrong 20)",
        "lg_saver": "`saver.put(config, checkpoint, ...)`: one checkpoint per step holding the snapshot "
                    "and the entry (the checkpoint chain is the history); `saver.list(config, limit=20)`",
        "oai_session": "`session.add_items([entry])` — entries only, it has no snapshot; "
                       "`session.get_items(limit=20)`",
    }

    def __init__(self, sizes, root):
        super().__init__(sizes, root)
        self.next_seq: dict[tuple[str, int], int] = {}

    def metric_names(self):
        return [f"write/s @{n}" for n in self.z.history_lengths] + [
            f"tail20/s @{n}" for n in self.z.history_lengths]

    def setup(self, sysname):
        full = _sysdir(self.root, sysname, "full")
        h = systems.get(sysname).open(full, "normal")
        try:
            for n in self.z.history_lengths:
                h.run_create(f"h{n}", [entry(s) for s in range(n)], snapshot(n - 1))
                for dur in ("full", "normal"):
                    self.next_seq[sysname, dur, n] = n
        finally:
            h.close()
        # the NORMAL runs get their own copy of the same runs
        shutil.copytree(full, os.path.join(self.root, sysname, "normal"), dirs_exist_ok=True)
        settle(os.path.join(self.root, sysname))

    def measure(self, sysname, dur, r):
        h = systems.get(sysname).open(_sysdir(self.root, sysname, dur), dur)
        out = {}
        try:
            for n in self.z.history_lengths:
                run = f"h{n}"
                h.prepare_run(run)
                s0 = self.next_seq[sysname, dur, n]
                todo = [(run, entry(s), snapshot(s)) for s in range(s0, s0 + self.z.history_ops)]
                acc = [0.0]
                yield from _chunked(h.run_write, todo, max(1, self.z.chunks // 2), acc)
                self.next_seq[sysname, dur, n] = last = s0 + self.z.history_ops
                out[f"write/s @{n}"] = self.z.history_ops / acc[0]
                got = h.run_tail(run, self.z.tail_n, last - 1)
                if len(got) != min(self.z.tail_n, last) or got[-1]["seq"] != last - 1:
                    raise RuntimeError(f"tail gave {len(got)} entries ending at {got[-1] if got else None}")
                rate = [0.0]
                yield from _timebox(lambda: h.run_tail(run, self.z.tail_n, last - 1),
                                    self.z.read_budget, self.z.read_max, rate)
                out[f"tail20/s @{n}"] = rate[0]
        finally:
            h.close()
        return out


class List(Workload):
    name = "list"
    title = "list: keys with a prefix among many keys"
    metrics = ("list/s",)
    how = {
        "agentstate": "`scope.list(prefix)`",
        "apsw": "`SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key`",
        "diskcache": "walk `cache.iterkeys()` (sorted) until past the prefix: no prefix query",
        "sqlitedict": "`[k for k in d.keys() if k.startswith(prefix)]`: no prefix query",
        "lg_store": 'the prefix is a namespace: `store.search(("kv", "k042"), limit=...)` '
                    "(returns the values too; no key-prefix query)",
    }

    @property
    def groups(self) -> int:
        return self.z.list_total // self.z.list_match

    def setup(self, sysname):
        h = systems.get(sysname).open(_sysdir(self.root, sysname), "normal")
        small = {"v": 1, "note": "x" * 40}
        try:
            h.bulk_put([(f"k{g:03d}:{i:05d}", small) for g in range(self.groups)
                        for i in range(self.z.list_match)])
        finally:
            h.close()
        settle(_sysdir(self.root, sysname))

    def measure(self, sysname, dur, r):
        h = systems.get(sysname).open(_sysdir(self.root, sysname), dur)
        rng = random.Random(r)
        try:
            first = h.list_prefix("k001:")
            if len(first) != self.z.list_match:
                raise RuntimeError(f"list gave {len(first)} keys, expected {self.z.list_match}")
            rate = [0.0]
            yield from _timebox(lambda: h.list_prefix(f"k{rng.randrange(self.groups):03d}:"),
                                self.z.read_budget, self.z.read_max, rate)
        finally:
            h.close()
        return {"list/s": rate[0]}


class ColdOpen(Workload):
    """A fresh process opens an existing ~100 MB file and reads once."""

    name = "coldopen"
    title = "cold open: a fresh process opens an existing ~100 MB database and does the first read"
    metrics = ("open+read s",)
    higher_is_better = False
    how = {
        "agentstate": "`agentstate.open(path)` + `scope.get(key)`; data: ~2 KB values",
        "apsw": "`apsw.Connection` + the pragmas + one `SELECT`",
        "diskcache": "`Cache(dir)` + `cache.get(key)`",
        "sqlitedict": "`SqliteDict(file)` + `d[key]`",
        "lg_store": "`SqliteStore(conn).setup()` + `store.get`",
        "lg_saver": "`SqliteSaver(conn).setup()` + `get_tuple(config)`; data: checkpoints of one thread",
        "oai_session": "`SQLiteSession(id, file)` + `get_items(limit=20)`; data: ~2 KB items",
    }

    def __init__(self, sizes, root, cache: str):
        super().__init__(sizes, root)
        self.cache = cache
        self.paths: dict[str, str] = {}
        self.sizes_mb: dict[str, float] = {}

    def _files(self, path: str) -> list[str]:
        return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]

    def setup(self, sysname):
        sysobj = systems.get(sysname)
        n = max(1, self.z.cold_bytes // 2100)
        path = os.path.join(self.cache, f"cold-{sysname}-{self.z.cold_bytes}-{sysobj.data_tag()}")
        done = os.path.join(path, ".complete")
        if not os.path.exists(done):
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
            h = sysobj.open(path, "normal")
            try:
                if sysobj.cold == "kv":
                    for i in range(0, n, 10_000):
                        h.bulk_put([(f"c{j:07d}", big_value(j)) for j in range(i, min(n, i + 10_000))])
                else:
                    big = [{**entry(s), "content": _TEXT[s % 50 : s % 50 + 1900]} for s in range(n)]
                    h.run_create("cold", big, snapshot(n - 1))
            finally:
                h.close()
            open(done, "w").close()
        self.paths[sysname] = path
        self.sizes_mb[sysname] = sum(os.path.getsize(f) for f in self._files(path)) / 2**20

    def what(self, sysname: str) -> str:
        n = max(1, self.z.cold_bytes // 2100)
        return "r:cold" if systems.get(sysname).cold == "run" else f"k:c{n // 2:07d}"

    def measure(self, sysname, dur, r):  # not interleaved: one fresh process at a time
        if False:
            yield
        path = self.paths[sysname]
        evicted = evict(self._files(path))
        p = subprocess.run(
            [sys.executable, "-m", "benchmarks.coldopen", sysname, path, self.what(sysname)],
            capture_output=True, text=True, timeout=300,
            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
        if p.returncode != 0:
            raise RuntimeError((p.stderr.strip().splitlines() or ["failed"])[-1])
        res = json.loads(p.stdout.strip().splitlines()[-1])
        return {"open+read s": res["open_read_s"], "_import_s": res["import_s"],
                "_size_mb": self.sizes_mb[sysname], "_evicted": evicted and res["evicted"]}

    def teardown(self):
        shutil.rmtree(self.root, ignore_errors=True)


def evict(files: list[str]) -> bool:
    """Drop the files' pages from the OS page cache (clean pages only); True if it worked."""
    ok = hasattr(os, "posix_fadvise")
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            if ok:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            ok = False
        finally:
            os.close(fd)
    return ok


WORKLOADS = ("put", "get", "update", "contention", "append", "history", "list", "coldopen")


def make(name: str, sizes: Sizes, root: str, cache: str) -> Workload:
    cls = {"put": Put, "get": Get, "update": Update, "contention": Contention, "append": Append,
           "history": History, "list": List}.get(name)
    if cls is not None:
        return cls(sizes, root)
    return ColdOpen(sizes, root, cache)
