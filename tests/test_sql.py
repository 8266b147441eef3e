"""``db.sql()``: read-only SQL through agentstate's own connection, on both backends (issue 26, item 28)."""

from __future__ import annotations

import json
import threading
import time

import pytest

import agentstate

from .conftest import digest, on_postgres


def ph(db, name: str | None = None) -> str:
    """A placeholder in the backend's own style: ``?``/``:name`` or ``%s``/``%(name)s``."""
    if on_postgres(db):
        return f"%({name})s" if name else "%s"
    return f":{name}" if name else "?"


def test_sql_returns_rows_as_dicts_with_values_as_json_text(any_db):
    """Rows come back as dicts keyed by column name; values are the stored JSON text."""
    db = any_db
    s = db.scope("session", "s-1")
    s.put("settings", {"model": "large", "t": 0.5})
    s.put("n", 7)
    s.append("history", ["a", "b"])
    rows = db.sql(f"SELECT key, value, version FROM state WHERE kind = {ph(db)} AND scope_id = {ph(db)} "
                  "ORDER BY key", ("session", "s-1"))
    assert [r["key"] for r in rows] == ["history", "n", "settings"]
    assert all(set(r) == {"key", "value", "version"} for r in rows)
    assert all(isinstance(r["value"], str) for r in rows)
    assert [json.loads(r["value"]) for r in rows] == [["a", "b"], 7, {"model": "large", "t": 0.5}]
    named = db.sql(f"SELECT version FROM state WHERE scope_id = {ph(db, 'sid')} AND key = {ph(db, 'k')}",
                   {"sid": "s-1", "k": "n"})
    assert named == [{"version": 1}]
    assert db.sql(f"SELECT key FROM state WHERE scope_id = {ph(db)}", ["nobody"]) == []
    db.runs.write("run-1", [{"seq": 0, "type": "message"}], {"task": "t"}, create=True)
    assert db.sql("SELECT run_id, seq, type FROM run_history") == [
        {"run_id": "run-1", "seq": 0, "type": "message"}]


COMMON_WRITES = [
    "DELETE FROM kv",
    "UPDATE kv SET version = version + 1",
    "INSERT INTO setting (name, value) VALUES ('feed_retention', 1)",
    "DROP VIEW state",
    "DROP TABLE kv",
    "CREATE TABLE mine (a INTEGER)",
    "CREATE TEMP TABLE mine (a INTEGER)",
    "CREATE INDEX mine ON kv (version)",
    "ALTER TABLE kv ADD COLUMN mine INTEGER",
    "DELETE FROM kv RETURNING key",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT mine",
    "COMMIT; DELETE FROM kv",
]
SQLITE_WRITES = [
    "PRAGMA user_version = 99",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA foreign_keys = OFF",
    "PRAGMA wal_checkpoint(TRUNCATE)",
    "ATTACH ':memory:' AS mine",
    "VACUUM",
    "REINDEX",
    "ANALYZE",
    "REPLACE INTO setting (name, value) VALUES ('feed_retention', 1)",
]
POSTGRES_WRITES = [
    "SELECT nextval('list_seq')",
    "TRUNCATE kv",
    "SELECT setval('list_seq', 1)",
    "SET TRANSACTION READ WRITE",
]
SEVERAL_STATEMENTS = [
    "SELECT 1; DELETE FROM kv",
    "SELECT 1; COMMIT; DELETE FROM kv",
    "SELECT 1; SELECT 2",
]


def test_sql_refuses_whatever_writes_and_changes_nothing(any_db):
    """A statement that writes (or ends, opens or changes the transaction or connection) is
    refused with UsageError, several statements with InvalidValue; the store is unchanged
    and keeps working."""
    db = any_db
    s = db.scope("app", "a")
    s.put("k", {"v": 1})
    s.append("l", [1, 2])
    before = digest(db)
    writes = COMMON_WRITES + (POSTGRES_WRITES if on_postgres(db) else SQLITE_WRITES)
    for statement in writes:
        with pytest.raises(agentstate.UsageError, match="reads only"):
            db.sql(statement)
    for statement in SEVERAL_STATEMENTS:
        with pytest.raises(agentstate.InvalidValue, match="one statement"):
            db.sql(statement)
    assert digest(db) == before
    # The connection the refused statements ran on still serves the store as before.
    assert s.get("k") == {"v": 1} and s.slice("l") == [1, 2]
    assert s.put("k", {"v": 2}) == 2 and s.append("l", [3]).length == 3
    assert db.sql("SELECT count(*) AS n FROM kv") == [{"n": 2}]
    assert db.check() == []


def test_sql_errors_are_the_store_s_errors(any_db):
    """Bad SQL or parameters raise InvalidValue (never a raw driver error, never Damaged);
    a missing table named by the caller is the caller's mistake."""
    db = any_db
    db.scope("app", "a").put("k", 1)
    before = digest(db)
    bad = [
        ("SELEC 1", ()),
        ("SELECT * FROM no_such_table", ()),
        ("SELECT no_such_column FROM kv", ()),
        (f"SELECT {ph(db)}", ()),  # a parameter missing
        (f"SELECT {ph(db)}", (1, 2)),  # one too many
        (f"SELECT {ph(db)}", (object(),)),  # a type no driver binds
        (f"SELECT {ph(db, 'x')}", {"y": 1}),  # a name missing
        ("SELECT 1", "ab"),  # a string is not a sequence of parameters
        ("SELECT 1", 5),
        (b"SELECT 1", ()),
        ("", ()),
    ]
    for query, params in bad:
        with pytest.raises(agentstate.InvalidValue) as e:
            db.sql(query, params)
        assert type(e.value).__module__ == "agentstate.errors", (query, params)
    assert digest(db) == before
    assert db.sql("SELECT 1 AS one") == [{"one": 1}]


def test_sql_inside_a_transaction_is_a_usage_error(any_db):
    """sql() reads committed state: inside transaction() it is refused, and the block goes on."""
    db = any_db
    with db.transaction():
        db.scope("app", "a").put("k", 1)
        with pytest.raises(agentstate.UsageError, match="transaction"):
            db.sql("SELECT 1")
    assert db.scope("app", "a").get("k") == 1


def test_sql_after_close_is_closed(any_db):
    any_db.close()
    with pytest.raises(agentstate.Closed):
        any_db.sql("SELECT 1")


def test_sql_sees_one_snapshot_while_a_writer_commits(any_db):
    """A query over many rows sees each concurrent transaction whole or not at all: the
    total that a writer moves between keys (one unit per transaction) never changes.
    (One writer: two could lose each other's read-then-put on PostgreSQL, or deadlock.)"""
    db = any_db
    keys = [f"k{i:02d}" for i in range(20)]
    s = db.scope("app", "bank")
    with db.transaction():
        for k in keys:
            s.put(k, 100)
    total = "SELECT sum(CAST(value AS INTEGER)) AS total FROM state WHERE scope_id = 'bank'"
    if on_postgres(db):
        total = "SELECT sum(value::text::int) AS total FROM state WHERE scope_id = 'bank'"
    stop = threading.Event()
    errors: list[BaseException] = []
    moved = [0]

    def move() -> None:
        try:
            i = 0
            while not stop.is_set():
                a, b = keys[i % 20], keys[(i * 7 + 1) % 20]
                if a != b:
                    with db.transaction():
                        s.put(a, s.get(a) - 1)
                        s.put(b, s.get(b) + 1)
                    moved[0] += 1
                i += 1
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    writer = threading.Thread(target=move)
    writer.start()
    deadline, reads = time.monotonic() + 120, 0
    try:
        while reads < 200 or moved[0] < 20:  # reads that overlap commits, however slow either is
            assert not errors, errors
            assert time.monotonic() < deadline, (reads, moved[0])
            assert db.sql(total) == [{"total": 2000}]
            reads += 1
    finally:
        stop.set()
        writer.join(60)
    assert not errors, errors
    assert db.sql(total) == [{"total": 2000}]


def test_sql_allows_what_a_reader_writes(any_db):
    """Queries in the forms people use to look at a store run, comments and all."""
    db = any_db
    db.scope("app", "a").put("k", {"tags": ["x", "y"]})
    common = [
        ("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 3) "
         "SELECT count(*) AS n FROM r", [{"n": 3}]),
        ("-- the keys\nSELECT key FROM state /* all of them */ ORDER BY key; -- done", [{"key": "k"}]),
        ("SELECT '50%' AS pct", [{"pct": "50%"}]),
        ("VALUES (1)", None),
        ("SELECT kind, count(*) AS n FROM state GROUP BY kind", [{"kind": "app", "n": 1}]),
    ]
    if on_postgres(db):
        specific = [
            ("SELECT json_array_elements_text(value -> 'tags') AS tag FROM state", [{"tag": "x"}, {"tag": "y"}]),
            ("SHOW TimeZone", [{"TimeZone": "UTC"}]),
            ("EXPLAIN SELECT * FROM kv", None),
            ("(SELECT 1 AS one)", [{"one": 1}]),
            ("SELECT column_name FROM information_schema.columns WHERE table_name = 'kv' "
             "AND column_name = 'version' AND table_schema = current_schema()", [{"column_name": "version"}]),
        ]
    else:
        specific = [
            ("SELECT j.value AS tag FROM state, json_each(state.value, '$.tags') AS j",
             [{"tag": "x"}, {"tag": "y"}]),
            ("EXPLAIN QUERY PLAN SELECT * FROM kv", None),
            ("PRAGMA table_info(kv)", None),
            ("SELECT name FROM pragma_table_info('kv') WHERE name = 'version'", [{"name": "version"}]),
            ("SELECT name FROM sqlite_schema WHERE type = 'view' AND name = 'state'", [{"name": "state"}]),
        ]
    for query, expected in common + specific:
        rows = db.sql(query)
        assert rows, query
        if expected is not None:
            assert rows == expected, query


def test_python_s_sqlite3_cannot_open_a_file_this_process_holds(tmp_path, monkeypatch):
    """sqlite3.connect() of a file this process has open through agentstate raises
    UsageError naming db.sql() (SPEC §16), by its path, a relative one, a symbolic or hard
    link, a file: URI; nothing is opened and the store goes on; another file, and the same
    file once every store of it is closed, open as before."""
    import os
    import sqlite3

    path = tmp_path / "agent.db"
    db = agentstate.open(str(path))
    twice = agentstate.open(str(path))
    db.scope("app", "a").put("k", 1)
    (tmp_path / "link.db").symlink_to(path)
    os.link(path, tmp_path / "hard.db")
    monkeypatch.chdir(tmp_path)
    for name, uri in ((str(path), False), ("agent.db", False), ("link.db", False),
                      ("hard.db", False), (f"file:{path}?mode=ro", True), (path, False)):
        with pytest.raises(agentstate.UsageError, match=r"db\.sql\(\)"):
            sqlite3.connect(name, uri=uri)
    sqlite3.connect(":memory:").close()
    sqlite3.connect(str(tmp_path / "other.db")).close()
    assert db.scope("app", "a").get("k") == 1 and db.check() == []
    db.close()
    with pytest.raises(agentstate.UsageError):  # another store of the file is still open
        sqlite3.connect(str(path))
    twice.close()
    with sqlite3.connect(str(path)) as c:
        assert c.execute("SELECT value FROM kv").fetchone() == ("1",)
    c.close()
