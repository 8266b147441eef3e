"""The kv table's layout: a rowid table with its key index (shipped) beside WITHOUT ROWID.

    python -m benchmarks.layout             # the full run (~1 min), writes LAYOUT.md
    python -m benchmarks.layout --quick     # a smoke run (seconds), prints the table

agentstate itself (put, get, list through a scope, durability normal, where a
write's CPU shows) on two files that differ only in how kv is stored: as
schema.sql makes it, a rowid table plus the index of its primary key (two
b-trees: a put writes a page of each), or rebuilt WITHOUT ROWID (one b-tree
keyed by (kind, scope_id, key), the row inside it). Values of three sizes.

A put to a WITHOUT ROWID kv writes one page fewer, so small values put faster
(one of issue 15's peer cells, put against LangGraph's store, is one page
apart). But a WITHOUT ROWID row keeps at most ~1 KB in its b-tree page (a
quarter of a 4 KB page, less headers) and spills the rest to an overflow page,
while a rowid row keeps up to ~4 KB in its leaf: values of a few KB, common in
agent state, then put slower, get needs an extra page, and listing a scope's
keys walks rows holding values instead of an index holding keys.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import apsw

import agentstate
from agentstate.backends.sqlite.schema import SCHEMA, schema_object

from . import stamp

SIZES = (150, 1500, 3000)


def _without_rowid(path: str) -> None:
    """Rebuild kv WITHOUT ROWID, under the same name and with the same indexes and view."""
    c = apsw.Connection(path)
    c.execute("BEGIN IMMEDIATE; DROP VIEW state; DROP TABLE kv")
    create = schema_object(SCHEMA, "kv").rstrip().rstrip(";")
    assert create.endswith("STRICT")
    c.execute(create + ", WITHOUT ROWID")
    for name in ("kv_list", "kv_expiry", "state"):
        c.execute(schema_object(SCHEMA, name))
    c.execute("COMMIT")
    c.close()


def run_once(layout: str, size: int, n: int) -> dict[str, float]:
    """µs per put and per get, ms per list of the scope's n keys."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "layout.db")
        agentstate.open(path).close()
        if layout == "without rowid":
            _without_rowid(path)
        db = agentstate.open(path, durability="normal")
        s = db.scope("app", "bench")
        value = {"text": "x" * size, "n": 1}
        t = time.perf_counter()
        for i in range(n):
            s.put(f"key{i:06d}", value)
        put = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for i in range(n):
            s.get(f"key{i * 7919 % n:06d}")
        get = (time.perf_counter() - t) / n * 1e6
        t = time.perf_counter()
        for _ in range(20):
            assert len(s.list()) == n
        listed = (time.perf_counter() - t) / 20 * 1e3
        db.close()
    return {"put": put, "get": get, "list": listed}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run: 200 keys, one round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--keys", type=int, default=5000)
    ap.add_argument("--out", default=None, help="write LAYOUT.md into this folder")
    a = ap.parse_args(argv)
    if a.quick:
        a.rounds, a.keys = 1, 200
    t0, load0 = time.time(), os.getloadavg()
    layouts = ("rowid + key index (shipped)", "without rowid")
    res: dict[tuple[str, int], list[dict[str, float]]] = {(l, s): [] for s in SIZES for l in layouts}
    for _ in range(a.rounds):  # alternating, so both layouts meet the same machine weather
        for size in SIZES:
            for layout in layouts:
                res[layout, size].append(run_once(layout, size, a.keys))
    lines = ["| value | kv layout | put, µs | get, µs | list of the scope's keys, ms |",
             "|---|---|---|---|---|"]
    for (layout, size), rs in res.items():
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        base = {k: statistics.median(r[k] for r in res[layouts[0], size]) for k in rs[0]}
        rel = "" if layout == layouts[0] else " ({:.2f}×)"
        lines.append(f"| {size:,} B | {layout} | {m['put']:.1f}{rel.format(base['put'] / m['put'])} | "
                     f"{m['get']:.2f}{rel.format(base['get'] / m['get'])} | "
                     f"{m['list']:.2f}{rel.format(base['list'] / m['list'])} |")
    text = "\n".join(lines)
    print(text)
    if a.out:
        doc = f"""# The kv table's layout: rowid (shipped) beside WITHOUT ROWID

{stamp.generated('python -m benchmarks.layout', t0, load0)}

{a.keys:,} keys of one scope, durability normal; medians of {a.rounds} rounds, the layouts alternating. (×): the shipped layout's time ÷ this one's, above 1 faster.

{text}

{__doc__.split(chr(10) + chr(10), 2)[2].strip()}
"""
        with open(os.path.join(a.out, "LAYOUT.md"), "w", encoding="utf-8") as f:
            f.write(doc)


if __name__ == "__main__":
    sys.exit(main())
