"""The PostgreSQL backend's own promises (SPEC §11), beyond the shared behavioural tests.

Row locks instead of a global lock, the server's errors translated, one round
trip per call, values kept exactly, stores kept apart by search_path,
migrations under an advisory lock, the command and psql on a server.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import shutil
import subprocess
from pathlib import Path
import sys
import threading
import time

import psycopg
import pytest
from click.testing import CliRunner

import agentstate
from agentstate.backends.postgres import schema as pgstore
from agentstate.cli import cli

from . import pgserver
from .conftest import REPO, RawSQL

ALICE = agentstate.Principal("alice")


@pytest.fixture
def db(pg_url):
    d = agentstate.open(pg_url)
    yield d
    d.close()


@pytest.fixture
def new_schema(pg_admin_url):
    """Makes new empty schemas; on a server of the caller's ($DATABASE_URL) they go afterwards."""
    made: list[str] = []

    def make() -> str:
        made.append(pgserver.new_schema(pg_admin_url))
        return made[-1]

    yield make
    if os.environ.get("DATABASE_URL"):
        for schema in made:
            pgserver.drop_schema(pg_admin_url, schema)


def psql_bin() -> str | None:
    b = pgserver.bindir()
    if b and os.path.exists(os.path.join(b, "psql")):
        return os.path.join(b, "psql")
    return shutil.which("psql")


# -- values, exactly ------------------------------------------------------------

def test_values_are_kept_as_given_text_not_jsonb(db):
    """json, not jsonb: key order, duplicate-free text and the float 1e16 come back as written."""
    kv = db.scope("app", "a")
    kv.put("v", {"b": 1, "a": [1e16, 1.5, -0.0, 2**63 - 1]})
    kv.put_bytes("raw", b"\x00\xff{")
    with RawSQL(db) as c:
        text, data = c.execute("SELECT value::text, data FROM kv WHERE key = 'v'")[0]
        assert text == '{"b":1,"a":[1e+16,1.5,-0.0,9223372036854775807]}'
        assert c.execute("SELECT data FROM kv WHERE key = 'raw'")[0][0] == b"\x00\xff{"
        assert c.execute("SELECT pg_typeof(value)::text, pg_typeof(data)::text FROM kv LIMIT 1")[0] \
            == ("json", "bytea")
    got = kv.get("v")
    assert list(got) == ["b", "a"] and type(got["a"][0]) is float and got["a"][0] == 1e16


# -- concurrency: row locks, translated errors -------------------------------------

def test_a_locked_key_holds_up_only_its_own_writers(pg_url):
    """Row-level locking: while a key's row is locked, writes to other keys go through at
    once; a write to that key waits busy_timeout and raises Busy (never a psycopg error)."""
    with agentstate.open(pg_url, busy_timeout=0.3) as db:
        kv = db.scope("app", "a")
        kv.put("hot", 0)
        with psycopg.connect(pg_url) as other:  # a transaction holding the row
            other.execute("SELECT 1 FROM kv WHERE key = 'hot' FOR UPDATE")
            t0 = time.monotonic()
            for i in range(20):
                kv.put(f"cold{i}", i)
                kv.append("cold-list", [i])
            assert time.monotonic() - t0 < 5
            with pytest.raises(agentstate.Busy) as e:
                kv.put("hot", 1)
            assert "55P03" in str(e.value)
            other.rollback()
        assert kv.put("hot", 2) == 2
        assert db.check() == []


def test_a_deadlock_inside_a_transaction_is_busy_and_undoes_the_block(pg_url):
    """Two blocks locking two keys in opposite orders: the server picks one; it hears Busy
    and none of its writes stay; the other commits."""
    with agentstate.open(pg_url) as db:
        kv = db.scope("app", "d")
        kv.put("x", 0)
        kv.put("y", 0)
        both = threading.Barrier(2)
        outcome: dict[str, object] = {}

        def block(first: str, second: str) -> None:
            try:
                with db.transaction():
                    kv.put(first, first)
                    both.wait(10)
                    kv.put(second, first)
                outcome[first] = "committed"
            except agentstate.AgentStateError as e:
                outcome[first] = e

        threads = [threading.Thread(target=block, args=p) for p in (("x", "y"), ("y", "x"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(map(str, outcome.values())).count("committed") == 1, outcome
        loser = next(k for k, v in outcome.items() if v != "committed")
        assert isinstance(outcome[loser], agentstate.Busy) and "40P01" in str(outcome[loser])
        winner = "x" if loser == "y" else "y"
        assert kv.get("x") == winner and kv.get("y") == winner  # only the winner's block


def test_a_lost_connection_in_a_block_is_a_storage_error_with_unknown_outcome(db):
    """The server hangs up on a transaction: its COMMIT's fate cannot be known from here, so
    the error says outcome_unknown; here it did not commit. The next call works."""
    kv = db.scope("app", "a")
    with pytest.raises(agentstate.StorageError) as e:
        with db.transaction():
            kv.put("k", 1)
            pid = db._store._local.conn.raw.info.backend_pid
            with RawSQL(db) as c:
                c.execute("SELECT pg_terminate_backend(?)", (pid,))
            time.sleep(0.2)
    assert e.value.outcome_unknown is True and "lost the connection" in str(e.value)
    assert kv.get("k") is None
    assert kv.put("k", 2) == 1


def test_connections_the_server_dropped_are_replaced_before_use(db):
    """Idle pooled connections cut by the server (pg_terminate_backend, a restart) are
    noticed before a call uses them: the call just works."""
    kv = db.scope("app", "a")
    kv.put("k", 0)
    with RawSQL(db) as c:
        cut = c.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE pid <> pg_backend_pid() AND datname = current_database() "
                        "AND backend_type = 'client backend'")
    assert cut[0][0] >= 1
    time.sleep(0.2)
    for i in range(5):
        assert kv.put("k", i + 1) == i + 2


def test_settings_of_the_connection(pg_url):
    """durability="normal" is synchronous_commit off; busy_timeout is the lock timeout; UTC."""
    with agentstate.open(pg_url, durability="normal", busy_timeout=2.5) as db:
        rows = db._store.query("SELECT current_setting('synchronous_commit'), "
                               "current_setting('lock_timeout'), current_setting('TimeZone')")
        assert rows == [("off", "2500ms", "UTC")]
        assert db.durability == "normal"
    with agentstate.open(pg_url) as db:
        assert db._store.query("SELECT current_setting('synchronous_commit')") == [("on",)]


def test_arguments_written_in_as_literals_come_back_exact(db):
    """A lone write goes out as one simple query with its arguments written in as literals:
    quotes, backslashes, placeholders and dollar quotes in values and items, every byte, odd
    floats and the largest integers come back exactly."""
    kv = db.scope("app", "lit")
    tricky = ["it's", "back\\slash", "%s %(x)s %%", "$$ $q$ ;", "é中🙂", "\\x00ff", "'", "''",
              "'); DROP TABLE kv; --"]
    numbers = [2**63 - 1, -2**63, 1e-300, -0.0, 1e16, 0.1]
    for i, text in enumerate(tricky):
        assert kv.put(f"k{i}", {"v": text, "n": numbers}) == 1
        got = kv.get(f"k{i}")
        assert got == {"v": text, "n": numbers} and str(got["n"][3]) == "-0.0"
        assert kv.put(f"k{i}", text, if_version=1) == 2 and kv.get(f"k{i}") == text
        assert kv.append(f"l{i}", [text, {text: text}]).length == 2
        assert kv.pop(f"l{i}") == [{text: text}] and kv.get(f"l{i}") == [text]
    every = bytes(range(256))
    kv.put_bytes("bytes", every)
    assert kv.get_bytes("bytes") == every
    assert kv.put("ttl", 1, ttl=3600.000001) == 1 and kv.expires_at("ttl") is not None
    db.runs.write("r1", [{"seq": 0, "t": tricky}], {"s": "'"}, create=True)
    db.runs.write("r1", [{"seq": 0, "t": tricky}, {"seq": 1, "t": "'"}], None)  # one re-sent
    run = db.runs.read("r1")
    assert [e["t"] for e in run.entries] == [tricky, "'"] and run.snapshot == {"s": "'"}
    assert db.check() == []


def test_a_call_is_one_round_trip(db, monkeypatch):
    """A get, put, CAS, append, pop, run write and tail each send one statement: the work
    (the bounded purge every 16th write included) is done by server functions."""
    kv = db.scope("app", "a")
    kv.put("warm", 1)
    sent: list[str] = []
    real = psycopg.Connection.execute

    def counting(self, query, *args, **kwargs):
        sent.append(str(query)[:40])
        return real(self, query, *args, **kwargs)

    calls = [lambda: kv.get("warm"), lambda: kv.put("k", 1), lambda: kv.put("k", 2, if_version=1),
             lambda: kv.append("l", [1, 2]), lambda: kv.pop("l"), lambda: kv.length("l"),
             lambda: db.runs.write("r", [{"seq": 0}], None, create=True),
             lambda: db.runs.write("r", [{"seq": 1}], {"s": 1}), lambda: db.runs.tail("r", 1)]
    monkeypatch.setattr(psycopg.Connection, "execute", counting)
    for call in calls:
        sent.clear()
        call()
        assert len(sent) == 1, sent


# -- the schema: search_path, migrations -----------------------------------------

def test_search_path_keeps_stores_apart(pg_admin_url, new_schema):
    """Two schemas of one database are two stores: keys, runs, the feed and its wake-ups."""
    a_url = pgserver.schema_url(pg_admin_url, new_schema())
    b_url = pgserver.schema_url(pg_admin_url, new_schema())
    with agentstate.open(a_url) as a, agentstate.open(b_url) as b:
        a.scope("app", "x").put("k", "from a")
        b.scope("app", "x").put("k", "from b")
        a.runs.write("r", [{"seq": 0}], None, create=True)
        assert a.scope("app", "x").get("k") == "from a" and b.scope("app", "x").get("k") == "from b"
        assert b.runs.read("r") is None
        assert [c.seq for c in a.changes()] == [1, 2] and [c.seq for c in b.changes()] == [1]
        head = a.last_change()
        woke: list = []
        t = threading.Thread(target=lambda: woke.extend(a.watch(head, timeout=1.5)))
        t.start()
        time.sleep(0.3)
        b.scope("app", "x").put("k", "b again")  # another store's commit does not wake a
        t.join(10)
        assert woke == []
    with psycopg.connect(pg_admin_url) as c:
        for url in (a_url, b_url):
            schema = url.rsplit("%3D", 1)[1]
            assert c.execute("SELECT count(*) FROM pg_tables WHERE schemaname = %s AND tablename = 'kv'",
                             (schema,)).fetchone()[0] == 1
        assert c.execute("SELECT to_regclass('public.kv')").fetchone()[0] is None


def _open_at_once(url: str, start, results) -> None:
    start.wait()
    try:
        with agentstate.open(url) as db:
            db.scope("app", "a").append("openers", [os.getpid()])
        results.put("ok")
    except Exception as e:  # reported to the test
        results.put(repr(e))


def test_two_processes_create_a_fresh_store_at_once(pg_admin_url, new_schema):
    """The schema is applied once, in one transaction under an advisory lock: 4 processes
    opening a fresh schema together all succeed and find one store."""
    url = pgserver.schema_url(pg_admin_url, new_schema())
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_open_at_once, args=(url, start, results)) for _ in range(4)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    start.set()
    assert sorted(results.get(timeout=120) for _ in procs) == ["ok"] * 4
    for p in procs:
        p.join(30)
    with agentstate.open(url) as db:
        assert db.scope("app", "a").length("openers") == 4
        assert db._store.query("SELECT version FROM agentstate_version") == [(pgstore.SCHEMA_VERSION,)]


def _migrate(url: str, start, results) -> None:
    """Open a store with a make-believe next schema version whose migration adds a column."""
    def add_column(c) -> None:
        c.execute("ALTER TABLE kv ADD COLUMN note text")
        c.execute("INSERT INTO setting (name, value) VALUES ('migrated_by', pg_backend_pid())")

    pgstore.MIGRATIONS[pgstore.SCHEMA_VERSION] = add_column
    pgstore.SCHEMA_VERSION += 1
    start.wait()
    try:
        agentstate.open(url).close()
        results.put("ok")
    except Exception as e:  # reported to the test
        results.put(repr(e))


def test_migrations_run_once_under_the_advisory_lock(pg_admin_url, new_schema):
    """An older store opened by 3 newer clients at once is migrated exactly once, in one
    transaction; an older client then refuses it with SchemaTooNew and leaves it as is."""
    url = pgserver.schema_url(pg_admin_url, new_schema())
    agentstate.open(url).close()
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_migrate, args=(url, start, results)) for _ in range(3)]
    for p in procs:
        p.start()
    time.sleep(1.0)
    start.set()
    assert sorted(results.get(timeout=120) for _ in procs) == ["ok"] * 3
    for p in procs:
        p.join(30)
    with psycopg.connect(url) as c:
        assert c.execute("SELECT version FROM agentstate_version").fetchone()[0] == \
            pgstore.SCHEMA_VERSION + 1
        assert c.execute("SELECT count(*) FROM setting WHERE name = 'migrated_by'").fetchone()[0] == 1
    with pytest.raises(agentstate.SchemaTooNew):
        agentstate.open(url)
    with psycopg.connect(url) as c:  # refused, untouched
        assert c.execute("SELECT version FROM agentstate_version").fetchone()[0] == \
            pgstore.SCHEMA_VERSION + 1


def test_a_schema_of_other_tables_or_none_is_refused(pg_admin_url, new_schema):
    """A schema holding someone else's kv table is Damaged; a search_path naming no schema
    is a clear StorageError; neither is changed."""
    schema = new_schema()
    url = pgserver.schema_url(pg_admin_url, schema)
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("CREATE TABLE kv (id int)")
    with pytest.raises(agentstate.Damaged, match="not an agentstate store"):
        agentstate.open(url)
    with psycopg.connect(url) as c:
        assert c.execute("SELECT to_regclass('agentstate_version')").fetchone()[0] is None
    with pytest.raises(agentstate.StorageError, match="names no existing schema"):
        agentstate.open(pgserver.schema_url(pg_admin_url, "no_such_schema"))


def test_an_unreachable_server_is_a_clear_error():
    with pytest.raises(agentstate.StorageError, match="cannot connect to postgresql://"):
        agentstate.open("postgresql://nobody:secret@127.0.0.1:1/none?connect_timeout=2")


# -- administration: info, check, the command, psql --------------------------------

def test_info_hides_the_password_and_check_finds_damage(pg_admin_url, new_schema):
    schema = new_schema()
    url = pgserver.schema_url(pg_admin_url.replace("postgres@", "postgres:s3cret@"), schema)
    with agentstate.open(url) as db:
        db.scope("app", "a").append("l", [1, 2])
        db.runs.write("r", [{"seq": 0}, {"seq": 1}], None, create=True)
        info = db.info()
        assert "s3cret" not in json.dumps(info) and "s3cret" not in db.path and ":***@" in db.path
        assert info["schema"] == schema and info["counts"]["list_items"] == 2
        assert info["schema_version"] == pgstore.SCHEMA_VERSION and info["size_bytes"] > 0
        assert db.check() == []
        with RawSQL(db) as c:
            c.execute("UPDATE kv SET length = 5")
            c.execute("DELETE FROM run_entry WHERE seq = 1")
        problems = db.check()
        assert any("list length" in p for p in problems) and any("run r" in p for p in problems)
        with pytest.raises(agentstate.UsageError, match="pg_dump"):
            db.backup("/tmp/x.db")
        with pytest.raises(agentstate.UsageError, match="vacuum"):
            db.vacuum()


def test_the_command_on_a_url(pg_url):
    """agentstate --db postgresql://... works as on a file; backup and vacuum say they are
    for files and exit 1."""
    run = lambda *a: CliRunner().invoke(cli, ["--db", pg_url, *a])  # noqa: E731
    assert run("put", "session:s-1", "k", '{"a": 1}').exit_code == 0
    assert run("append", "session:s-1", "h", "[1, 2]").exit_code == 0
    r = run("--json", "get", "session:s-1", "k")
    assert r.exit_code == 0 and json.loads(r.stdout) == {"key": "k", "value": {"a": 1}, "version": 1}
    assert json.loads(run("--json", "keys", "session:s-1").stdout) == ["h", "k"]
    r = run("--json", "info")
    assert r.exit_code == 0 and json.loads(r.stdout)["counts"]["keys"] == 2
    assert run("check").exit_code == 0
    assert run("--json", "changes").stdout.count("\n") == 2
    for command in (["backup", "/tmp/agentstate-never.db"], ["vacuum"]):
        r = run(*command)
        assert r.exit_code == 1 and "usage_error" in r.stderr and "Traceback" not in r.stderr
    assert not os.path.exists("/tmp/agentstate-never.db")


# The queries docs/postgres.md shows for psql, read from it and run here on a store this test
# fills (tests/test_docs.py runs the page's own example, output and all).
DOCS_QUERIES = re.findall(r'^\$ psql "\$AGENTSTATE_DB" (?:-At )?-c "(.*)"$',
                          (Path(__file__).parent.parent / "docs" / "postgres.md").read_text(), re.M)


def test_psql_reads_the_views(db):
    """The docs' psql queries run on a live store and show what was written."""
    psql = psql_bin()
    if psql is None:
        if os.environ.get("CI"):  # .ci/run installs postgresql, which brings psql
            pytest.fail("psql is missing: the docs' psql queries were not run")
        pytest.skip("psql is not installed here (the postgresql package has it)")
    s = db.sessions.create(ALICE)
    db.scope("session", "s-42").append("history", [{"role": "user"}])
    db.scope("session", "s-42").put("settings", {"model": "small"})
    db.runs.write("run-1", [{"seq": 0, "type": "user"}], None, create=True)
    db.sessions.start_turn(s.id, ALICE)
    out = []
    assert len(DOCS_QUERIES) == 5
    for q in DOCS_QUERIES:
        r = subprocess.run([psql, db._store.url, "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", q],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out.append(r.stdout)
    assert 'session|s-42|history|[{"role":"user"}]|1' in out[0].splitlines()
    assert out[1].strip() == "small" and out[2].splitlines() == ["0|user"]
    assert out[3].splitlines() == ["alice|running|f"]
    assert out[4].splitlines() == ["append|s-42|history", "put|s-42|settings"]


def test_views_and_trim_prune_on_the_server(db):
    """The state view leaves expired keys out; runs shows trimmed histories."""
    kv = db.scope("app", "a")
    kv.put("keep", 1)
    kv.put("gone", 1, ttl=0.05)
    kv.put_bytes("b", b"\xff")
    db.runs.write("r", [{"seq": i} for i in range(5)], None, create=True)
    db.runs.trim("r", before=3)
    time.sleep(0.1)
    with RawSQL(db) as c:
        assert c.execute("SELECT key, value::text FROM state ORDER BY key") == \
            [("b", '"\\\\xff"'), ("keep", "1")]
        assert c.execute("SELECT entries, first_seq FROM runs") == [(2, 3)]


def test_a_long_transaction_that_purged_holds_up_no_other_writer(pg_url):
    """A transaction() block whose writes purged old feed rows keeps them locked until it
    ends; other clients' purge steps skip those rows instead of waiting for it."""
    with agentstate.open(pg_url) as a, agentstate.open(pg_url, busy_timeout=0.5) as b:
        a.set_setting("feed_retention", 1)
        for i in range(200):
            a.scope("app", "old").put(f"k{i % 10}", i)
        time.sleep(1.2)  # all of those are past the retention now
        with a.transaction():
            for i in range(40):  # purge steps inside the block (every 16th write)
                a.scope("app", "block").put(f"k{i}", i)
            t0 = time.monotonic()
            for i in range(40):  # b's own purge steps meet the rows the block holds
                b.scope("app", "other").put(f"k{i}", i)
            assert time.monotonic() - t0 < 20
        assert a.check() == [] and a.changes(a.last_change() - 1)[0].key == "k39"


@pytest.mark.slow  # 15 s: CI runs it with the other long ones (-m slow)
def test_the_benchmark_runs(tmp_path):
    """python -m benchmarks.postgres --quick writes both tables (no speed is asserted)."""
    p = subprocess.run([sys.executable, "-m", "benchmarks.postgres", "--quick", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    md = (tmp_path / "POSTGRES.md").read_text(encoding="utf-8")
    assert "| get |" in md and "| turn: start + finish |" in md and md.count("**") >= 20
    assert "| PostgreSQL, full |" in md and "| SQLite file, full |" in md


def _buffers(url: str, sql: str, args: tuple, warm: tuple | None = None) -> int:
    """Shared buffers a statement touches (functions included), as EXPLAIN ANALYZE counts them,
    once it ran with ``warm`` (plans and catalog cached)."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", warm or args)
        plan = c.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", args).fetchone()[0]
    node = plan[0]["Plan"]
    return node["Shared Hit Blocks"] + node["Shared Read Blocks"]


def test_cost_does_not_grow_with_history_or_list_length(db):
    """A run write, tail and entries(since=), an append and a slice of the end touch as many
    buffers at 20,000 entries or items as at 100 (the server's counterpart of SQLite's
    instruction counts in test_runs.py)."""
    url = db._store.url
    costs = {}
    for n in (100, 20_000):
        run, key = f"r{n}", f"l{n}"
        db.runs.write(run, [{"seq": i} for i in range(n)], None, create=True)
        db.scope("app", "a").append(key, list(range(n)))
        costs[n] = (
            _buffers(url, "SELECT run_write(%s, %s, %s, NULL, false)",
                     (run, [n + 1], [f'{{"seq":{n + 1}}}']), warm=(run, [n], [f'{{"seq":{n}}}'])),
            _buffers(url, "SELECT seq, entry::text FROM run_entry WHERE run_id = %s "
                          "ORDER BY seq DESC LIMIT 20", (run,)),
            _buffers(url, "SELECT seq, entry::text FROM run_entry WHERE run_id = %s AND seq >= %s "
                          "ORDER BY seq LIMIT NULL", (run, n - 19)),
            _buffers(url, "SELECT kv_append('app', 'a', %s, ARRAY['1'], 3, NULL)", (key,)),
            _buffers(url, "SELECT i.item::text FROM kv k JOIN list_item i ON i.list_id = k.list_id "
                          "AND i.idx >= k.length - 2 WHERE k.kind = 'app' AND k.scope_id = 'a' "
                          "AND k.key = %s", (key,)),
        )
    for small, big in zip(costs[100], costs[20_000]):
        assert big <= small * 1.5 + 5, costs
