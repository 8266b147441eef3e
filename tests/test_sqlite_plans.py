"""SQLite plans that never depend on bound values (issue 31).

The store's connections turn on SQLite's query planner stability guarantee
(SQLITE_DBCONFIG_ENABLE_QPSG). Without it SQLite, built with STAT4 as apsw's is,
prepares a statement again each time a value bound to its LIMIT, or to a range it
reads in index order, changes: a range read of a few keys cost twice what it
does with it (benchmarks/PYTHON-COST.md). The price would be a plan that needed a
bound value to be good (a partial index proven usable by a parameter's value, a
LIKE prefix): the second test runs a workload over every part of the store and
checks that no statement it ran is planned otherwise with the guarantee on.
"""

from __future__ import annotations

import time

import apsw

import agentstate


def test_every_connection_of_the_store_plans_without_bound_values(tmp_path):
    db = agentstate.open(str(tmp_path / "a.db"))
    try:
        db.scope("app", "a").put("k", 1)
        assert db._store.conn().config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, -1) == 1
    finally:
        db.close()


def _workload(db: agentstate.Database) -> None:
    s = db.scope("session", "s-1")
    for i in range(20):
        s.put(f"k{i:02d}", {"i": i}, ttl=3600 if i % 2 else None)
    s.get("k01"), s.get_versioned("k02"), s.get_many(["k01", "k03", "nope"])
    s.items("k", limit=5), s.items("k", after="k05"), s.list("k", limit=3), s.list("k", after="k10")
    s.update("n", lambda n: n + 1, default=0)
    s.append("h", [1, 2, 3]), s.slice("h", 1), s.slice("h", -2), s.length("h"), s.pop("h")
    s.touch("k01", 60), s.expires_at("k01"), s.delete("k00")
    s.put("short", 1, ttl=0.001)
    with db.transaction():
        s.get("absent"), s.put("absent", 1), s.get_many(["absent", "k02"]), s.items("k", limit=2)
    with db.batch() as b:
        b.scope("user", "u").put("a", 1)
        b.scope("user", "u").append("l", [1])
        b.scope("user", "u").delete("a")
    db.scope("user", "u").clear()
    runs = db.runs
    runs.write("r1", [{"seq": 0, "type": "message"}, {"seq": 1, "type": "message"}], {"t": 1}, create=True)
    runs.entries("r1"), runs.entries("r1", since=1, limit=1), runs.tail("r1", 1), runs.head("r1")
    runs.read("r1"), runs.list(), runs.list(limit=1), runs.pin("r1"), runs.pin("r1", False)
    runs.once("r1", "c1", lambda: 42), runs.once("r1", "c1", lambda: 43)
    runs.fork("r1", "r2", upto=1), runs.trim("r2", before=1), runs.delete("r2")
    runs.prune(older_than=3600)
    alice = agentstate.Principal("alice")
    sessions = db.sessions
    info = sessions.create(alice)
    sessions.get(info.id, alice), sessions.list(alice), sessions.state(info.id, alice).put("x", 1)
    turn = sessions.start_turn(info.id, alice, input="hi")
    turn.heartbeat(), sessions.turns_by_status(alice), sessions.turns_by_status(alice, "running")
    sessions.get_turn(turn.id, alice), sessions.turns(info.id, alice)
    db.scope("session", info.id, fence=turn.id).put("fenced", 1)
    turn.finish("done")
    sessions.prune(agentstate.Principal("ops", admin=True), idle_for=3600)
    head = db.last_change()
    db.changes(), db.changes(since=head - 3, topic="kv"), db.watch(head, timeout=0)
    db.tokens.create("t1", grants=["session:s-1"]), db.tokens.list()
    time.sleep(0.01)
    s.get("short"), s.put("short", 2)  # an expired key met by a writer
    db.check(), db.info()


def test_no_statement_of_the_store_is_planned_otherwise_without_bound_values(tmp_path):
    path = str(tmp_path / "a.db")
    seen: dict[str, object] = {}

    def trace(cursor, sql, bindings):
        if sql.lstrip()[:6].upper() in ("SELECT", "INSERT", "UPDATE", "DELETE", "WITH ("):
            seen.setdefault(sql, bindings)
        return True

    def hook(conn):
        conn.exec_trace = trace

    apsw.connection_hooks.append(hook)
    try:
        db = agentstate.open(path)
        try:
            _workload(db)
        finally:
            db.close()
    finally:
        apsw.connection_hooks.remove(hook)
    assert len(seen) > 60, len(seen)  # the workload reached the store's statements (~75)

    def plans(qpsg: int) -> dict[str, list[str]]:
        c = apsw.Connection(path)
        try:
            c.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, qpsg)
            return {sql: [r[3] for r in c.execute("EXPLAIN QUERY PLAN " + sql, b or ())]
                    for sql, b in seen.items()}
        finally:
            c.close()

    without, with_ = plans(0), plans(1)
    differ = {" ".join(sql.split()): (without[sql], with_[sql]) for sql in seen
              if without[sql] != with_[sql]}
    assert differ == {}
