"""The benchmarks' "raw apsw, same SQL" baseline runs exactly agentstate's statements.

RESULTS.md divides agentstate's speed by this baseline's (issue 15): if
agentstate's SQL changed and the baseline's did not, the ratio would compare
different work. Each write is traced (apsw's exec_trace) on both and the
statement texts compared, in order; the purge every 8th write is kept out of
the traced calls on both sides.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import agentstate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks import systems  # noqa: E402  (the repository's own benchmarks, as test_benchmarks.py runs them)

VALUE = {"role": "user", "content": "hello", "n": 1}


def _trace(conn, fn) -> list[str]:
    seen: list[str] = []

    def tracer(cursor, sql, bindings):
        seen.append(" ".join(sql.split()))
        return True

    conn.exec_trace = tracer
    try:
        fn()
    finally:
        conn.exec_trace = None
    return seen


@pytest.fixture
def both(tmp_path):
    os.makedirs(tmp_path / "a")
    os.makedirs(tmp_path / "r")
    db = agentstate.open(str(tmp_path / "a" / "agentstate.db"), durability="normal")
    kv = db.scope(systems.ApswSameHandle.KIND, systems.ApswSameHandle.SID)
    raw = systems.ApswSameHandle(str(tmp_path / "r"), "normal")
    for target in (kv, None):
        if target is not None:
            target.put("k", VALUE)
            target.put("n", 1)
            target.put("l", [VALUE])
            db.runs.write("h", [], None, create=True)
        else:
            raw.put("k", VALUE)
            raw.incr("n")
            raw.set_list("l", [VALUE])
            raw.run_create("h", [], None)
    store = db._store
    store.housekeeping = None  # the purge every 8th write: not part of one call's statements
    raw.every = 10**9
    yield db, kv, store.conn(), raw
    raw.close()
    db.close()


@pytest.mark.parametrize("op", ["put", "update", "append", "history"])
def test_same_statements_as_agentstate(both, op):
    db, kv, conn, raw = both
    mine = {
        "put": lambda: kv.put("k", VALUE),
        "update": lambda: kv.update("n", lambda n: n + 1),
        "append": lambda: kv.append("l", [VALUE]),
        "history": lambda: db.runs.write("h", [{"seq": 0, "m": VALUE}], {"last": 0}),
    }[op]
    theirs = {
        "put": lambda: raw.put("k", VALUE),
        "update": lambda: raw.incr("n"),
        "append": lambda: raw.append("l", VALUE),
        "history": lambda: raw.run_write("h", {"seq": 0, "m": VALUE}, {"last": 0}),
    }[op]
    a = _trace(conn, mine)
    b = _trace(raw.c, theirs)
    assert a == b
    assert "BEGIN IMMEDIATE" in a and a[-1] == "COMMIT"  # one whole write traced
