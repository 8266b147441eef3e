"""The backend seam: the store's logical operations, one method each, one transaction each.

The public objects (``Scope``, ``RunStore``, ``Sessions``, ``Database``) validate
and encode, then call one operation here; they never ask which backend they
run on. ``LocalOps`` runs the operations on a database it holds: a connection
manager (``write()``/``read()``/``snapshot()``) and repository modules (``kv``,
``runs``, ``sessions``, ``feed``, ``admin``) with the same functions for each
backend — SQLite's (``_connection.Store``, ``_kv``, ...) or PostgreSQL's. The
remote client supplies the same operations over HTTP (``_remote.RemoteOps``).

Rows cross the seam in the repositories' shapes (JSON as text, encoded once).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import ModuleType
from typing import Any

from . import _sql
from .errors import Forbidden, InvalidTransition, NotFound, UsageError

Row = tuple[Any, ...]


def token_digest(token: str) -> str:
    """What is stored of a token: tokens are 256 random bits, so a plain sha256 suffices."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


_NO_TURN = nullcontext()


class LocalOps:
    """Operations on a database this process holds (a file, or a server's tables)."""

    can_lock = True  # update() may retry under the write lock; transaction() exists

    def __init__(self, store: Any, repos: ModuleType) -> None:
        self.store = store
        self.kv, self.runs, self.sessions = repos.kv, repos.runs, repos.sessions
        self.feed, self.admin = repos.feed, repos.admin
        self.tokens = getattr(repos, "tokens", None)
        self.clock: Callable[[], float] = repos.clock  # the store's clock, for cutoffs
        # fn(connection, *args) in one write transaction: grouped with other
        # threads' writes where the store commits in groups (SQLite's Store).
        self._write: Callable[..., Any] = getattr(store, "call_write", None) or self._one_write
        # fn(connection, *args) as one read (SQLite's Store does it without a context manager).
        self._read: Callable[..., Any] = getattr(store, "call_read", None) or self._one_read
        # db.sql(): the backend's admin module runs it (PostgreSQL's); SQLite's is _sql.read.
        self._sql: Callable[..., Any] = getattr(self.admin, "sql", None) or _sql.read

    def _one_write(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.store.write() as c:
            return fn(c, *args)

    def _one_read(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.store.read() as c:
            return fn(c, *args)

    # -- the database ---------------------------------------------------------

    @property
    def target(self) -> str:
        return self.store.path

    @property
    def durability(self) -> str:
        return self.store.durability

    @property
    def closed(self) -> bool:
        return self.store.closed

    def check_open(self) -> None:
        self.store.check_open()

    def close(self) -> None:
        self.store.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self.store.write():
            yield

    def exclusive(self) -> Any:
        """The write lock, so a compare-and-set retried inside cannot lose again."""
        return self.store.write()

    def update_turn(self, kind: str, sid: str, key: str) -> Any:
        """Held around a whole update(): nothing here (its first try reads a snapshot,
        outside any lock, and a retry takes the write lock)."""
        return _NO_TURN

    def apply_batch(self, ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]],
                    call: Callable[..., Any]) -> list[Any]:
        with self.store.write():
            return [call(*op) for op in ops]

    # -- keys -----------------------------------------------------------------

    def kv_get(self, kind: str, sid: str, key: str, raw: bool = False) -> Row | None:
        """(type, stored, version, joined list items); ``raw``: the caller wants bytes."""
        return self._read(self.kv.get, kind, sid, key)

    def kv_put(self, kind: str, sid: str, key: str, type_: str, stored: Any, size: int,
               items: list[str] | None, if_version: int | None, ttl: Any) -> int:
        return self._write(self.kv.put, kind, sid, key, type_, stored, size, items, if_version, ttl)

    def kv_delete(self, kind: str, sid: str, key: str, if_version: int | None) -> bool:
        return self._write(self.kv.delete, kind, sid, key, if_version)

    def kv_append(self, kind: str, sid: str, key: str, texts: list[str], size: int,
                  ttl: Any) -> tuple[int, int]:
        return self._write(self.kv.append, kind, sid, key, texts, size, ttl)

    def kv_pop(self, kind: str, sid: str, key: str, n: int) -> list[str]:
        return self._write(self.kv.pop, kind, sid, key, n)[0]

    def kv_touch(self, kind: str, sid: str, key: str, ttl: float | None) -> bool:
        return self._write(self.kv.touch, kind, sid, key, ttl) is not None

    def kv_expires_at(self, kind: str, sid: str, key: str) -> float | None:
        with self.store.read() as c:
            row = self.kv.expires_at(c, kind, sid, key)
        return None if row is None else row[0]

    def kv_slice(self, kind: str, sid: str, key: str, start: int, stop: int | None) -> list[str] | None:
        with self.store.read() as c:
            return self.kv.slice_items(c, kind, sid, key, start, stop)

    def kv_length(self, kind: str, sid: str, key: str) -> int | None:
        with self.store.read() as c:
            return self.kv.length(c, kind, sid, key)

    def kv_keys(self, kind: str, sid: str, prefix: str, after: str | None,
                limit: int | None) -> list[str]:
        with self.store.read() as c:
            return self.kv.keys(c, kind, sid, prefix, after, limit)

    # -- runs -----------------------------------------------------------------

    def run_write(self, run_id: str, rows: list[tuple[int, str]], snapshot: str | None,
                  create: bool) -> None:
        self._write(self.runs.write, run_id, rows, snapshot, create)

    def run_read(self, run_id: str) -> tuple[Row, list[tuple[int, str]]] | None:
        """(head, every entry row) from one snapshot, or None."""
        with self.store.snapshot() as c:
            head = self.runs.head(c, run_id)
            if head is None:
                return None
            return head, self.runs.entries(c, run_id, 0, None)

    def run_head(self, run_id: str) -> Row | None:
        with self.store.read() as c:
            return self.runs.head(c, run_id)

    def run_entries(self, run_id: str, since: int, limit: int | None) -> list[tuple[int, str]]:
        with self.store.read() as c:
            return self.runs.entries(c, run_id, since, limit)

    def run_tail(self, run_id: str, n: int) -> list[tuple[int, str]]:
        with self.store.read() as c:
            return self.runs.tail(c, run_id, n)

    def run_delete(self, run_id: str) -> bool:
        return self._write(self.runs.delete, run_id)

    def run_list(self, after: str | None, limit: int | None) -> list[Row]:
        with self.store.snapshot() as c:
            return self.runs.summaries(c, after, limit)

    def run_fork(self, run_id: str, new_id: str, upto: int | None) -> None:
        with self.store.write() as c:
            self.runs.fork(c, run_id, new_id, upto)

    def run_trim(self, run_id: str, before: int) -> int:
        with self.store.write() as c:
            return self.runs.trim(c, run_id, before)

    def run_prune(self, older_than: float, finished_only: bool) -> list[str]:
        with self.store.write() as c:
            return self.runs.prune(c, self.feed.iso(self.clock() - older_than), finished_only)

    # -- sessions and turns ---------------------------------------------------

    def session_create(self, owner: str, metadata: str) -> Row:
        with self.store.write() as c:
            return self.sessions.create(c, f"s-{uuid.uuid4().hex}", owner, metadata)

    def session_get(self, session_id: str, name: str, admin: bool) -> Row:
        with self.store.read() as c:
            return self.sessions.session_row(c, session_id, name, admin)

    def session_list(self, name: str, admin: bool, after: str | None, limit: int | None) -> list[Row]:
        with self.store.snapshot() as c:
            return self.sessions.sessions(c, name, admin, after, limit)

    def session_delete(self, session_id: str, name: str, admin: bool) -> None:
        with self.store.write() as c:
            self.sessions.session_row(c, session_id, name, admin)
            self.sessions.delete(c, session_id)

    def session_prune(self, name: str, admin: bool, idle_for: float) -> list[str]:
        if not admin:
            raise Forbidden(f"only an admin may prune sessions ({name} is not one)")
        with self.store.write() as c:
            now = self.clock()
            ids = self.sessions.idle(c, self.feed.iso(now - idle_for), now)
            for session_id in ids:
                self.sessions.delete(c, session_id)
        return ids

    def session_release(self, session_id: str, name: str, admin: bool) -> Row:
        if not admin:
            with self.store.read() as c:
                self.sessions.session_row(c, session_id, name, admin)  # others: NotFound first
            raise Forbidden(f"only an admin may release a session's turn ({name} is not one)")
        with self.store.write() as c:
            self.sessions.session_row(c, session_id, name, admin)
            active = self.sessions.active_turn(c, session_id)
            if active is None:
                raise InvalidTransition(f"session {session_id!r} has no active turn to release")
            return self.sessions.move(c, active[0], ("queued", "running"), "failed",
                                      {"error": f"released by {name}"}, None, "release")

    def turn_start(self, session_id: str, name: str, admin: bool, status: str,
                   input_: str | None, lease: float) -> Row:
        with self.store.write() as c:
            self.sessions.session_row(c, session_id, name, admin)
            return self.sessions.start(c, f"t-{uuid.uuid4().hex}", session_id, status, input_, lease)

    def turn_get(self, turn_id: str, name: str, admin: bool) -> Row:
        with self.store.snapshot() as c:
            return self._visible_turn(c, turn_id, name, admin)

    def turn_list(self, session_id: str, name: str, admin: bool, after: str | None,
                  limit: int | None) -> list[Row]:
        with self.store.snapshot() as c:
            self.sessions.session_row(c, session_id, name, admin)
            return self.sessions.turns(c, session_id, after, limit)

    def turn_find(self, name: str, admin: bool, live: tuple[str, ...], expired: bool,
                  after: str | None, limit: int | None) -> list[Row]:
        with self.store.snapshot() as c:
            return self.sessions.turns_by_status(c, name, admin, live, expired, self.clock(),
                                                 after, limit)

    def turn_move(self, turn_id: str, name: str, admin: bool, from_states: tuple[str, ...],
                  to: str, what: str, lease: float | None, sets: dict[str, Any]) -> Row:
        """One state change; ``to`` None keeps the status (a heartbeat)."""
        with self.store.write() as c:
            row = self._visible_turn(c, turn_id, name, admin)
            return self.sessions.move(c, turn_id, from_states, row[3] if to is None else to,
                                      sets, lease, what)

    def _visible_turn(self, c: Any, turn_id: str, name: str, admin: bool) -> Row:
        """The turn's row if the principal may see its session; NotFound alike otherwise."""
        row = self.sessions.turn_row(c, turn_id)
        if row is None:
            raise NotFound(f"no turn {turn_id!r}")
        try:
            self.sessions.session_row(c, row[1], name, admin)
        except NotFound:
            raise NotFound(f"no turn {turn_id!r}") from None
        return row

    # -- the change feed and settings -----------------------------------------

    def feed_scan(self, since: int, limit: int, flt: dict[str, Any]) -> tuple[list[Row], int]:
        """(change rows after since, head) from one snapshot.

        :raises CursorExpired: some change after ``since`` is no longer kept.
        """
        with self.store.snapshot() as c:
            return self.feed.scan(c, since, limit, flt)

    def feed_head(self) -> int:
        with self.store.read() as c:
            return self.feed.head(c)

    def watch(self, since: int, timeout: float | None, limit: int,
              flt: dict[str, Any]) -> list[Row]:
        """Change rows after ``since``; if none yet, wait for one (or ``timeout``: [])."""
        if self.store.in_write():
            raise UsageError("watch() inside transaction() would wait for itself: call it outside")
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = since
        with self.store.waiter() as waiter:
            while True:
                mark = waiter.mark()  # before the query: a commit after it is seen
                found, head = self.feed_scan(cursor, limit, flt)
                if found:
                    return found
                cursor = max(cursor, head)  # nothing up to head matches: only past it next time
                if not waiter.wait(mark, deadline):
                    return []

    async def awatch(self, since: int, limit: int, flt: dict[str, Any]) -> AsyncIterator[Row]:
        """Every change row after ``since``, forever; the event loop never waits on the store."""
        import asyncio

        cursor = since
        with self.store.waiter() as waiter:
            while True:
                mark = waiter.mark()
                found, head = await asyncio.to_thread(self.feed_scan, cursor, limit, flt)
                if found:
                    for row in found:
                        yield row
                    cursor = found[-1][0]
                    continue
                cursor = max(cursor, head)
                await waiter.await_change(mark)

    def settings(self) -> dict[str, Any]:
        with self.store.read() as c:
            return self.feed.settings(c)

    def set_setting(self, name: str, value: Any) -> None:
        with self.store.write() as c:
            self.feed.set_setting(c, name, value)

    # -- API tokens (SPEC §12) -------------------------------------------------

    def token_create(self, name: str, admin: bool) -> str:
        """A new token for ``name``: returned once, only its hash is stored."""
        token = secrets.token_urlsafe(32)
        with self.store.write() as c:
            self.tokens.create(c, token_digest(token), name, admin)
        return token

    def token_principal(self, token: str) -> tuple[str, bool] | None:
        """(name, admin) of a valid token, or None."""
        digest = token_digest(token)
        with self.store.read() as c:
            row = self.tokens.find(c, digest)
        if row is None or not hmac.compare_digest(row[0], digest):
            return None
        return row[1], bool(row[2])

    def token_list(self) -> list[tuple[Any, ...]]:
        with self.store.read() as c:
            return self.tokens.names(c)

    def token_revoke(self, name: str) -> int:
        with self.store.write() as c:
            return self.tokens.revoke(c, name)

    # -- administration -------------------------------------------------------

    def check(self) -> list[str]:
        return self.admin.check(self.store)

    def info(self) -> dict[str, Any]:
        return self.admin.info(self.store)

    def backup(self, dest: Any, progress: Callable[[int, int], None] | None) -> str:
        return self.admin.backup(self.store, dest, progress)

    def vacuum(self) -> dict[str, int]:
        return self.admin.vacuum(self.store)

    def sql(self, query: str, params: tuple[Any, ...] | dict[str, Any]) -> list[dict[str, Any]]:
        """One read-only statement's rows as dicts, from one snapshot of committed state."""
        self.store.check_open()
        if self.store.in_write():
            raise UsageError("sql() reads committed state: call it outside transaction()")
        return self._sql(self.store, query, params)
