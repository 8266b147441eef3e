"""The operations on a store this process holds: a file, or a PostgreSQL server's tables.

``LocalOps`` implements :class:`~agentstate.backends.base.Ops` over a
:class:`~agentstate.backends.base.Backend` (a store and its repository
modules). Every write is one ``store.call_write(fn, *args)`` (base.py: one
write path); reads that must agree with each other share one snapshot.
"""

from __future__ import annotations

import contextvars
import copy
import hashlib
import hmac
import json
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

from .._encoding import decode
from .._grants import Rule
from ..errors import Forbidden, InvalidTransition, LeaseLost, NotFound, RunNotFound, UsageError
from . import past
from .base import TOKEN_ID, Backend, Filters, Row, Sets, Stored, Ttl, iso
from .grants import Readable
from .leases import SETTLED, call_state, claim_count, claim_live, effective_status

T = TypeVar("T")


def digest(secret: str) -> str:
    """What is stored of a token or a sign-in id: they are 256 random bits, so a plain
    sha256 suffices."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


_NO_TURN = nullcontext()
# The LeaseLost refusals of the transaction() block the running code is inside of (None:
# outside one): any one of them ends the block with it, writing nothing.
_doomed: contextvars.ContextVar[list[LeaseLost] | None] = contextvars.ContextVar(
    "agentstate_doomed", default=None)


class LocalOps:
    """Operations on a database this process holds."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.store = backend.store
        self.kv, self.runs, self.sessions = backend.kv, backend.runs, backend.sessions
        self.feed, self.tokens, self.admin = backend.feed, backend.tokens, backend.admin
        self.history = backend.history
        self._write = backend.store.call_write
        self._read = backend.store.call_read
        self._fence: str | None = None  # the turn whose lease fences every write (fenced())
        self._vectors: str | None = None  # how kv_nearest scores (vector_search): once decided

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
        if _doomed.get() is not None:  # nested: the outermost block ends it
            with self.store.write():
                yield
            return
        lost: list[LeaseLost] = []
        token = _doomed.set(lost)
        try:
            with self.store.write():
                yield
                if lost:  # a fenced write was refused, even if the block caught it
                    raise lost[0]
        finally:
            _doomed.reset(token)

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        with self.store.snapshot():
            yield

    def exclusive(self) -> AbstractContextManager[Any]:
        """The write lock, so a compare-and-set retried inside cannot lose again."""
        return self.store.write()

    def clock(self) -> float:
        """The store's clock: cutoffs and leases are judged by it."""
        return self.store.clock()

    def in_block(self) -> str | None:
        if self.store.in_write():
            return "transaction()"
        return "snapshot()" if self.store.in_snapshot() else None

    def update_turn(self, kind: str, sid: str, key: str) -> AbstractContextManager[Any]:
        """Held around a whole update(): nothing here (its first try reads a snapshot,
        outside any lock, and a retry takes the write lock)."""
        return _NO_TURN

    def apply_batch(self, ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]]
                    ) -> list[Any]:
        if all(op[0] == "check" for op in ops):
            # Writes nothing: one read, which locks nothing outside a block (inside one it
            # locks what it checks, as the block's reads do). Fenced, the read rides with
            # the fence's check in a write of its own, which locks no key either.
            return (self._read if self._fence is None else self._write)(self.kv.check_many, ops)
        return self._write(self.kv.write_many, ops)  # one write (PostgreSQL: one round trip)

    def fenced(self, turn_id: str, owner: str | None = None) -> LocalOps:
        """These operations with every write fenced by ``turn_id`` (SPEC §14): the check
        runs first inside the write's own transaction (a savepoint of a block's)."""
        ops = copy.copy(self)

        def write(fn: Callable[..., T], *args: Any) -> T:
            try:
                return self.store.call_write(self._fence_then, turn_id, owner, fn, *args)
            except LeaseLost as e:
                lost = _doomed.get()
                if lost is not None:  # dooms the transaction() block it is in (SPEC §16)
                    lost.append(e)
                raise

        ops._write, ops._fence = write, turn_id
        return ops

    def _fence_then(self, c: Any, turn_id: str, owner: str | None, fn: Callable[..., T],
                    *args: Any) -> T:
        self.sessions.check_fence(c, turn_id, owner)
        return fn(c, *args)

    # -- keys -----------------------------------------------------------------

    def kv_get(self, kind: str, sid: str, key: str, raw: bool = False,
               as_of: int | None = None) -> Row | None:
        """(type, stored, version, joined list items); ``raw``: the caller wants bytes."""
        if as_of is not None:
            return self._past(past.get, kind, sid, key, as_of)
        return self._read(self.kv.get, kind, sid, key)

    def kv_put(self, kind: str, sid: str, key: str, type_: str, stored: Stored, size: int,
               items: list[str] | None, if_version: int | None, ttl: Ttl) -> int:
        return self._write(self.kv.put, kind, sid, key, type_, stored, size, items, if_version, ttl)

    def kv_delete(self, kind: str, sid: str, key: str, if_version: int | None) -> bool:
        return self._write(self.kv.delete, kind, sid, key, if_version)

    def kv_append(self, kind: str, sid: str, key: str, texts: list[str], size: int,
                  ttl: Ttl) -> tuple[int, int]:
        return self._write(self.kv.append, kind, sid, key, texts, size, ttl)

    def kv_pop(self, kind: str, sid: str, key: str, n: int) -> list[str]:
        return self._write(self.kv.pop, kind, sid, key, n)[0]

    def kv_touch(self, kind: str, sid: str, key: str, ttl: float | None) -> bool:
        return self._write(self.kv.touch, kind, sid, key, ttl) is not None

    def kv_expires_at(self, kind: str, sid: str, key: str,
                      as_of: int | None = None) -> float | None:
        if as_of is not None:
            return self._past(past.expires_at, kind, sid, key, as_of)
        row = self._read(self.kv.expires_at, kind, sid, key)
        return None if row is None else row[0]

    def kv_slice(self, kind: str, sid: str, key: str, start: int,
                 stop: int | None, as_of: int | None = None) -> list[str] | None:
        if as_of is not None:
            return self._past(past.slice_items, kind, sid, key, start, stop, as_of)
        return self._read(self.kv.slice_items, kind, sid, key, start, stop)

    def kv_length(self, kind: str, sid: str, key: str, as_of: int | None = None) -> int | None:
        if as_of is not None:
            return self._past(past.length, kind, sid, key, as_of)
        return self._read(self.kv.length, kind, sid, key)

    def kv_keys(self, kind: str, sid: str, prefix: str, after: str | None,
                limit: int | None, as_of: int | None = None) -> list[str]:
        if as_of is not None:
            return self._past(past.keys, kind, sid, prefix, after, limit, as_of)
        return self._read(self.kv.keys, kind, sid, prefix, after, limit)

    def kv_get_many(self, kind: str, sid: str, keys: list[str],
                    as_of: int | None = None) -> list[Row]:
        if as_of is not None:
            return self._past(past.get_many, kind, sid, keys, as_of)
        return self._read(self.kv.get_many, kind, sid, keys)

    def kv_items(self, kind: str, sid: str, prefix: str, after: str | None,
                 limit: int | None, as_of: int | None = None) -> list[Row]:
        if as_of is not None:
            return self._past(past.items, kind, sid, prefix, after, limit, as_of)
        return self._read(self.kv.items, kind, sid, prefix, after, limit)

    def kv_clear(self, kind: str, sid: str) -> int:
        return self._write(self.kv.clear, kind, sid)

    # -- the past (SPEC §17) ---------------------------------------------------

    def _past(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(backend, connection, *args)`` of ``past`` in one snapshot: the past a read
        finds cannot be purged under it."""
        with self.store.snapshot() as c:
            return fn(self.backend, c, *args)

    def kv_history(self, kind: str, sid: str, key: str, since: int, before: int | None,
                   limit: int | None) -> list[Row]:
        return self._past(past.revisions, kind, sid, key, since, before, limit)

    def diff(self, since: int, until: int | None, flt: Filters, readable: Readable | None = None,
             after: tuple[str, str, str] | None = None, limit: int | None = None) -> list[Row]:
        return self._past(past.diff, since, until, flt, readable, after, limit)

    def kv_restore(self, kind: str, sid: str, seq: int, keys: list[str] | None) -> int:
        return self._write(self._restore, kind, sid, seq, keys)

    def _restore(self, c: Any, kind: str, sid: str, seq: int, keys: list[str] | None) -> int:
        past.moment(self.backend, c, seq)
        return past.restore(self.backend, c, kind, sid, seq, keys)

    # -- vectors ---------------------------------------------------------------

    def vector_search(self) -> str:
        if self._vectors is None:
            self._vectors = self._read(self.kv.vector_method)
        return self._vectors.partition(":")[0]

    def vector_value(self, values: list[float]) -> tuple[str, Stored, int]:
        return self.kv.vector(values)

    def kv_nearest(self, kind: str, sid: str, ranges: list[tuple[str, str]],
                   query: list[float], metric: str, limit: int) -> list[tuple[str, float]]:
        self.vector_search()
        return self._read(self.kv.nearest, kind, sid, ranges, query, metric, limit,
                          self._vectors)

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
        return self._read(self.runs.head, run_id)

    def run_entries(self, run_id: str, since: int, limit: int | None) -> list[tuple[int, str]]:
        return self._read(self.runs.entries, run_id, since, limit)

    def run_tail(self, run_id: str, n: int) -> list[tuple[int, str]]:
        return self._read(self.runs.tail, run_id, n)

    def run_delete(self, run_id: str) -> bool:
        return self._write(self.runs.delete, run_id)

    def run_list(self, after: str | None, limit: int | None,
                 grants: tuple[Rule, ...] | None = None) -> list[Row]:
        with self.store.snapshot() as c:
            return self.runs.summaries(c, after, limit, grants)

    def run_fork(self, run_id: str, new_id: str, upto: int | None) -> None:
        self._write(self.runs.fork, run_id, new_id, upto)

    def run_trim(self, run_id: str, before: int) -> int:
        return self._write(self.runs.trim, run_id, before)

    def run_prune(self, older_than: float, finished_only: bool) -> list[str]:
        return self._write(self._prune_runs, older_than, finished_only)

    def _prune_runs(self, c: Any, older_than: float, finished_only: bool) -> list[str]:
        return self.runs.prune(c, iso(self.clock() - older_than), finished_only)

    def run_pin(self, run_id: str, pinned: bool) -> bool:
        return self._write(self.runs.pin, run_id, pinned)

    def run_claim(self, run_id: str, call_id: str, call: str | None, lease: float,
                  retry: bool) -> tuple[str, str]:
        if self._fence is None:  # a recorded outcome never changes: one read, no write lock
            last = self._read(self.runs.last_call, run_id, call_id)
            if last is not None:
                entry = decode(last[1])
                if entry.get("type") == "tool_result" and entry.get("status") in SETTLED:
                    return call_state(entry, None, 0.0), last[1]
        return self._write(self._claim, run_id, call_id, call, lease, retry)

    def _claim(self, c: Any, run_id: str, call_id: str, call: str | None, lease: float,
               retry: bool) -> tuple[str, str]:
        """Find the call (one index probe) and claim it if nobody has, or again if it is
        in doubt and ``retry``: a tool_call entry at the next seq, in this transaction."""
        head = self.runs.lock(c, run_id)
        if head is None:
            raise RunNotFound(f"no run {run_id!r}")
        now = self.clock()
        last = self.runs.last_call(c, run_id, call_id)
        tries = 0
        if last is not None:
            entry = decode(last[1])
            fence = entry.get("fence")
            live = claim_live(self._turn_status(c, fence, now)) if isinstance(fence, str) else None
            state = call_state(entry, live, now)
            if state != "in_doubt" or not retry:
                return state, last[1]
            if entry.get("type") != "tool_call":  # a result that settles nothing: its claim's
                claim = self.runs.last_call(c, run_id, call_id, True)
                entry = decode(claim[1]) if claim is not None else {}
            tries = claim_count(entry) + 1
        seq = head[1]
        text = (f'{{"seq":{seq},"type":"tool_call","call_id":{json.dumps(call_id)},'
                f'"at":"{iso(now)}","fence":{json.dumps(self._fence)},"lease":{json.dumps(lease)}'
                + (f',"retry":{tries}' if tries else "")
                + ("," + call[1:-1] if call and call != "{}" else "") + "}")
        self.runs.write(c, run_id, [(seq, text)], None, False)
        return "claimed", text

    def _turn_status(self, c: Any, turn_id: str, now: float) -> str | None:
        row = self.sessions.turn_row(c, turn_id)
        return None if row is None else effective_status(row[3], row[9], now)

    def run_settle(self, run_id: str, call_id: str, outcome: str, retry: int | None) -> str:
        return self._write(self._settle, run_id, call_id, outcome, retry)

    def _settle(self, c: Any, run_id: str, call_id: str, outcome: str, retry: int | None) -> str:
        """Record the outcome of the call's open claim: its newest entry is a tool_call, or a
        result that settles nothing (status neither ok nor error, SPEC §16). ``retry``
        names the claim: one superseded by a newer claim settles nothing."""
        head = self.runs.lock(c, run_id)
        if head is None:
            raise RunNotFound(f"no run {run_id!r}")
        last = self.runs.last_call(c, run_id, call_id)
        entry = None if last is None else decode(last[1])
        if entry is None or (entry.get("type") != "tool_call"
                             and entry.get("status") in SETTLED):
            raise InvalidTransition(
                f"call {call_id!r} of run {run_id!r} is "
                f"{'not claimed' if last is None else 'settled already'}: nothing to settle")
        if retry is not None:
            if entry.get("type") != "tool_call":
                claim = self.runs.last_call(c, run_id, call_id, True)
                entry = decode(claim[1]) if claim is not None else {}
            if claim_count(entry) != retry:
                raise InvalidTransition(
                    f"call {call_id!r} of run {run_id!r}: the claim this settles (retry {retry}) "
                    f"was superseded by a newer one (retry {claim_count(entry)}): nothing recorded")
        seq = head[1]
        text = (f'{{"seq":{seq},"type":"tool_result","call_id":{json.dumps(call_id)},'
                + outcome[1:])
        self.runs.write(c, run_id, [(seq, text)], None, False)
        return text

    # -- sessions and turns ---------------------------------------------------

    def session_create(self, owner: str, metadata: str) -> Row:
        return self._write(self.sessions.create, f"s-{uuid.uuid4().hex}", owner, metadata)

    def session_get(self, session_id: str, name: str, admin: bool) -> Row:
        return self._read(self.sessions.session_row, session_id, name, admin)

    def session_list(self, name: str, admin: bool, after: str | None, limit: int | None) -> list[Row]:
        with self.store.snapshot() as c:
            return self.sessions.sessions(c, name, admin, after, limit)

    def session_fork(self, session_id: str, name: str, admin: bool, seq: int | None,
                     metadata: str | None) -> Row:
        return self._write(self._fork_session, session_id, name, admin, seq, metadata)

    def _fork_session(self, c: Any, session_id: str, name: str, admin: bool, seq: int | None,
                      metadata: str | None) -> Row:
        original = self.sessions.session_row(c, session_id, name, admin)
        if seq is not None:
            past.moment(self.backend, c, seq)
        row = self.sessions.create(c, f"s-{uuid.uuid4().hex}", name,
                                   original[3] if metadata is None else metadata)
        past.fork(self.backend, c, "session", session_id, row[0], seq)
        return row

    def session_delete(self, session_id: str, name: str, admin: bool) -> None:
        self._write(self._delete_session, session_id, name, admin)

    def _delete_session(self, c: Any, session_id: str, name: str, admin: bool) -> None:
        self.sessions.session_row(c, session_id, name, admin)
        self.sessions.delete(c, session_id)

    def session_prune(self, name: str, admin: bool, idle_for: float) -> list[str]:
        if not admin:
            raise Forbidden(f"only an admin may prune sessions ({name} is not one)")
        return self._write(self._prune_sessions, idle_for)

    def _prune_sessions(self, c: Any, idle_for: float) -> list[str]:
        now = self.clock()
        ids = self.sessions.idle(c, iso(now - idle_for), now)
        for session_id in ids:
            self.sessions.delete(c, session_id)
        return ids

    def session_release(self, session_id: str, name: str, admin: bool) -> Row:
        if not admin:
            self._read(self.sessions.session_row, session_id, name, admin)  # others: NotFound first
            raise Forbidden(f"only an admin may release a session's turn ({name} is not one)")
        return self._write(self._release, session_id, name, admin)

    def _release(self, c: Any, session_id: str, name: str, admin: bool) -> Row:
        self.sessions.session_row(c, session_id, name, admin)
        active = self.sessions.active_turn(c, session_id)
        if active is None:
            raise InvalidTransition(f"session {session_id!r} has no active turn to release")
        return self.sessions.move(c, active[0], ("queued", "running"), "failed",
                                  {"error": f"released by {name}"}, None, "release")

    def turn_start(self, session_id: str, name: str, admin: bool, status: str,
                   input_: str | None, lease: float) -> Row:
        return self._write(self._start_turn, session_id, name, admin, status, input_, lease)

    def _start_turn(self, c: Any, session_id: str, name: str, admin: bool, status: str,
                    input_: str | None, lease: float) -> Row:
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
                  to: str | None, what: str, lease: float | None, sets: Sets) -> Row:
        """One state change; ``to`` None keeps the status (a heartbeat)."""
        return self._write(self._move_turn, turn_id, name, admin, from_states, to, what, lease,
                           sets)

    def _move_turn(self, c: Any, turn_id: str, name: str, admin: bool,
                   from_states: tuple[str, ...], to: str | None, what: str, lease: float | None,
                   sets: Sets) -> Row:
        row = self._visible_turn(c, turn_id, name, admin)
        return self.sessions.move(c, turn_id, from_states, row[3] if to is None else to, sets,
                                  lease, what)

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

    def feed_scan(self, since: int, limit: int, flt: Filters, readable: Readable | None = None,
                  upto: int | None = None) -> tuple[list[Row], int]:
        """(change rows after since, head) from one snapshot.

        :raises CursorExpired: some change after ``since`` is no longer kept.
        """
        with self.store.snapshot() as c:
            return self.feed.scan(c, since, limit, flt, readable, upto)

    def feed_head(self) -> int:
        return self._read(self.feed.head)

    def watch(self, since: int, timeout: float | None, limit: int,
              flt: Filters) -> list[Row]:
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

    async def awatch(self, since: int, limit: int, flt: Filters) -> AsyncIterator[Row]:
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
        return self._read(self.feed.settings)

    def set_setting(self, name: str, value: int) -> None:
        self._write(self._set_setting, name, value)

    def _set_setting(self, c: Any, name: str, value: int) -> None:
        if value and name in ("history_retention", "feed_retention") \
                and not self.feed.settings(c)[name]:
            # on again: nothing was kept meanwhile, the past starts now (the feed off: what
            # was written meanwhile has no seq, the past starts after the next change)
            self.history.restart(c, unseen=name == "feed_retention")
        self.feed.set_setting(c, name, value)

    # -- API tokens (SPEC §12) -------------------------------------------------

    def token_create(self, name: str, admin: bool, grants: str | None,
                     expires_in: float | None, first: bool = False) -> str | None:
        """A new token for ``name``: returned once, only its hash is stored."""
        token = secrets.token_urlsafe(32)
        made = self._write(self.tokens.create, digest(token), name, admin, grants, expires_in, first)
        return token if made else None

    def token_find(self, token: str) -> Row | None:
        """(name, admin, grants, seconds until it expires or None) of a live token, or None."""
        d = digest(token)
        row = self._read(self.tokens.find, d)
        if row is None or not hmac.compare_digest(row[0], d):
            return None
        return row[1], bool(row[2]), row[3], row[4]

    def token_list(self) -> list[Row]:
        return [(h[:TOKEN_ID], *rest) for h, *rest in self._read(self.tokens.tokens)]

    def token_revoke(self, name: str, token_id: str) -> int:
        return self._write(self.tokens.revoke, name, token_id)

    def signin_create(self, token: str, lifetime: float) -> str | None:
        signin = secrets.token_urlsafe(32)
        made = self._write(self.tokens.signin_create, digest(signin), digest(token), lifetime)
        return signin if made else None

    def signin_find(self, signin: str) -> Row | None:
        return self._read(self.tokens.signin_find, digest(signin))

    def signin_extend(self, signin: str, lifetime: float) -> None:
        self._write(self.tokens.signin_extend, digest(signin), lifetime)

    def signin_end(self, signin: str) -> None:
        self._write(self.tokens.signin_end, digest(signin))

    # -- administration -------------------------------------------------------

    def check(self) -> list[str]:
        return self.admin.check(self.store)

    def info(self) -> dict[str, Any]:
        return self.admin.info(self.store)

    def store_id(self) -> str:
        return self.admin.store_id(self.store)

    def backup(self, dest: str, progress: Callable[[int, int], None] | None) -> str:
        return self.admin.backup(self.store, dest, progress)

    def vacuum(self) -> dict[str, int]:
        return self.admin.vacuum(self.store)

    def sql(self, query: str, params: tuple[Any, ...] | dict[str, Any]) -> list[dict[str, Any]]:
        """One read-only statement's rows as dicts, from one snapshot of committed state."""
        self.store.check_open()
        if self.store.in_write():
            raise UsageError("sql() reads committed state: call it outside transaction()")
        return self.admin.sql(self.store, query, params)
