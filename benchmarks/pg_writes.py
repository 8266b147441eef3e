"""PostgreSQL writes on the server: CPU per write beside a bare prepared INSERT, LangGraph's
saver beside ours, and writer processes; the code of a baseline commit in the same run.

    python -m benchmarks.pg_writes                       # writes benchmarks/PG-WRITES.md
    python -m benchmarks.pg_writes --baseline a3058f5    # and the same for that commit, side by side
    python -m benchmarks.pg_writes --quick               # a smoke run (under a minute)

It starts throwaway servers (tests/pgserver.py) as the ``postgres`` user, so that
the CPU time of every process of the server's cluster can be read from /proc:

1. Server CPU per write, fsync off (the flush is the same for every write and
   would blur the ratios), synchronous_commit on: the on-CPU time of every
   process of the cluster (``/proc/PID/schedstat`` of the postmaster and its
   children, plus the CPU of children that exited meanwhile, from the
   postmaster's ``cutime``/``cstime``) around a batch of writes, divided by the
   batch's size. Variants: a bare prepared INSERT of the same row (the floor: the
   row a put writes, into a table of kv's columns with its primary key and
   nothing else, one row per call, psycopg prepared, autocommit), LangGraph's ``PostgresSaver.put``, and agentstate's
   put of a new key, of an existing key, with ``if_version``, an append of one
   item, a batch of a check and two puts, and ``AgentStateSaver.put``.
2. ``AgentStateSaver.put`` beside ``PostgresSaver.put`` with fsync on (durable):
   wall clock per call, the client's CPU and the server's.
3. Writer processes, each putting its own keys for a few seconds (fsync on,
   durability full): puts per second summed over 1 and 8 processes.

Each variant runs in a process of its own (``worker`` below), so that the code
of another commit (``--baseline REV``: ``git archive`` into a temporary folder)
runs beside this one against the same server. Rounds visit the variants in a
fresh random order, one batch each, one at a time; figures are medians over
the rounds. The value is a 200-byte JSON object; the checkpoint workload is
benchmarks/adapter_langgraph.py's (a step counter, a 200-byte message, a 5 KB
context that never changes after the first checkpoint).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

VALUE = {"role": "assistant", "content": "x" * 150, "tokens": 42, "ok": True}
MESSAGE = "The quick brown fox jumps over the lazy dog. " * 4 + "1234567890ab"
CONTEXT = "C" * 5000


# -- the cluster's CPU ----------------------------------------------------------------

class Cluster:
    """The CPU time of every process of one server's cluster, in nanoseconds."""

    def __init__(self, data_dir: str) -> None:
        with open(os.path.join(data_dir, "postmaster.pid")) as f:
            self.pid = int(f.readline())
        self.tick = 1e9 / os.sysconf("SC_CLK_TCK")

    def _children(self) -> list[int]:
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        stat = f.read()
                except OSError:
                    continue
                if int(stat[stat.rindex(")") + 2:].split()[1]) == self.pid:
                    out.append(int(name))
        return out

    def cpu_ns(self) -> float:
        total = 0.0
        for pid in [self.pid, *self._children()]:
            try:
                with open(f"/proc/{pid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except OSError:
                pass  # gone meanwhile: its time is in the postmaster's cutime from now on
        with open(f"/proc/{self.pid}/stat") as f:
            stat = f.read()
        fields = stat[stat.rindex(")") + 2:].split()
        total += (int(fields[13]) + int(fields[14])) * self.tick  # cutime, cstime: exited children
        return total


# -- the variants (run in a worker process) -----------------------------------------------

class Chain:
    """One LangGraph thread, one checkpoint at a time (benchmarks/adapter_langgraph.py)."""

    def __init__(self, thread_id: str) -> None:
        self.thread_id, self.parent, self.step = thread_id, None, 0

    def put(self, saver: Any) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.step += 1
        cp = empty_checkpoint()
        cp["channel_values"] = {"step": self.step, "last": MESSAGE, "context": CONTEXT}
        cp["channel_versions"] = {"step": self.step, "last": self.step, "context": 1}
        new = {"step": self.step, "last": self.step} if self.parent else dict(cp["channel_versions"])
        conf: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        if self.parent:
            conf["checkpoint_id"] = self.parent
        meta = {"source": "loop", "step": self.step, "parents": {}}
        self.parent = saver.put({"configurable": conf}, cp, meta, new)["configurable"]["checkpoint_id"]


def agentstate_writes(db: Any, scope_id: str, thread_id: str) -> dict[str, Any]:
    """The writes measured, on ``db``'s scope app:``scope_id`` (and a checkpoint chain of
    ``thread_id``), each a callable; pg_profile.py measures the same ones."""
    from agentstate.integrations.langgraph import AgentStateSaver

    kv = db.scope("app", scope_id)
    kv.put("e", VALUE)
    kv.append("l", [VALUE])
    state = {"n": 0, "cas": kv.put("c", VALUE), "check": kv.put("k", VALUE)}
    saver, chain = AgentStateSaver(db), Chain(thread_id)

    def put_new() -> None:
        state["n"] += 1
        kv.put(f"n{state['n']}", VALUE)

    def cas() -> None:
        state["cas"] = kv.put("c", VALUE, if_version=state["cas"])

    def batch() -> None:
        state["n"] += 1
        with db.batch() as b:
            s = b.scope("app", kv.id)
            s.check("k", if_version=state["check"])
            s.put(f"a{state['n']}", VALUE, if_version=0)
            s.put(f"b{state['n']}", VALUE, if_version=0)

    return {"put, new key": put_new,
            "put, existing key": lambda: kv.put("e", VALUE),
            "put with if_version": cas,
            "append 1 item": lambda: kv.append("l", [VALUE]),
            "batch: a check and two puts": batch,
            "AgentStateSaver.put": lambda: chain.put(saver)}


def _agentstate_variants(url: str, durability: str) -> dict[str, Any]:
    import agentstate

    db = agentstate.open(url, durability=durability)
    return agentstate_writes(db, f"w{os.getpid()}", f"t{os.getpid()}")


def _floor_variants(url: str) -> dict[str, Any]:
    import psycopg

    c = psycopg.connect(url, autocommit=True, prepare_threshold=0)
    # The row a put writes, in a table of the same columns with the same primary key,
    # and nothing else: no version to keep, no change to record, no lock to take.
    c.execute("CREATE TABLE IF NOT EXISTS floor (kind text COLLATE \"C\", scope_id text COLLATE \"C\", "
              "key text COLLATE \"C\", version bigint, type text, value json, data bytea, "
              "list_id bigint, length bigint, size integer, updated_at timestamptz, "
              "expires_at timestamptz, PRIMARY KEY (kind, scope_id, key))")
    text = json.dumps(VALUE, separators=(",", ":"))
    state = {"n": 0}
    sid = f"w{os.getpid()}"

    def insert() -> None:
        state["n"] += 1
        c.execute("INSERT INTO floor (kind, scope_id, key, version, type, value, size, updated_at) "
                  "VALUES (%s, %s, %s, 1, 'json', %s, %s, clock_timestamp())",
                  ("app", sid, f"n{state['n']}", text, len(text)), prepare=True)

    return {"bare prepared INSERT": insert}


def _langgraph_variants(url: str) -> dict[str, Any]:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    conn = psycopg.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    saver = PostgresSaver(conn)
    saver.setup()
    chain = Chain(f"t{os.getpid()}")
    return {"PostgresSaver.put": lambda: chain.put(saver)}


def _putter_variants(url: str, durability: str) -> dict[str, Any]:
    import agentstate

    db = agentstate.open(url, durability=durability, busy_timeout=60)
    kv = db.scope("agent", f"w{os.getpid()}")
    state = {"n": 0}

    def put() -> None:
        state["n"] += 1
        kv.put(f"k{state['n'] % 100}", VALUE)

    return {"put": put}


def worker(root: str, url: str, kind: str, durability: str) -> None:
    """Commands on stdin, one JSON line each: ["run", name, n] (n calls; answers wall and
    CPU seconds), ["for", name, seconds] (calls until then; answers how many), ["quit"]."""
    sys.path.insert(0, root)
    if kind == "agentstate":
        variants = _agentstate_variants(url, durability)
    elif kind == "floor":
        variants = _floor_variants(url)
    elif kind == "langgraph":
        variants = _langgraph_variants(url)
    else:
        variants = _putter_variants(url, durability)
    out = sys.stdout
    out.write(json.dumps(sorted(variants)) + "\n")
    out.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd[0] == "quit":
            return
        fn = variants[cmd[1]]
        if cmd[0] == "run":
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(cmd[2]):
                fn()
            answer = [time.perf_counter() - t0, time.process_time() - c0]
        else:
            n, end = 0, time.monotonic() + cmd[2]
            while time.monotonic() < end:
                fn()
                n += 1
            answer = [n]
        out.write(json.dumps(answer) + "\n")
        out.flush()


class Worker:
    """A worker process (see ``worker``), running the code under ``root``."""

    def __init__(self, root: str, url: str, kind: str, durability: str = "full") -> None:
        env = {**os.environ, "PYTHONPATH": root}
        self.p = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "worker", root, url, kind, durability],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root, env=env)
        line = self.p.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"the {kind} worker of {root} did not start")
        self.names = json.loads(line)

    def ask(self, *cmd: Any) -> list[float]:
        self.p.stdin.write(json.dumps(cmd) + "\n")  # type: ignore[union-attr]
        self.p.stdin.flush()  # type: ignore[union-attr]
        line = self.p.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError("a worker died")
        return json.loads(line)

    def close(self) -> None:
        try:
            self.ask("quit")
        except (RuntimeError, BrokenPipeError, ValueError):
            pass
        self.p.wait(30)


# -- servers and code trees ---------------------------------------------------------------

def start_server(fsync: bool) -> Any:
    sys.path.insert(0, REPO)
    from tests import pgserver

    bin_dir = pgserver.bindir()
    if bin_dir is None:
        raise SystemExit("no PostgreSQL binaries (apt-get install postgresql)")
    pgserver.sweep(bin_dir)
    settings = pgserver.DURABLE + ("" if fsync else " -c fsync=off -c full_page_writes=off")
    return pgserver.Server(bin_dir, settings=settings).start()


def fresh_url(server: Any) -> str:
    from tests import pgserver

    return pgserver.schema_url(server.admin_url, pgserver.new_schema(server.admin_url))


def baseline_tree(rev: str, folder: str) -> str:
    """The repository at ``rev``, written out under ``folder``; its path."""
    root = os.path.join(folder, "baseline")
    os.makedirs(root)
    archive = subprocess.run(["git", "-C", REPO, "archive", rev], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", root], input=archive.stdout, check=True)
    return root


def head_rev(rev: str = "HEAD") -> str:
    return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", rev], capture_output=True,
                          text=True, check=True).stdout.strip()


# -- the measurements ---------------------------------------------------------------------

def per_write(server: Any, trees: dict[str, str], rounds: int, n: int) -> dict[str, Any]:
    """{(tree, variant): {"cpu": [µs], "wall": [µs], "client": [µs]}} over the rounds."""
    cluster = Cluster(server.data)
    workers: list[tuple[str, Worker]] = []
    try:
        workers.append(("", Worker(REPO, fresh_url(server), "floor")))
        workers.append(("", Worker(REPO, fresh_url(server), "langgraph")))
        for label, root in trees.items():
            workers.append((label, Worker(root, fresh_url(server), "agentstate")))
        jobs = [(label, w, name) for label, w in workers for name in w.names]
        for _label, w, name in jobs:  # warm: plans prepared, caches filled
            w.ask("run", name, max(5, n // 5))
        with __import__("psycopg").connect(server.admin_url, autocommit=True) as c:
            c.execute("CHECKPOINT")
        out: dict[tuple[str, str], dict[str, list[float]]] = {}
        for _ in range(rounds):
            for label, w, name in random.sample(jobs, len(jobs)):
                c0 = cluster.cpu_ns()
                wall, client = w.ask("run", name, n)
                cpu = cluster.cpu_ns() - c0
                got = out.setdefault((label, name), {"cpu": [], "wall": [], "client": []})
                got["cpu"].append(cpu / n / 1e3)
                got["wall"].append(wall / n * 1e6)
                got["client"].append(client / n * 1e6)
        return out
    finally:
        for _label, w in workers:
            w.close()


def throughput(server: Any, trees: dict[str, str], procs: list[int], seconds: float,
               runs: int) -> dict[tuple[str, int], float]:
    """{(tree, processes): puts per second summed over the processes} (median of runs)."""
    out: dict[tuple[str, int], list[float]] = {}
    order = [(label, k) for label in trees for k in procs] * runs
    random.shuffle(order)
    for label, k in order:
        url = fresh_url(server)
        ws = [Worker(trees[label], url, "putter") for _ in range(k)]
        try:
            for w in ws:
                w.ask("run", "put", 5)
            for w in ws:  # all at once: each worker starts when it reads its line
                w.p.stdin.write(json.dumps(["for", "put", seconds]) + "\n")  # type: ignore[union-attr]
            for w in ws:
                w.p.stdin.flush()  # type: ignore[union-attr]
            total = sum(json.loads(w.p.stdout.readline())[0] for w in ws)  # type: ignore[union-attr]
        finally:
            for w in ws:
                w.close()
        out.setdefault((label, k), []).append(total / seconds)
    return {key: statistics.median(v) for key, v in out.items()}


# -- the report ---------------------------------------------------------------------------

def _med(xs: list[float]) -> float:
    return statistics.median(xs)


def _spread(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0], xs[0], xs[0]]
    return f"{q[0]:,.0f}–{q[2]:,.0f}"


ORDER = ["put, new key", "put, existing key", "put with if_version", "append 1 item",
         "batch: a check and two puts", "AgentStateSaver.put"]
TARGETS = {"batch: a check and two puts": 3.5, "AgentStateSaver.put": None}


def report_cpu(res: dict[tuple[str, str], dict[str, list[float]]], trees: list[str]) -> list[str]:
    floor = _med(res[("", "bare prepared INSERT")]["cpu"])
    lg = _med(res[("", "PostgresSaver.put")]["cpu"])
    lines = ["| write | " + " | ".join(
        f"{t}: server CPU µs (p25–p75) | {t}: × INSERT" for t in trees) + " | target |",
        "|---|" + "---:|---:|" * len(trees) + "---:|"]
    lines.append("| bare prepared INSERT (the floor) | " + " | ".join(
        f"{floor:,.0f} ({_spread(res[('', 'bare prepared INSERT')]['cpu'])}) | 1.00×" for _ in trees)
        + " | |")
    for name in ORDER:
        cells = []
        for t in trees:
            xs = res[(t, name)]["cpu"]
            cells.append(f"{_med(xs):,.0f} ({_spread(xs)}) | **{_med(xs) / floor:.2f}×**")
        target = TARGETS.get(name, 2.5)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'≤ %.1f×' % target if target else ''} |")
    lines.append("| PostgresSaver.put (LangGraph) | " + " | ".join(
        f"{lg:,.0f} ({_spread(res[('', 'PostgresSaver.put')]['cpu'])}) | {lg / floor:.2f}×" for _ in trees)
        + " | |")
    lines += ["", "Wall clock and the client's CPU per call (µs, medians), same run:", "",
              "| write | " + " | ".join(f"{t}: wall | {t}: client CPU" for t in trees) + " |",
              "|---|" + "---:|---:|" * len(trees)]
    for label, name in [("", "bare prepared INSERT"), *[(None, n) for n in ORDER],
                        ("", "PostgresSaver.put")]:
        cells = []
        for t in trees:
            r = res[(t if label is None else label, name)]
            cells.append(f"{_med(r['wall']):,.0f} | {_med(r['client']):,.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def report_saver(res: dict[tuple[str, str], dict[str, list[float]]], trees: list[str]) -> list[str]:
    lg = res[("", "PostgresSaver.put")]
    lines = ["| | wall µs | client CPU µs | server CPU µs | PostgresSaver.put / this, wall | "
             "PostgresSaver.put / this, server CPU |", "|---|---:|---:|---:|---:|---:|",
             f"| PostgresSaver.put (LangGraph) | {_med(lg['wall']):,.0f} | {_med(lg['client']):,.0f} | "
             f"{_med(lg['cpu']):,.0f} | 1.00× | 1.00× |"]
    for t in trees:
        r = res[(t, "AgentStateSaver.put")]
        lines.append(f"| AgentStateSaver.put, {t} | {_med(r['wall']):,.0f} | {_med(r['client']):,.0f} | "
                     f"{_med(r['cpu']):,.0f} | **{_med(lg['wall']) / _med(r['wall']):.2f}×** | "
                     f"**{_med(lg['cpu']) / _med(r['cpu']):.2f}×** |")
    f = res[("", "bare prepared INSERT")]
    lines.append(f"| bare prepared INSERT | {_med(f['wall']):,.0f} | {_med(f['client']):,.0f} | "
                 f"{_med(f['cpu']):,.0f} | | |")
    return lines


READING = """## Reading the figures

- What changed (issue 38): a write of a key outside `transaction()` is one prepared
  statement with bound parameters (agentstate/backends/postgres/lean.py): the upsert,
  compare-and-set, append or delete, its change row in a CTE of the same statement, and
  two flags that ask for the wake-up (only while a watcher holds its lease) and for the
  purge (only when something is due, asked every 16th write) after the COMMIT. A batch
  is one statement too. Before, every write was a PL/pgSQL function called with its
  arguments written in as literals (parsed and planned on every call), its changes
  staged by further functions, a NOTIFY transaction after every write and a purge
  attempt every 16th write; the CHECK constraints of kv were rebuilt for every statement
  that wrote it.
- Where the rest goes, statement by statement: benchmarks/PG-PROFILE.md. Every write
  must write its row (an upsert costs more than the floor's plain INSERT: the conflict
  check and the lock of the row it updates) and its change row (about one INSERT more),
  in a statement whose fixed cost (a round trip, a transaction and its commit, about
  half the floor) it pays once; an append also writes its item (one more INSERT), a
  batch two rows, two change rows and a row lock for its check. Each change is also
  numbered once by whoever reads the feed (here, with nobody reading, by the writers
  about once a second, counted here since every process of the cluster is).
- AgentStateSaver.put is one statement: the parent's check (a row lock, held to the
  commit: a parent deleted meanwhile would take bytes the record points at), the
  record (its JSON text as bytes) and its change row; PostgresSaver.put is one INSERT
  of its row. The check and the change row are what the difference is made of.
- Writer processes share the machine's two cores with their clients and with other
  jobs: the processes' rows move with the load of the machine more than anything else.
""".split("\n")


def machine(server: Any) -> list[str]:
    import psycopg

    with psycopg.connect(server.admin_url) as c:
        version = c.execute("SHOW server_version").fetchone()[0]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), platform.processor())
    return [f"- {os.cpu_count()} cores ({cpu}), {platform.system()} {platform.release()}, "
            f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())} at the start "
            "(the machine is shared: compare within a table, variants measured side by side)",
            f"- Python {platform.python_version()}, psycopg {psycopg.__version__}, PostgreSQL {version} "
            "on 127.0.0.1 (TCP), shared_buffers and the rest at their defaults"]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(*sys.argv[2:6])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", help="a commit to measure beside this checkout")
    ap.add_argument("--quick", action="store_true", help="a smoke run")
    ap.add_argument("--out", default=HERE, help="folder of PG-WRITES.md")
    ap.add_argument("--parts", default="1,2,3", help="which parts to run")
    args = ap.parse_args()
    rounds, n, seconds, runs = (3, 10, 1.0, 1) if args.quick else (25, 50, 4.0, 3)
    procs = [1, 2] if args.quick else [1, 8]
    parts = {int(p) for p in args.parts.split(",")}
    folder = tempfile.mkdtemp(prefix="agentstate-pgw-")
    here = f"this checkout ({head_rev()})"
    trees = {}
    if args.baseline:
        trees[f"baseline ({head_rev(args.baseline)})"] = baseline_tree(args.baseline, folder)
    trees[here] = REPO
    started = time.time()
    lines = ["# PostgreSQL writes on the server", "",
             f"`python -m benchmarks.pg_writes{' --baseline ' + args.baseline if args.baseline else ''}"
             f"{' --quick' if args.quick else ''}`, {datetime.date.today().isoformat()}. "
             "See the module docstring for the method.", ""]
    try:
        if 1 in parts:
            server = start_server(fsync=False)
            try:
                lines += ["## Machine", "", *machine(server), ""]
                res = per_write(server, trees, rounds, n)
            finally:
                server.stop()
            lines += ["## 1. Server CPU per write, fsync off", "",
                      f"Every process of the server's cluster, µs per write; median of {rounds} "
                      f"batches of {n} (p25–p75); × INSERT = the write's CPU over the bare "
                      "prepared INSERT's, measured in the same rounds.", "",
                      *report_cpu(res, list(trees)), ""]
            print("\n".join(lines), flush=True)
        if 2 in parts:
            server = start_server(fsync=True)
            try:
                res = per_write(server, trees, rounds, n)
            finally:
                server.stop()
            lines += ["## 2. AgentStateSaver.put beside PostgresSaver.put, fsync on", "",
                      f"Medians of {rounds} batches of {n} calls, µs per call; the ratio is "
                      "LangGraph's figure over ours (1.0 or more: ours is as fast or faster).", "",
                      *report_saver(res, list(trees)), ""]
            print("\n".join(lines[-8:]), flush=True)
        if 3 in parts:
            lines += ["## 3. Writer processes, durability full", "",
                      f"Puts per second summed over the processes ({seconds:g} s each, each its own "
                      f"100 keys, a 200-byte JSON value; the median of {runs} runs, in a random "
                      "order). The clients and the server share the machine's cores. With fsync "
                      "off the machine's CPU is the limit (what a server with a fast disk sees); "
                      "with fsync on, the disk's flushes (this disk's vary from 0.2 to 3 ms).", "",
                      "| server | code | " + " | ".join(f"{k} process{'es' if k > 1 else ''}" for k in procs)
                      + " |", "|---|---|" + "---:|" * len(procs)]
            for fsync in (False, True):
                server = start_server(fsync=fsync)
                try:
                    rates = throughput(server, trees, procs, seconds, runs)
                finally:
                    server.stop()
                label = "fsync on" if fsync else "fsync off"
                for t in trees:
                    lines.append(f"| {label} | {t} | " + " | ".join(f"{rates[(t, k)]:,.0f}" for k in procs)
                                 + " |")
                if len(trees) == 2:
                    a, b = list(trees)
                    lines.append(f"| {label} | this / baseline | " + " | ".join(
                        f"**{rates[(b, k)] / rates[(a, k)]:.2f}×**" for k in procs) + " |")
                print("\n".join(lines[-3:]), flush=True)
            lines.append("")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    lines += READING
    lines.append(f"Run time {time.time() - started:,.0f} s; load average at the end "
                 f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}.")
    path = os.path.join(args.out, "PG-WRITES.md")
    os.makedirs(args.out, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
