"""What value history costs (SPEC §17): each write with history on beside the same write with
it off, reads of the present, and a fork of a session whose list holds 10 or 20,000 items,
on SQLite and PostgreSQL.

    python -m benchmarks.history [--rounds 9] [--calls 200] [--out benchmarks/HISTORY.md]

Two stores of one backend, one with ``history_retention`` at its default (a day), one at 0
(off), are written in alternating batches (each side first every other round), so both
meet the same machine weather; the
figures are medians over the rounds of the µs per call (wall time), durability full (a
real fsync on the file; the PostgreSQL server is the tests' throwaway one, fsync off, so
its figures are round trips and CPU). The fork: a session with one list of N items and a
few other keys, forked (``sessions.fork``) again and again, the median of a fork's time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import agentstate

from . import stamp

VALUE = {"role": "assistant", "content": "hello world " * 5}
P = agentstate.Principal("bench")


def operations(db: agentstate.Database, tag: str) -> dict[str, Callable[[int], Any]]:
    """The timed writes (and a read of the present), on keys of their own."""
    kv = db.scope("app", f"bench-{tag}")
    kv.put("list", [VALUE] * 10)
    for i in range(100):
        kv.put(f"k{i}", VALUE)
    made = [0]

    def put_new(i: int) -> None:
        kv.put(f"new{made[0]}", VALUE)
        made[0] += 1

    def pop(i: int) -> None:
        kv.append("popped", [VALUE])
        kv.pop("popped")

    return {
        "put, existing key": lambda i: kv.put(f"k{i % 100}", VALUE),
        "put, new key": put_new,
        "put, if_version": lambda i: kv.put(f"k{i % 100}", VALUE,
                                            if_version=kv.get_versioned(f"k{i % 100}").version),
        "append one item": lambda i: kv.append("list", [VALUE]),
        "append + pop": pop,
        "delete + put": lambda i: (kv.delete(f"k{i % 100}"), kv.put(f"k{i % 100}", VALUE)),
        "get (the present)": lambda i: kv.get(f"k{i % 100}"),
    }


def measure(on: agentstate.Database, off: agentstate.Database, rounds: int,
            calls: int) -> dict[str, dict[str, list[float]]]:
    sides = {"on": operations(on, "on"), "off": operations(off, "off")}
    out: dict[str, dict[str, list[float]]] = {side: {n: [] for n in sides[side]} for side in sides}
    for r in range(rounds):
        for name in sides["on"]:
            for side in ("on", "off") if r % 2 else ("off", "on"):  # neither always first
                fn = sides[side][name]
                t0 = time.perf_counter()
                for i in range(calls):
                    fn(i)
                out[side][name].append((time.perf_counter() - t0) / calls * 1e6)
    return out


def forks(db: agentstate.Database, rounds: int) -> dict[int, list[float]]:
    """µs per fork of a session holding one list of n items (and three small keys)."""
    out: dict[int, list[float]] = {}
    for n in (10, 20_000):
        s = db.sessions.create(P)
        st = db.sessions.state(s.id, P)
        for i in range(0, n, 1000):
            st.append("history", [{"t": j} for j in range(i, min(n, i + 1000))])  # 1 MiB in all at most
        for k in ("plan", "user", "notes"):
            st.put(k, VALUE)
        out[n] = []
    for _ in range(rounds):
        for n, s_id in zip(out, _sessions(db, list(out))):
            t0 = time.perf_counter()
            db.sessions.fork(s_id, P)
            out[n].append((time.perf_counter() - t0) * 1e6)
    return out


def _sessions(db: agentstate.Database, sizes: list[int]) -> list[str]:
    """The sessions made by ``forks``, by list length (the first of each length)."""
    found = {}
    for s in db.sessions.list(P):
        n = db.sessions.state(s.id, P).length("history")
        if n in sizes and n not in found:
            found[n] = s.id
    return [found[n] for n in sizes]


def run(rounds: int, calls: int, pg_url: str | None, pg_url_off: str | None
        ) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        with agentstate.open(os.path.join(d, "on.db")) as on, \
                agentstate.open(os.path.join(d, "off.db")) as off:
            off.set_setting("history_retention", 0)
            results["SQLite"] = (measure(on, off, rounds, calls), forks(on, rounds))
    if pg_url and pg_url_off:
        with agentstate.open(pg_url) as on, agentstate.open(pg_url_off) as off:
            off.set_setting("history_retention", 0)
            results["PostgreSQL"] = (measure(on, off, rounds, calls), forks(on, rounds))
    return results


def table(results: dict[str, Any]) -> str:
    lines = []
    for backend, (writes, fork) in results.items():
        lines += [f"### {backend}", "",
                  "| operation | history on µs | history off µs | on ÷ off |", "|---|---:|---:|---:|"]
        for name in writes["on"]:
            a, b = statistics.median(writes["on"][name]), statistics.median(writes["off"][name])
            lines.append(f"| {name} | {a:,.0f} | {b:,.0f} | {a / b:.2f} |")
        small, big = (statistics.median(fork[n]) for n in (10, 20_000))
        lines += ["", f"Fork of a session whose list holds 10 items: {small:,.0f} µs; 20,000 "
                      f"items: {big:,.0f} µs ({big / small:.2f}x).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    server = None
    urls: list[str | None] = [None, None]
    if not a.no_postgres:
        from tests import pgserver

        bindir = pgserver.bindir()
        if bindir:
            pgserver.sweep(bindir)
            server = pgserver.Server(bindir).start()
            urls = [pgserver.schema_url(server.admin_url, pgserver.new_schema(server.admin_url))
                    for _ in range(2)]
    t0, load0 = time.time(), os.getloadavg()
    try:
        results = run(a.rounds, a.calls, *urls)
    finally:
        if server is not None:
            server.stop()
    command = f"python -m benchmarks.history --rounds {a.rounds} --calls {a.calls}"
    text = "\n".join([
        "# Value history: what it costs (SPEC §17)", "",
        stamp.generated(command, t0, load0), "",
        "Durability full. Each write beside the same write on a store with history off "
        "(history_retention 0), in alternating batches. The PostgreSQL server is the tests' "
        "throwaway one (fsync off: its figures are round trips and CPU, not a disk).", "",
        table(results)])
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
