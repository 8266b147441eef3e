"""The PostgreSQL backend, measured: beside raw psycopg, and with 1, 4 and 8 writer processes.

    python -m benchmarks.postgres            # the full run (~3 min), writes benchmarks/POSTGRES.md
    python -m benchmarks.postgres --quick    # a smoke run (under a minute)
    python -m benchmarks.postgres --out DIR  # where POSTGRES.md goes
    DATABASE_URL=postgresql://... python -m benchmarks.postgres   # on a server of yours

Without ``DATABASE_URL`` it starts a throwaway server (tests/pgserver.py) with
PostgreSQL's default durability (fsync on), on this machine.

1. Per operation: agentstate on PostgreSQL beside raw psycopg sending the very
   statements the backend sends (the same server functions, with the same
   arguments, on one held connection; values through json.dumps and
   json.loads): a put or an append as the one prepared statement the backend
   sends (``agentstate/backends/postgres/lean.py``: the write and its change
   row, whose flags ask for the wake-up and the purge after the COMMIT); the
   other writes as one simple query with their arguments written in as
   literals, ``BEGIN; SELECT kv_pop(...); COMMIT; SELECT feed_notify(false)``;
   reads prepared; a read of the feed numbers it first (``feed_sequence()``,
   sent with the snapshot's BEGIN). On the same server in the same run, taking
   turns. Both with
   synchronous_commit off, so that what is compared is the client's work and
   round trips, not the jitter of the disk's flushes (part 2 has those).
   Median µs per operation over the repetitions; ratio = raw / agentstate
   (1.0: no overhead; the target is >= 0.7).
2. Throughput: 1, 4 and 8 processes, each putting its own keys for a few
   seconds: PostgreSQL with durability "full", the same with one more process
   following the feed with watch() (so numbering it as it grows), "normal"
   (synchronous_commit off: no wait for the disk, so the machine's CPU
   ceiling), "full" with the change feed off (so the difference is what
   recording the changes and the wake-ups cost), and an SQLite file ("full").
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import apsw  # noqa: E402
import psycopg  # noqa: E402
from psycopg.types.numeric import Int8Dumper  # noqa: E402

import agentstate  # noqa: E402
from agentstate.backends.postgres import lean  # noqa: E402
from tests import pgserver  # noqa: E402

ALICE = agentstate.Principal("alice")
VALUE = {"role": "assistant", "content": "x" * 150, "tokens": 42, "ok": True}
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


# -- 1. per operation -----------------------------------------------------------------

def _q(text: str) -> str:
    """A string literal (standard_conforming_strings is on)."""
    return "'" + text.replace("'", "''") + "'"


def _arr(texts: list[str]) -> str:
    return "ARRAY[" + ",".join(map(_q, texts)) + "]::text[]" if texts else "'{}'"


def _n(v) -> str:
    return "NULL" if v is None else str(v)


class Raw:
    """What a careful user of psycopg would do to send the backend's statements: a write and
    its wake-up in one round trip (arguments written in by hand, the cheapest way), reads
    prepared."""

    WRITE = "BEGIN; {}; COMMIT; SELECT feed_notify(false)"
    BLOCK = "BEGIN; SELECT set_config('agentstate.block', 'on', true)"
    CLOSE = "SELECT feed_close(); COMMIT; SELECT feed_notify(false)"

    TURN_COLS = ("t.id, t.session_id, t.n, t.status, t.input::text, t.request::text, "
                 "t.decision::text, t.result::text, t.error, "
                 "extract(epoch FROM t.lease_until)::float8, iso_utc(t.created_at), "
                 "iso_utc(t.updated_at), t.lease")

    def __init__(self, url: str) -> None:
        self.c = psycopg.connect(url, autocommit=True)
        self.c.adapters.register_dumper(int, Int8Dumper)
        self.c.execute("SET synchronous_commit = off; SET TimeZone = 'UTC'; "
                       "SET standard_conforming_strings = on")
        self.version = 0
        self.seq = 0

    def get(self, key: str):
        row = self.c.execute(
            """SELECT type, value::text, data, version,
                      CASE WHEN type = 'list' THEN (SELECT string_agg(item::text, ',' ORDER BY idx)
                        FROM list_item WHERE list_id = kv.list_id) END
               FROM kv WHERE kind = %(kind)s AND scope_id = %(sid)s AND key = %(key)s
                 AND (expires_at IS NULL OR expires_at > now())""",
            {"kind": "app", "sid": "raw", "key": key}).fetchone()
        return json.loads(row[1])

    def _write(self, statement: str):
        cur = self.c.execute(self.WRITE.format(statement), prepare=False)
        cur.nextset()
        return cur.fetchone()

    def _lean(self, query: str, params: dict):
        """A lean statement, prepared; the wake-up or purge after it when its flags ask."""
        row = self.c.execute(query, params, prepare=True).fetchone()
        if row[-1] or row[-2]:
            self.c.execute("SELECT feed_after(%s, %s)", (row[-2], row[-1]), prepare=True)
        return row[:-2]

    def put(self, key: str, value, if_version=None) -> int:
        text = _dumps(value)
        cas = if_version is not None and if_version > 0
        return self._lean(lean._put_text(cas, False), lean.put_params(
            "app", "raw", key, "json", text, len(text.encode()), if_version, None))[0]

    def append(self, key: str, items: list):
        texts = [_dumps(x) for x in items]
        size = 2 + sum(len(t.encode()) for t in texts) + len(texts) - 1
        return self._lean(_APPEND, {"kind": "app", "sid": "raw", "key": key, "n": len(texts),
                                    "size": size, "items": "[" + ",".join(texts) + "]", "ttl": None})

    def pop(self, key: str):
        items, _version = self._write(f"SELECT o_items, o_version FROM kv_pop('app', 'raw', {_q(key)}, 1)")
        return json.loads("[" + ",".join(items) + "]")

    def run_write(self, run_id: str, entries: list, create: bool = False):
        texts = [_dumps(e) for e in entries]
        seqs = "ARRAY[" + ",".join(str(e["seq"]) for e in entries) + "]::int8[]" if entries else "'{}'"
        return self._write(f"SELECT o_end, o_differs FROM run_write({_q(run_id)}, {seqs}, {_arr(texts)}, "
                           f"NULL, {'true' if create else 'false'})")

    def tail(self, run_id: str, n: int):
        rows = self.c.execute("SELECT seq, entry::text FROM run_entry WHERE run_id = %s "
                              "ORDER BY seq DESC LIMIT %s", (run_id, n)).fetchall()
        rows.reverse()
        return json.loads("[" + ",".join(r[1] for r in rows) + "]")

    def changes(self, since: int, limit: int):
        c = self.c
        c.execute("BEGIN ISOLATION LEVEL READ COMMITTED; SELECT feed_sequence(); COMMIT; "
                  "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        c.execute("SELECT (SELECT last FROM feed_head), (SELECT value FROM setting WHERE name = "
                  "'feed_retention'), (SELECT min(seq) FROM change)").fetchone()
        rows = c.execute("SELECT seq, at, topic, op, kind, scope_id, key, version, start, count "
                         "FROM change WHERE seq > %(since)s ORDER BY seq LIMIT %(limit)s",
                         {"since": since, "limit": limit}).fetchall()
        c.execute("COMMIT")
        return rows

    def turn(self, session_id: str, turn_id: str) -> None:
        """start_turn then finish: the statements of each, in its transaction."""
        c = self.c
        c.execute(self.BLOCK)
        c.execute("SELECT id, owner, iso_utc(created_at), metadata::text FROM session WHERE id = %s",
                  (session_id,)).fetchone()
        c.execute(f"SELECT {self.TURN_COLS} FROM turn_start(%s, %s, %s, %s, %s) t",
                  (turn_id, session_id, "running", None, 60.0)).fetchone()
        c.execute(self.CLOSE)
        c.execute(self.BLOCK)
        c.execute(f"SELECT {self.TURN_COLS} FROM turn t WHERE id = %s", (turn_id,)).fetchone()
        c.execute("SELECT id, owner, iso_utc(created_at), metadata::text FROM session WHERE id = %s",
                  (session_id,)).fetchone()
        c.execute(f"SELECT {self.TURN_COLS} FROM turn_move(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) t",
                  (turn_id, ["running", "resuming"], "finished", None, "finish", ["result"], None,
                   None, None, None)).fetchone()
        c.execute(self.CLOSE)


class _Once:
    """What lean.append asks its connection for: the statement's text, built once."""

    tidy = False

    def lean(self, query: str, params: dict):
        self.query = query
        return (0, 0)


_ONCE = _Once()
lean.append(_ONCE, "app", "raw", "k", ["1"], 3, None)
_APPEND = _ONCE.query


def _timed(fn: Callable[[int], object], n: int) -> float:
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n * 1e6


def per_operation(url: str, n: int, repeats: int) -> list[tuple[str, float, float]]:
    db = agentstate.open(url, durability="normal")
    raw = Raw(url)
    kv = db.scope("app", "as")
    for k in ("g", "p", "c"):
        kv.put(k, VALUE)
        raw.put(k, VALUE)
    kv.put("u", 0)
    raw.put("u", 0)
    total = n * (repeats + 1)
    for i in range(0, total, 500):  # lists to pop from
        kv.append("pl", [VALUE] * min(500, total - i))
        raw.append("pl", [VALUE] * min(500, total - i))
    db.runs.write("r", [], None, create=True)
    raw.run_write("rr", [], create=True)
    sid = db.sessions.create(ALICE).id
    raw_sid = db.sessions.create(ALICE).id
    cas = {"as": kv.get_versioned("c").version, "raw": raw.put("c", VALUE)}
    seqs = {"as": 0, "raw": 0}

    def as_cas(i: int) -> None:
        cas["as"] = kv.put("c", VALUE, if_version=cas["as"])

    def raw_cas(i: int) -> None:
        cas["raw"] = raw.put("c", VALUE, if_version=cas["raw"])

    def as_run(i: int) -> None:
        db.runs.write("r", [{"seq": seqs["as"], "type": "tool_call", "content": "x" * 100}], None)
        seqs["as"] += 1

    def raw_run(i: int) -> None:
        raw.run_write("rr", [{"seq": seqs["raw"], "type": "tool_call", "content": "x" * 100}])
        seqs["raw"] += 1

    def raw_update(i: int) -> None:
        row = raw.c.execute("SELECT value::text, version FROM kv WHERE kind = 'app' AND scope_id = 'raw' "
                            "AND key = 'u' AND (expires_at IS NULL OR expires_at > now())").fetchone()
        raw.put("u", json.loads(row[0]) + 1, if_version=row[1])

    def as_turn(i: int) -> None:
        db.sessions.start_turn(sid, ALICE).finish()

    def raw_turn(i: int) -> None:
        raw.turn(raw_sid, f"t-raw-{time.monotonic_ns()}")

    ops: list[tuple[str, Callable[[int], object], Callable[[int], object]]] = [
        ("get", lambda i: kv.get("g"), lambda i: raw.get("g")),
        ("put", lambda i: kv.put("p", VALUE), lambda i: raw.put("p", VALUE)),
        ("put if_version (CAS)", as_cas, raw_cas),
        ("update (read, then CAS)", lambda i: kv.update("u", lambda v: v + 1), raw_update),
        ("append 1 item", lambda i: kv.append("l", [VALUE]), lambda i: raw.append("l", [VALUE])),
        ("pop 1 item", lambda i: kv.pop("pl"), lambda i: raw.pop("pl")),
        ("runs.write 1 entry", as_run, raw_run),
        ("runs.tail 10", lambda i: db.runs.tail("r", 10), lambda i: raw.tail("rr", 10)),
        ("changes (100 rows)", lambda i: db.changes(0, limit=100), lambda i: raw.changes(0, 100)),
        ("turn: start + finish", as_turn, raw_turn),
    ]
    out = []
    for name, mine, theirs in ops:
        _timed(mine, 10)  # warm: plans prepared on both
        _timed(theirs, 10)
        a, r = [], []
        for _ in range(repeats):
            a.append(_timed(mine, n))
            r.append(_timed(theirs, n))
        out.append((name, statistics.median(a), statistics.median(r)))
    raw.c.close()
    db.close()
    return out


# -- 2. throughput with processes -------------------------------------------------------

def _putter(target: str, durability: str, who: int, seconds: float, start, results) -> None:
    # A long busy_timeout: 8 processes opening a new SQLite file at once on a loaded machine
    # can wait more than the default for its lock (setup, not measured).
    db = agentstate.open(target, durability=durability, busy_timeout=60)
    kv = db.scope("agent", f"w{who}")
    kv.put("k0", VALUE)
    start.wait()
    t0, n = time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        kv.put(f"k{n % 100}", VALUE)
        n += 1
    results.put(n / (time.monotonic() - t0))
    db.close()


def _watcher(target: str, start, stop, results) -> None:
    """Follows the whole feed with watch() (so it numbers it as it goes) until told to stop."""
    db = agentstate.open(target)
    since = db.last_change()
    start.wait()
    seen = 0
    while not stop.is_set():
        got = db.watch(since, timeout=0.5)
        if got:
            seen += len(got)
            since = got[-1].seq
    results.put(seen)
    db.close()


def throughput(target: str, durability: str, procs: int, seconds: float,
               watch: bool = False) -> float:
    """Puts per second summed over ``procs`` processes (and, if ``watch``, one more process
    following the feed)."""
    ctx = mp.get_context("spawn")
    start, stop, results, watched = ctx.Event(), ctx.Event(), ctx.Queue(), ctx.Queue()
    ps = [ctx.Process(target=_putter, args=(target, durability, w, seconds, start, results))
          for w in range(procs)]
    if watch:
        ps.append(ctx.Process(target=_watcher, args=(target, start, stop, watched)))
    for p in ps:
        p.start()
    time.sleep(1.5 + 0.2 * procs)  # all started and open
    start.set()
    rate = sum(results.get(timeout=seconds + 300) for _ in range(procs))
    stop.set()
    if watch:
        assert watched.get(timeout=60) > 0
    for p in ps:
        p.join(60)
    return rate


# -- the report ------------------------------------------------------------------------

def machine(url: str) -> list[str]:
    with psycopg.connect(url) as c:
        server = c.execute("SHOW server_version").fetchone()[0]
        settings = dict(c.execute("SELECT name, setting FROM pg_settings WHERE name IN "
                                  "('fsync', 'synchronous_commit', 'shared_buffers', "
                                  "'wal_sync_method')").fetchall())
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    return [f"- {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, "
            f"load average {os.getloadavg()[0]:.1f} at the start (the machine is shared)",
            f"- Python {platform.python_version()}, psycopg {psycopg.__version__}, "
            f"PostgreSQL {server} on 127.0.0.1 (TCP), "
            + ", ".join(f"{k}={v}" for k, v in sorted(settings.items())),
            f"- SQLite {apsw.sqlite_lib_version()} (apsw), "
            "a file on the same disk"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run")
    ap.add_argument("--out", default=HERE, help="folder of POSTGRES.md")
    args = ap.parse_args()
    n, repeats, seconds, runs = (20, 1, 0.3, 1) if args.quick else (300, 9, 3.0, 3)
    server = None
    admin = os.environ.get("DATABASE_URL")
    if not admin:
        bin_dir = pgserver.bindir()
        if bin_dir is None:
            raise SystemExit("no PostgreSQL binaries (apt-get install postgresql) and no DATABASE_URL")
        pgserver.sweep(bin_dir)
        server = pgserver.Server(bin_dir, settings=pgserver.DURABLE).start()
        admin = server.admin_url
    schemas: list[str] = []

    def fresh() -> str:
        schemas.append(pgserver.new_schema(admin))
        return pgserver.schema_url(admin, schemas[-1])

    try:
        lines = ["# The PostgreSQL backend, measured", "",
                 f"`python -m benchmarks.postgres{' --quick' if args.quick else ''}`, "
                 f"{datetime.date.today().isoformat()}.", "", "## Machine", "", *machine(admin), ""]
        ops = per_operation(fresh(), n, repeats)
        lines += ["## 1. Per operation: agentstate beside raw psycopg (same statements, same server)",
                  "", f"Median of {repeats} repetitions of {n} operations each, taking turns; µs per "
                  "operation; both with synchronous_commit off (the client's work and round trips, "
                  "without the disk's flush jitter). Ratio = raw / agentstate (1.0: no overhead; "
                  "target ≥ 0.7).", "",
                  "| operation | agentstate µs | raw psycopg µs | ratio |", "|---|---:|---:|---:|"]
        lines += [f"| {name} | {a:,.0f} | {r:,.0f} | **{r / a:.2f}×** |" for name, a, r in ops]
        lines += ["", "One round trip per call for get, put, CAS, append, pop, run write and tail: "
                  "a put, a CAS and an append are one prepared statement each (the write and its "
                  "change row; a second round trip only when someone watches the feed, for the "
                  "wake-up, or now and then for the purge), a pop or a run write one simple query, "
                  "`BEGIN; SELECT kv_pop(...); COMMIT; SELECT feed_notify(false)`, its arguments "
                  "written in as literals; update is a read and a CAS; changes numbers "
                  "the committed changes and opens a repeatable-read snapshot in one round trip "
                  "(`BEGIN; SELECT feed_sequence(); COMMIT; BEGIN ...`), then two reads and COMMIT; "
                  "a turn's start and finish each check access first, so each is a transaction of a "
                  "few statements.", ""]
        counts = [1, 2] if args.quick else [1, 4, 8]
        off = fresh()
        with agentstate.open(off) as db:
            db.set_setting("feed_retention", 0)
        tmp = tempfile.mkdtemp(prefix="agentstate-bench-")
        configs = [("PostgreSQL, full", lambda: fresh(), "full", False),
                   ("PostgreSQL, full, a process watching the feed", lambda: fresh(), "full", True),
                   ("PostgreSQL, normal (synchronous_commit off)", lambda: fresh(), "normal", False),
                   ("PostgreSQL, full, change feed off", lambda: off, "full", False),
                   ("SQLite file, full", lambda: os.path.join(tmp, f"t{time.monotonic_ns()}.db"), "full",
                    False)]
        if args.quick:
            configs = [configs[0], configs[1], configs[4]]
        lines += ["## 2. Throughput: writer processes, each putting its own keys", "",
                  f"Puts per second summed over the processes ({seconds:g} s each; a 200-byte "
                  f"JSON value, 100 keys per process); the median of {runs} runs. The clients "
                  "and the server share this machine's cores.", "",
                  "| store | " + " | ".join(f"{c} process{'es' if c > 1 else ''}" for c in counts)
                  + f" | {counts[-1]} vs 1 |", "|---|" + "---:|" * (len(counts) + 1)]
        for label, make, durability, watch in configs:
            rates = [statistics.median(throughput(make(), durability, c, seconds, watch)
                                       for _ in range(runs)) for c in counts]
            lines.append(f"| {label} | " + " | ".join(f"{r:,.0f}" for r in rates)
                         + f" | {rates[-1] / rates[0]:.2f}× |")
            print(lines[-1], flush=True)
        lines += ["", "No lock is shared by all PostgreSQL writers: a write locks its own rows, adds its "
                  "changes to the feed unnumbered and commits; its NOTIFY, when a process watches, "
                  "follows in a transaction of its own that is not flushed. So the commits of several processes share the "
                  "server's WAL flushes (group commit), and durable throughput grows with the writers "
                  "until the cores are busy: the row at durability normal, which never waits for the "
                  "disk, is that ceiling. Readers number the feed (one at a time, under an advisory "
                  "lock, a durable commit of their own) and never hold up a writer's locks; a watcher "
                  "woken by every write numbers each change as it comes, a flush the next commit may "
                  "queue behind, so it costs most with one writer and least with many (each "
                  "numbering then covers several changes). With the feed off a write adds no change "
                  "and sends no NOTIFY. SQLite has one writer at a time. The clients, the server and "
                  "other jobs share 2 cores: 8 processes cannot go 8 times as fast.", ""]
        path = os.path.join(args.out, "POSTGRES.md")
        os.makedirs(args.out, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write("\n".join(lines))
        print("\n".join(lines))
        print(f"wrote {path}")
    finally:
        if server is not None:
            server.stop()
        else:
            for s in schemas:
                pgserver.drop_schema(admin, s)


if __name__ == "__main__":
    main()
