"""The systems under test, each behind the same small set of operations.

Every adapter expresses an operation the way a user of that system naturally
would (see ``HOW`` for the words that go into RESULTS.md). An operation a
system cannot express raises :class:`NA`. Writes are one durable transaction
each unless said otherwise.

``open(path, durability)``: ``path`` is a folder owned by this system;
``durability`` is ``"full"`` or ``"normal"`` (SQLite ``synchronous``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import time
from typing import Any

SYNC = {"full": "FULL", "normal": "NORMAL"}
SYNC_NAMES = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_loads = json.loads


class NA(Exception):
    """The system has no natural way to express this operation."""


def _succ(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class Handle:
    """An open store. Methods a system cannot express raise NA."""

    def put(self, key: str, value: Any) -> None:
        raise NA("no keyed values")

    def get(self, key: str) -> Any:
        raise NA("no keyed values")

    def bulk_put(self, items: list[tuple[str, Any]]) -> None:
        raise NA("no keyed values")

    def incr(self, key: str) -> None:
        raise NA("no keyed values")

    def counter(self, key: str) -> int:
        raise NA("no keyed values")

    def set_list(self, key: str, items: list[Any]) -> None:
        raise NA("no lists")

    def append(self, key: str, item: Any) -> None:
        raise NA("no lists")

    def list_prefix(self, prefix: str) -> list[str]:
        raise NA("no key listing")

    def run_create(self, run: str, entries: list[dict], snapshot: dict) -> None:
        raise NA("no run history")

    def prepare_run(self, run: str) -> None:
        """Untimed: whatever a running agent would already hold in memory."""

    def run_write(self, run: str, entry: dict, snapshot: dict) -> None:
        raise NA("no run history")

    def run_tail(self, run: str, n: int, last_seq: int) -> list:
        raise NA("no run history")

    def cold_read(self, what: str) -> Any:
        """The first read after opening: a key (``k:...``) or a run's tail (``r:...``)."""
        kind, name = what.split(":", 1)
        if kind == "k":
            return self.get(name)
        return self.run_tail(name, 20, -1)

    def sync_level(self) -> str:
        return "?"

    def close(self) -> None:
        pass


class System:
    name = ""
    label = ""
    package = ""  # distribution name, for versions
    modules: tuple[str, ...] = ()
    settable = True  # synchronous can be set through the system's own API
    fixed = ""  # what it uses when it cannot be set
    how_sync = ""
    # workloads it can express at all; the rest are "n/a"
    supports: frozenset[str] = frozenset()
    na_why: dict[str, str] = {}
    cold = "kv"  # what the cold-open database holds: kv or run

    def data_tag(self) -> str:
        """Names the on-disk format, so cached files are remade when it changes."""
        import hashlib
        import importlib.metadata as md

        try:
            v = md.version(self.package)
        except md.PackageNotFoundError:
            v = "?"
        extra = ""
        if self.name == "agentstate":  # the schema may change without a version bump
            from agentstate.backends.sqlite import schema

            extra = schema.SCHEMA
        return hashlib.sha256(f"{v}\n{extra}".encode()).hexdigest()[:10]

    def missing(self) -> str | None:
        """None when importable, else why not."""
        for m in self.modules:
            try:
                importlib.import_module(m)
            except ImportError as e:
                return f"not installed ({e.name or m})"
        return None

    def open(self, path: str, durability: str) -> Handle:
        raise NotImplementedError


ALL_WORKLOADS = frozenset(
    ["put", "get", "update", "contention", "append", "history", "list", "coldopen"]
)


# -- agentstate ----------------------------------------------------------------


def _inc(n: Any) -> int:
    return n + 1


class AgentstateHandle(Handle):
    def __init__(self, path: str, durability: str) -> None:
        import agentstate

        self.db = agentstate.open(os.path.join(path, "agentstate.db"), durability=durability)
        self.s = self.db.scope("app", "bench")
        self._runs: Any = None

    def put(self, key, value):
        self.s.put(key, value)

    def get(self, key):
        return self.s.get(key)

    def bulk_put(self, items):
        for i in range(0, len(items), 5000):
            with self.db.transaction():
                for k, v in items[i : i + 5000]:
                    self.s.put(k, v)

    def incr(self, key):
        self.s.update(key, _inc, default=0)

    def counter(self, key):
        return self.s.get(key, 0)

    def set_list(self, key, items):
        self.s.put(key, items)

    def append(self, key, item):
        self.s.append(key, [item])

    def list_prefix(self, prefix):
        return self.s.list(prefix)

    @property
    def runs(self) -> Any:
        if self._runs is None:
            try:
                runs = self.db.runs
                runs.write, runs.tail  # noqa: B018 - the SPEC §3 methods must exist
            except (AttributeError, ImportError, NotImplementedError) as e:
                raise NA(f"db.runs not available yet ({type(e).__name__}: {e})") from None
            self._runs = runs
        return self._runs

    def run_create(self, run, entries, snapshot):
        runs = self.runs
        for i in range(0, max(len(entries), 1), 1000):
            runs.write(run, entries[i : i + 1000], snapshot, create=(i == 0))

    def run_write(self, run, entry, snapshot):
        self.runs.write(run, [entry], snapshot)

    def run_tail(self, run, n, last_seq):
        return self.runs.tail(run, n)

    def sync_level(self):
        return SYNC_NAMES[self.db._store.conn().pragma("synchronous")]

    def close(self):
        self.db.close()


class Agentstate(System):
    name = "agentstate"
    label = "agentstate"
    package = "agentstate"
    # The backend too: open() imports it at first use, and where no bytecode is cached
    # (PYTHONDONTWRITEBYTECODE) compiling it would count as opening (~30 ms of 35).
    modules = ("agentstate", "agentstate.backends.sqlite", "agentstate._sql", "secrets")
    how_sync = '`agentstate.open(path, durability="full")` or `"normal"`'
    supports = ALL_WORKLOADS

    def open(self, path, durability):
        return AgentstateHandle(path, durability)


# -- raw apsw: the floor ---------------------------------------------------------

RAW_SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS item (list TEXT NOT NULL, idx INTEGER NOT NULL, item TEXT NOT NULL,
                                 PRIMARY KEY (list, idx)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS run (id TEXT PRIMARY KEY, snapshot TEXT);
CREATE TABLE IF NOT EXISTS entry (run TEXT NOT NULL, seq INTEGER NOT NULL, entry TEXT NOT NULL,
                                  PRIMARY KEY (run, seq)) WITHOUT ROWID;
"""
_UPSERT = "INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"


class ApswHandle(Handle):
    """The least SQL for each operation: one BEGIN IMMEDIATE ... COMMIT per write."""

    def __init__(self, path: str, durability: str) -> None:
        import apsw

        c = apsw.Connection(os.path.join(path, "raw.db"))
        c.set_busy_timeout(5000)
        c.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)  # plans made once, as agentstate's
        c.pragma("journal_mode", "wal")
        c.pragma("synchronous", SYNC[durability])
        if not c.execute("SELECT 1 FROM sqlite_schema WHERE name = 'entry'").fetchone():
            c.execute("BEGIN IMMEDIATE")
            c.execute(RAW_SCHEMA)
            c.execute("COMMIT")
        self.c = c

    def _tx(self, sql: str, args: Any) -> None:
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute(sql, args)
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def put(self, key, value):
        self._tx(_UPSERT, (key, _dumps(value)))

    def get(self, key):
        row = self.c.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else _loads(row[0])

    def bulk_put(self, items):
        c = self.c
        for i in range(0, len(items), 5000):
            c.execute("BEGIN IMMEDIATE")
            c.executemany(_UPSERT, [(k, _dumps(v)) for k, v in items[i : i + 5000]])
            c.execute("COMMIT")

    def incr(self, key):
        # read, apply a Python function, write: what update(key, fn) has to do
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        try:
            row = c.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            n = _inc(0 if row is None else _loads(row[0]))
            c.execute(_UPSERT, (key, _dumps(n)))
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def counter(self, key):
        v = self.get(key)
        return 0 if v is None else v

    def set_list(self, key, items):
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        c.execute("DELETE FROM item WHERE list = ?", (key,))
        c.executemany("INSERT INTO item VALUES (?, ?, ?)", [(key, i, _dumps(x)) for i, x in enumerate(items)])
        c.execute("COMMIT")

    def append(self, key, item):
        self._tx(
            "INSERT INTO item (list, idx, item) SELECT ?1, coalesce(max(idx) + 1, 0), ?2 FROM item WHERE list = ?1",
            (key, _dumps(item)),
        )

    def list_prefix(self, prefix):
        return [
            r[0]
            for r in self.c.execute(
                "SELECT key FROM kv WHERE key >= ? AND key < ? ORDER BY key", (prefix, _succ(prefix))
            )
        ]

    def run_create(self, run, entries, snapshot):
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        c.execute("INSERT INTO run VALUES (?, ?)", (run, _dumps(snapshot)))
        c.executemany("INSERT INTO entry VALUES (?, ?, ?)", [(run, e["seq"], _dumps(e)) for e in entries])
        c.execute("COMMIT")

    def run_write(self, run, entry, snapshot):
        c = self.c
        c.execute("BEGIN IMMEDIATE")
        try:
            c.execute("INSERT INTO entry VALUES (?, ?, ?)", (run, entry["seq"], _dumps(entry)))
            c.execute("UPDATE run SET snapshot = ? WHERE id = ?", (_dumps(snapshot), run))
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def run_tail(self, run, n, last_seq):
        rows = self.c.execute(
            "SELECT entry FROM entry WHERE run = ? ORDER BY seq DESC LIMIT ?", (run, n)
        ).fetchall()
        return [_loads(r[0]) for r in reversed(rows)]

    def sync_level(self):
        return SYNC_NAMES[self.c.pragma("synchronous")]

    def close(self):
        self.c.close()


class RawApsw(System):
    name = "apsw"
    label = "raw apsw"
    package = "apsw"
    modules = ("apsw",)
    how_sync = "`PRAGMA synchronous` on its connection"
    supports = ALL_WORKLOADS

    def open(self, path, durability):
        return ApswHandle(path, durability)


# -- raw apsw on agentstate's schema, running agentstate's SQL --------------------


class ApswSameHandle(Handle):
    """Raw apsw doing, per call, the very statements agentstate runs (issue 15).

    The original raw apsw baseline above does less than agentstate: no version,
    no change-feed row, no expiry. This one opens agentstate's own schema with
    agentstate's pragmas and runs agentstate's own SQL text (imported from its
    repository modules where it is a constant, copied where it is inline) with
    json.dumps and as little Python as can be: what separates agentstate from it is
    the Python around the same statements (validation, encoding, the call
    chain, group commit's bookkeeping). Housekeeping too: every 8th write the same
    bounded purge. Setup (lists and runs built untimed) goes through agentstate.
    """

    KIND, SID = "app", "bench"

    def __init__(self, path: str, durability: str) -> None:
        import apsw

        import agentstate
        from agentstate.backends import base
        from agentstate.backends.sqlite import admin, feed, history, kv

        self.file = os.path.join(path, "agentstate.db")
        agentstate.open(self.file, durability=durability).close()  # the schema
        c = apsw.Connection(self.file, flags=apsw.SQLITE_OPEN_READWRITE)
        c.set_busy_timeout(5000)
        c.config(apsw.SQLITE_DBCONFIG_ENABLE_QPSG, 1)
        c.pragma("journal_mode", "wal")
        c.pragma("synchronous", SYNC[durability])
        c.pragma("foreign_keys", "ON")
        c.pragma("cache_size", -16384)
        c.pragma("temp_store", "MEMORY")
        self.c, self.dur = c, durability
        self.kv, self.feed, self.admin, self.now_iso = kv, feed, admin, base.now_iso
        self.history = history
        self.every = 8  # as Store.housekeep_every
        self.writes = 0

    def _done(self) -> None:
        """Before COMMIT: the housekeeping agentstate does every 8th write."""
        self.writes += 1
        if self.writes % self.every == 0:
            self.admin.purge(self.c)

    def _keep(self, seq: int, old: Any, sql: str | None = None) -> None:
        """The before-image a write keeps (SPEC §17), as history.keep writes it."""
        if old is not None:
            version, type_, list_id, length, size, expires, value, updated = old
            self.c.execute(sql or self.history._KEEP, (seq, version, type_, value, list_id, length,
                                                       size, updated, expires))

    def _agentstate(self) -> Any:
        import agentstate

        return agentstate.open(self.file, durability=self.dur)

    def put(self, key, value):
        c, kv = self.c, self.kv
        text = _dumps(value)
        now, stamp = time.time(), self.now_iso()
        c.execute("BEGIN IMMEDIATE")
        try:
            old = c.execute(kv._FIND_KEPT, (self.KIND, self.SID, key)).fetchone()
            v = c.execute(kv._UPSERT, {
                "kind": self.KIND, "sid": self.SID, "key": key, "type": "json", "value": text,
                "size": len(text) if text.isascii() else len(text.encode()), "stamp": stamp,
                "now": now, "expires": None}).fetchone()[0]
            seq = c.execute(self.feed._RECORD, (stamp, "kv", "put", self.KIND, self.SID, key, v,
                                                None, None)).fetchone()[0]
            self._keep(seq, old)
            self._done()
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def _get_row(self, key):
        return self.kv.get(self.c, self.KIND, self.SID, key)  # one SELECT, agentstate's

    def get(self, key):
        row = self._get_row(key)
        return None if row is None else _loads(row[1])

    def bulk_put(self, items):
        db = self._agentstate()
        s = db.scope(self.KIND, self.SID)
        try:
            for i in range(0, len(items), 5000):
                with db.transaction():
                    for k, v in items[i : i + 5000]:
                        s.put(k, v)
        finally:
            db.close()

    def incr(self, key):
        # update(): read outside the transaction, +1 in Python, then compare-and-set
        c, kv = self.c, self.kv
        row = self._get_row(key)
        text = _dumps(_inc(0 if row is None else _loads(row[1])))
        now, stamp = time.time(), self.now_iso()
        args = {"kind": self.KIND, "sid": self.SID, "key": key, "type": "json", "value": text,
                "size": len(text), "stamp": stamp, "now": now, "expires": None, "keep": True,
                "if_version": 0 if row is None else row[2]}
        c.execute("BEGIN IMMEDIATE")
        try:
            old = c.execute(kv._FIND_KEPT, (self.KIND, self.SID, key)).fetchone()
            v = c.execute(kv._CREATE_IF_ABSENT if row is None else kv._REPLACE_AT, args).fetchone()[0]
            seq = c.execute(self.feed._RECORD, (stamp, "kv", "put", self.KIND, self.SID, key, v,
                                                None, None)).fetchone()[0]
            self._keep(seq, old)
            self._done()
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def counter(self, key):
        v = self.get(key)
        return 0 if v is None else v

    def set_list(self, key, items):
        db = self._agentstate()
        try:
            db.scope(self.KIND, self.SID).put(key, items)
        finally:
            db.close()

    def append(self, key, item):
        c, kv = self.c, self.kv
        text = _dumps(item)
        stamp = self.now_iso()
        c.execute("BEGIN IMMEDIATE")
        try:
            row = c.execute(kv._FIND, (self.KIND, self.SID, key)).fetchone()
            version, _type, list_id, length, size = row[:5]
            c.execute(kv._EXTEND, (self.KIND, self.SID, key, version + 1, length + 1,
                                   size + len(text) + 1, stamp, True, None))
            c.execute(kv._ADD_ITEMS, (list_id, length, text))
            seq = c.execute(self.feed._RECORD, (stamp, "kv", "append", self.KIND, self.SID, key,
                                                version + 1, length, 1)).fetchone()[0]
            self._keep(seq, row, self.history._KEEP_IF_ON)
            self._done()
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def run_create(self, run, entries, snapshot):
        db = self._agentstate()
        try:
            for i in range(0, max(len(entries), 1), 1000):
                db.runs.write(run, entries[i : i + 1000], snapshot, create=(i == 0))
        finally:
            db.close()

    def run_write(self, run, entry, snapshot):
        # agentstate's _runs_repo.write for one entry, its statements copied
        c = self.c
        text, snap = _dumps(entry), _dumps(snapshot)
        stamp = self.now_iso()
        c.execute("BEGIN IMMEDIATE")
        try:
            next_seq, _first = c.execute("SELECT next_seq, first_seq FROM run WHERE id = ?",
                                         (run,)).fetchone()
            c.execute("""UPDATE run SET snapshot = coalesce(?1, snapshot), next_seq = ?2, updated_at = ?3
                         WHERE id = ?4 AND next_seq = ?5""", (snap, next_seq + 1, stamp, run, next_seq))
            c.execute("INSERT INTO run_entry (run_id, seq, entry) VALUES (?, ?, ?)", (run, next_seq, text))
            c.execute(self.feed._RECORD, (stamp, "run", "write", None, run, None, None, next_seq,
                                          1)).fetchone()
            self._done()
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    def run_tail(self, run, n, last_seq):
        rows = self.c.execute(
            "SELECT entry FROM run_entry WHERE run_id = ? ORDER BY seq DESC LIMIT ?", (run, n)
        ).fetchall()
        return [_loads(r[0]) for r in reversed(rows)]

    def sync_level(self):
        return SYNC_NAMES[self.c.pragma("synchronous")]

    def close(self):
        self.c.close()


class ApswSame(System):
    name = "apsw_same"
    label = "raw apsw, same SQL"
    package = "apsw"
    modules = ("apsw", "agentstate")
    how_sync = "`PRAGMA synchronous` on its connection"
    supports = frozenset(["put", "get", "update", "append", "history"])
    na_why = {w: "a baseline for the per-call cost of writes and reads only"
              for w in ("contention", "list", "coldopen")}

    def open(self, path, durability):
        return ApswSameHandle(path, durability)


# -- diskcache -------------------------------------------------------------------


class DiskcacheHandle(Handle):
    def __init__(self, path: str, durability: str) -> None:
        import diskcache

        level = {"full": 2, "normal": 1}[durability]
        self.c = diskcache.Cache(os.path.join(path, "cache"), sqlite_synchronous=level)

    def put(self, key, value):
        self.c.set(key, value)

    def get(self, key):
        return self.c.get(key)

    def bulk_put(self, items):
        for i in range(0, len(items), 5000):
            with self.c.transact():
                for k, v in items[i : i + 5000]:
                    self.c.set(k, v)

    def incr(self, key):
        self.c.incr(key)  # atomic in diskcache

    def counter(self, key):
        return self.c.get(key, 0)

    def set_list(self, key, items):
        with self.c.transact():
            for x in items:
                self.c.push(x, prefix=key)

    def append(self, key, item):
        self.c.push(item, prefix=key)  # diskcache's own queue append

    def list_prefix(self, prefix):
        out = []
        for k in self.c.iterkeys():  # keys in sorted order; no prefix query
            if k.startswith(prefix):
                out.append(k)
            elif k > prefix:
                break
        return out

    def run_create(self, run, entries, snapshot):
        for i in range(0, len(entries), 5000):
            with self.c.transact():
                for e in entries[i : i + 5000]:
                    self.c.set(f"{run}:e:{e['seq']:09d}", e)
                self.c.set(f"{run}:snapshot", snapshot)

    def run_write(self, run, entry, snapshot):
        with self.c.transact():
            self.c.set(f"{run}:e:{entry['seq']:09d}", entry)
            self.c.set(f"{run}:snapshot", snapshot)

    def run_tail(self, run, n, last_seq):
        if last_seq < 0:  # cold open: the snapshot tells where the history ends
            last_seq = self.c.get(f"{run}:snapshot")["turn"]
        return [self.c.get(f"{run}:e:{s:09d}") for s in range(max(0, last_seq - n + 1), last_seq + 1)]

    def sync_level(self):
        return SYNC_NAMES[self.c._sql("PRAGMA synchronous").fetchone()[0]]

    def close(self):
        self.c.close()


class Diskcache(System):
    name = "diskcache"
    label = "diskcache"
    package = "diskcache"
    modules = ("diskcache",)
    how_sync = "`Cache(dir, sqlite_synchronous=2)` or `1` (its default is 1, NORMAL)"
    supports = ALL_WORKLOADS

    def open(self, path, durability):
        return DiskcacheHandle(path, durability)


# -- sqlitedict ------------------------------------------------------------------


class SqlitedictHandle(Handle):
    def __init__(self, path: str, durability: str) -> None:
        from sqlitedict import SqliteDict

        self.d = SqliteDict(
            os.path.join(path, "dict.sqlite"), tablename="kv", autocommit=False,
            journal_mode="WAL", outer_stack=False,
        )
        # sqlitedict hard-codes synchronous=OFF on its connection; its public
        # conn.execute runs on that same connection.
        self.d.conn.execute(f"PRAGMA synchronous={SYNC[durability]}")

    def put(self, key, value):
        self.d[key] = value
        self.d.commit()

    def get(self, key):
        return self.d.get(key)

    def bulk_put(self, items):
        for i in range(0, len(items), 5000):
            self.d.update(items[i : i + 5000])
            self.d.commit()

    def incr(self, key):  # no atomic increment: read-modify-write
        self.d[key] = self.d.get(key, 0) + 1
        self.d.commit()

    def counter(self, key):
        return self.d.get(key, 0)

    def set_list(self, key, items):
        self.d[key] = list(items)
        self.d.commit()

    def append(self, key, item):  # read-modify-write of the whole list
        lst = self.d.get(key, [])
        lst.append(item)
        self.d[key] = lst
        self.d.commit()

    def list_prefix(self, prefix):
        return [k for k in self.d.keys() if k.startswith(prefix)]

    def run_create(self, run, entries, snapshot):
        for i in range(0, len(entries), 5000):
            self.d.update({f"{run}:e:{e['seq']:09d}": e for e in entries[i : i + 5000]})
            self.d.commit()
        self.d[f"{run}:snapshot"] = snapshot
        self.d.commit()

    def run_write(self, run, entry, snapshot):
        self.d[f"{run}:e:{entry['seq']:09d}"] = entry
        self.d[f"{run}:snapshot"] = snapshot
        self.d.commit()  # both in one transaction

    def run_tail(self, run, n, last_seq):
        if last_seq < 0:
            last_seq = self.d[f"{run}:snapshot"]["turn"]
        return [self.d[f"{run}:e:{s:09d}"] for s in range(max(0, last_seq - n + 1), last_seq + 1)]

    def sync_level(self):
        return SYNC_NAMES[self.d.conn.select_one("PRAGMA synchronous")[0]]

    def close(self):
        self.d.close()


class Sqlitedict(System):
    name = "sqlitedict"
    label = "sqlitedict"
    package = "sqlitedict"
    modules = ("sqlitedict",)
    how_sync = "`d.conn.execute('PRAGMA synchronous=...')` (it sets OFF itself)"
    supports = ALL_WORKLOADS

    def open(self, path, durability):
        return SqlitedictHandle(path, durability)


# -- langgraph SqliteStore ---------------------------------------------------------


def _sqlite3_conn(file: str, durability: str, autocommit: bool) -> Any:
    import sqlite3

    conn = sqlite3.connect(file, check_same_thread=False, **({"isolation_level": None} if autocommit else {}))
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={SYNC[durability]}")
    return conn


def _ns(key: str) -> tuple[tuple[str, ...], str]:
    head, sep, tail = key.partition(":")
    return (("kv", head), tail) if sep else (("kv",), key)


class LgStoreHandle(Handle):
    def __init__(self, path: str, durability: str) -> None:
        from langgraph.store.sqlite import SqliteStore

        self.conn = _sqlite3_conn(os.path.join(path, "store.sqlite"), durability, autocommit=True)
        self.s = SqliteStore(self.conn)
        self.s.setup()

    def put(self, key, value):
        self.s.put(*_ns(key), value)

    def get(self, key):
        item = self.s.get(*_ns(key))
        return None if item is None else item.value

    def bulk_put(self, items):
        from langgraph.store.base import PutOp

        for i in range(0, len(items), 5000):
            self.s.batch([PutOp(*_ns(k), v) for k, v in items[i : i + 5000]])

    def incr(self, key):  # no atomic increment: read-modify-write
        item = self.s.get(*_ns(key))
        self.s.put(*_ns(key), {"n": (item.value["n"] if item else 0) + 1})

    def counter(self, key):
        item = self.s.get(*_ns(key))
        return item.value["n"] if item else 0

    def set_list(self, key, items):
        self.s.put(*_ns(key), {"items": list(items)})

    def append(self, key, item):  # read-modify-write of the whole list
        cur = self.s.get(*_ns(key))
        items = cur.value["items"] if cur else []
        items.append(item)
        self.s.put(*_ns(key), {"items": items})

    def list_prefix(self, prefix):
        # keys are namespaced: "k042:00001" lives at ("kv", "k042"), key "00001"
        ns, rest = _ns(prefix)
        if rest:
            raise NA("only namespace prefixes")
        return [f"{ns[1]}:{it.key}" for it in self.s.search(ns, limit=10**9)]

    def run_create(self, run, entries, snapshot):
        from langgraph.store.base import PutOp

        for i in range(0, len(entries), 5000):
            self.s.batch([PutOp(("runs", run, "e"), f"{e['seq']:09d}", e) for e in entries[i : i + 5000]])
        self.s.put(("runs", run), "snapshot", snapshot)

    def run_write(self, run, entry, snapshot):
        from langgraph.store.base import PutOp

        self.s.batch([  # one transaction
            PutOp(("runs", run, "e"), f"{entry['seq']:09d}", entry),
            PutOp(("runs", run), "snapshot", snapshot),
        ])

    def run_tail(self, run, n, last_seq):
        # search(ns, limit=n) sorts by updated_at, whose same-second ties give the
        # wrong entries; the seq keys are known, so one batch of gets
        from langgraph.store.base import GetOp

        if last_seq < 0:
            last_seq = self.s.get(("runs", run), "snapshot").value["turn"]
        ns = ("runs", run, "e")
        items = self.s.batch([GetOp(ns, f"{s:09d}") for s in range(max(0, last_seq - n + 1), last_seq + 1)])
        return [it.value for it in items]

    def sync_level(self):
        return SYNC_NAMES[self.conn.execute("PRAGMA synchronous").fetchone()[0]]

    def close(self):
        self.conn.close()


class LgStore(System):
    name = "lg_store"
    label = "langgraph SqliteStore"
    package = "langgraph-checkpoint-sqlite"
    modules = ("langgraph.store.sqlite",)
    how_sync = "we pass it our own sqlite3 connection with `PRAGMA synchronous`"
    supports = ALL_WORKLOADS

    def open(self, path, durability):
        return LgStoreHandle(path, durability)


# -- langgraph SqliteSaver (checkpointer) ---------------------------------------------


class LgSaverHandle(Handle):
    def __init__(self, path: str, durability: str) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver

        self.conn = _sqlite3_conn(os.path.join(path, "checkpoints.sqlite"), durability, autocommit=False)
        self.saver = SqliteSaver(self.conn)
        self.saver.setup()
        self.cfg: dict[str, dict] = {}

    def _checkpoint(self, entry: dict, snapshot: dict) -> dict:
        from langgraph.checkpoint.base import empty_checkpoint
        from langgraph.checkpoint.base.id import uuid6

        cp = empty_checkpoint()
        cp["id"] = str(uuid6(clock_seq=entry["seq"]))
        cp["channel_values"] = {"state": snapshot, "entry": entry}
        cp["channel_versions"] = {"state": entry["seq"] + 1, "entry": entry["seq"] + 1}
        return cp

    def _put(self, run: str, entry: dict, snapshot: dict) -> None:
        cfg = self.cfg.get(run) or {"configurable": {"thread_id": run, "checkpoint_ns": ""}}
        self.cfg[run] = self.saver.put(
            cfg, self._checkpoint(entry, snapshot), {"source": "loop", "step": entry["seq"]}, {}
        )

    def run_create(self, run, entries, snapshot):
        for e in entries:
            self._put(run, e, snapshot)

    def prepare_run(self, run):
        t = self.saver.get_tuple({"configurable": {"thread_id": run, "checkpoint_ns": ""}})
        if t is not None:
            self.cfg[run] = t.config

    def run_write(self, run, entry, snapshot):
        self._put(run, entry, snapshot)  # one checkpoint per step

    def run_tail(self, run, n, last_seq):
        ts = self.saver.list({"configurable": {"thread_id": run, "checkpoint_ns": ""}}, limit=n)
        return [t.checkpoint["channel_values"]["entry"] for t in reversed(list(ts))]

    def cold_read(self, what):
        run = what.split(":", 1)[1]
        return self.saver.get_tuple({"configurable": {"thread_id": run, "checkpoint_ns": ""}})

    def sync_level(self):
        return SYNC_NAMES[self.conn.execute("PRAGMA synchronous").fetchone()[0]]

    def close(self):
        self.conn.close()


class LgSaver(System):
    name = "lg_saver"
    label = "langgraph SqliteSaver"
    package = "langgraph-checkpoint-sqlite"
    modules = ("langgraph.checkpoint.sqlite",)
    how_sync = "we pass it our own sqlite3 connection with `PRAGMA synchronous`"
    supports = frozenset(["history", "coldopen"])
    na_why = {
        w: "a checkpointer keeps whole-graph checkpoints, not keyed values"
        for w in ("put", "get", "update", "contention", "list")
    } | {"append": "no keyed list; its per-step write is measured under history"}
    cold = "run"

    def open(self, path, durability):
        return LgSaverHandle(path, durability)


# -- openai-agents SQLiteSession ---------------------------------------------------------


class OaiHandle(Handle):
    def __init__(self, path: str, durability: str) -> None:
        self.file = os.path.join(path, "sessions.sqlite")
        self.loop = asyncio.new_event_loop()
        self.sessions: dict[str, Any] = {}

    def _s(self, sid: str) -> Any:
        s = self.sessions.get(sid)
        if s is None:
            from agents import SQLiteSession

            s = self.sessions[sid] = SQLiteSession(sid, self.file)
        return s

    def set_list(self, key, items):
        self.loop.run_until_complete(self._s(key).add_items(list(items)))

    def append(self, key, item):
        self.loop.run_until_complete(self._s(key).add_items([item]))

    def run_create(self, run, entries, snapshot):
        for i in range(0, len(entries), 5000):
            self.loop.run_until_complete(self._s(run).add_items(entries[i : i + 5000]))

    def prepare_run(self, run):
        self._s(run)

    def run_write(self, run, entry, snapshot):  # no snapshot: the session holds items only
        self.loop.run_until_complete(self._s(run).add_items([entry]))

    def run_tail(self, run, n, last_seq):
        return self.loop.run_until_complete(self._s(run).get_items(limit=n))

    def sync_level(self):
        s = self._s("_probe")
        conn = s._get_connection()  # private: only to report what it uses
        return SYNC_NAMES[conn.execute("PRAGMA synchronous").fetchone()[0]]

    def close(self):
        for s in self.sessions.values():
            s.close()
        self.loop.close()


class OaiSession(System):
    name = "oai_session"
    label = "openai-agents SQLiteSession"
    package = "openai-agents"
    modules = ("agents",)
    settable = False
    fixed = "FULL"
    how_sync = "cannot be set (no option; it opens its own connections): SQLite's default, FULL"
    supports = frozenset(["append", "history", "coldopen"])
    na_why = {
        w: "a session holds one conversation's items, not keyed values"
        for w in ("put", "get", "update", "contention", "list")
    }
    cold = "run"

    def open(self, path, durability):
        return OaiHandle(path, durability)


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (Agentstate(), RawApsw(), ApswSame(), Diskcache(), Sqlitedict(), LgStore(), LgSaver(), OaiSession())
}


def get(name: str) -> System:
    return SYSTEMS[name]
