"""What value history (SPEC §17) adds to a lean PostgreSQL put, part by part.

    python -m benchmarks.pg_history_cost          # writes benchmarks/PG-HISTORY-COST.md
    python -m benchmarks.pg_history_cost --quick  # a smoke run

The put of an existing key (lean.py's one prepared statement), as shipped and with
parts of it taken out, each on a store of its own on one throwaway server (fsync off,
as in PG-WRITES.md part 1): the CPU per put of the backend that runs it
(``/proc/PID/schedstat``: the cluster's other processes, counted in PG-WRITES.md, add
noise here and little else), rounds visiting the variants in a fresh random order, medians.

- the statement before history (from ``git show BEFORE:agentstate/backends/postgres/
  lean.py``: no ``h``, ``b``, ``n``, ``k``, and no xmin test), on a store with history off,
  where it is a correct put;
- the statement as shipped, history on (the default) and off;
- as shipped with ``h`` (the two settings) read by two index probes instead of one scan;
- as shipped without ``k`` (the before-image's row), then also without ``b`` and the
  xmin test, then also without ``n`` (the change's id): on a store with history on, where
  they keep less than the contract asks (they measure a part; they are not a way to write);
- a history-off shape: the statement before history plus a test that history is off
  (``h``), which does nothing (and leaves the write to the function) when it is on (checked
  here on a store with history on). A prototype: it guards the update of an existing key,
  the one measured; a shipped one would guard the creation too (``SELECT ... WHERE NOT
  kept`` for ``VALUES``), and batches, appends and deletes alike.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

import psycopg  # noqa: E402

import agentstate  # noqa: E402
from agentstate.backends.postgres import lean  # noqa: E402
from benchmarks import pg_writes as pw  # noqa: E402
from benchmarks.pg_profile import backend_cpu_ns  # noqa: E402

BEFORE = "bd35024"  # the last commit on main before history (issue 39; 148d83e added it)


def _lean_before(folder: str):
    text = subprocess.run(["git", "-C", REPO, "show", f"{BEFORE}:agentstate/backends/postgres/lean.py"],
                          capture_output=True, text=True, check=True).stdout
    path = os.path.join(folder, "lean_before.py")
    with open(path, "w") as f:
        f.write(text.replace("from ..base import KEEP", "KEEP = object()"))
    spec = importlib.util.spec_from_file_location("lean_before", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def variants(before) -> dict[str, tuple[str, bool]]:
    """{name: (statement text, history on in its store)}."""
    cur = lean._put_text(False, False)
    keep = lean._keep([("id", "")]) + ", "
    same = " AND " + lean._same("")
    ident = f"n AS MATERIALIZED (SELECT {lean._ident('true')} AS id FROM w, h), "
    no_k = cur.replace(keep, "")
    no_kb = no_k.replace(same, "").replace(lean._before("") + ", ", "")
    no_kbn = no_kb.replace(ident, "").replace("n.id", "NULL").replace("FROM w, n, h", "FROM w, h")
    probes = ("h AS MATERIALIZED (SELECT NOT EXISTS (SELECT FROM setting WHERE name = 'feed_retention' "
              "AND value = 0) AS feed, NOT EXISTS (SELECT FROM setting WHERE name IN "
              "('history_retention', 'feed_retention') AND value = 0) AS kept)")
    old = before._put_text(False, False)
    off_shape = (old.replace("WITH w AS (", f"WITH {lean._ON}, w AS (", 1)
                 .replace(f"WHERE {lean.TOMBSTONE} OR", f"WHERE ({lean.TOMBSTONE} OR", 1)
                 .replace("RETURNING t.version", ") AND NOT (SELECT kept FROM h) RETURNING t.version", 1))
    for text, part in ((no_k, keep), (no_kb, lean._before("")), (no_kbn, ident)):
        assert part not in text
    assert lean._ON in cur
    assert "NOT (SELECT kept FROM h)" in off_shape
    return {
        f"before history ({BEFORE}), history off": (old, False),
        "as shipped, history on": (cur, True),
        "as shipped, history off": (cur, False),
        "as shipped, h read by two index probes, history on": (cur.replace(lean._ON, probes), True),
        "as shipped without k (the before-image row), history on": (no_k, True),
        "... and without b and the xmin test, history on": (no_kb, True),
        "... and without n (the change's id), history on": (no_kbn, True),
        "a history-off shape: before history + the test of h, history off": (off_shape, False),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=HERE)
    args = ap.parse_args()
    n, rounds = (20, 3) if args.quick else (50, 80)
    server = pw.start_server(False)
    conns = []
    try:
        with tempfile.TemporaryDirectory() as folder:
            chosen = variants(_lean_before(folder))
        params = lean.put_params("app", "x", "e", "json", json.dumps(pw.VALUE, separators=(",", ":")),
                                 len(json.dumps(pw.VALUE)), None, None)
        url = pw.fresh_url(server)  # the off shape leaves a store with history on alone
        with agentstate.open(url) as db, psycopg.connect(url, autocommit=True) as c:
            db.scope("app", "x").put("e", pw.VALUE)
            off = chosen["a history-off shape: before history + the test of h, history off"][0]
            assert c.execute(off, params).fetchone() is None
            assert db.scope("app", "x").history("e")[0].version == 1
        jobs = {}
        for name, (text, on) in chosen.items():
            url = pw.fresh_url(server)
            with agentstate.open(url) as db:
                db.scope("app", "x").put("e", pw.VALUE)
                if not on:
                    db.set_setting("history_retention", 0)
            c = psycopg.connect(url, autocommit=True)
            conns.append(c)
            for _ in range(30):  # prepared, and each one writes
                assert c.execute(text, params, prepare=True).fetchone() is not None, name
            jobs[name] = (c, text, c.info.backend_pid)
        out: dict[str, list[float]] = {name: [] for name in jobs}
        for _ in range(rounds):
            for name in random.sample(list(jobs), len(jobs)):
                c, text, pid = jobs[name]
                c0 = backend_cpu_ns(pid)
                for _ in range(n):
                    c.execute(text, params, prepare=True).fetchone()
                out[name].append((backend_cpu_ns(pid) - c0) / n / 1e3)
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        med = {name: statistics.median(xs) for name, xs in out.items()}
        base = med[f"before history ({BEFORE}), history off"]
        lines = ["# What value history adds to a lean PostgreSQL put", "",
                 f"`python -m benchmarks.pg_history_cost{' --quick' if args.quick else ''}`, "
                 f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, load average "
                 f"{load} at the end. The put of an existing key as one prepared statement; server CPU "
                 f"per put, of the backend that ran it, fsync off; median of {rounds} batches of "
                 f"{n}. See the module docstring for the variants.", "",
                 "| statement | server CPU µs (p25–p75) | × before history |", "|---|---:|---:|"]
        for name, xs in out.items():
            q = statistics.quantiles(xs, n=4)
            lines.append(f"| {name} | {med[name]:.1f} ({q[0]:.0f}–{q[2]:.0f}) | {med[name] / base:.2f}× |")
        path = os.path.join(args.out, "PG-HISTORY-COST.md")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines))
        print("wrote", path)
    finally:
        for c in conns:
            c.close()
        server.stop()


if __name__ == "__main__":
    main()
