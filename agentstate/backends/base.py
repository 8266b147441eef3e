"""What every backend supplies, and the rules all of them share.

The seam is :class:`Ops`: the store's logical operations, one method each.
The public objects (``Database``, ``Scope``, ``RunStore``, ``Sessions``)
validate and encode, call one operation, and never ask which backend they run
on. Two transports implement it (httpx's ``BaseTransport`` is the model):

- :class:`~agentstate.backends.local.LocalOps` runs the operations on a store
  this process holds: a :class:`Backend`, i.e. a :class:`Store` (connections
  and transactions) with the repository modules ``kv``, ``runs``,
  ``sessions``, ``feed``, ``tokens`` and ``admin`` — one function per logical
  operation, the same names and arguments in ``backends/sqlite/`` and
  ``backends/postgres/`` (``tests/test_backends.py`` compares them).
- :class:`~agentstate.backends.remote.RemoteOps` sends them to
  ``agentstate serve`` over HTTP.

One write path per backend: every write operation is
``store.call_write(fn, *args)``, ``fn(connection, *args)`` being the
repository function (or a few of them) that does the whole write in one
transaction — grouped with other threads' writes where the store commits in
groups (SQLite), a savepoint inside a ``transaction()`` block. ``store.write()``
is only for ``transaction()`` blocks and a remote-free ``update()`` retry.

Rows cross the seam in the repositories' shapes (JSON as text, encoded once).
The rules below are written once and used by every backend.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

from .._grants import Rule
from ..errors import Busy, CursorExpired, UsageError, VersionConflict
from .grants import Readable

Row = tuple[Any, ...]  # a repository's row: its columns in the order the repository names
T = TypeVar("T")
Stored = str | bytes | None  # a value as stored: JSON text, bytes, or None (a list: its items)
Ttl = float | str | None  # seconds from now, KEEP (the key's expiry), or None (never)
Sets = dict[str, str | None]  # a turn's columns a move sets: JSON text, or an error's text
Filters = dict[str, str]  # the change feed's filters, by column
Conn = Any  # a backend's connection (apsw.Connection, or postgres.store.Conn)

# -- values ---------------------------------------------------------------------------

KEEP: Final = "keep"
"""``ttl=KEEP``: keep the key's expiry (what ``update()`` and an ``append`` without ttl do)."""


# -- time -----------------------------------------------------------------------------

_second = (0, "")  # the last whole second, formatted: strftime is the slow part


def now_iso() -> str:
    """This machine's UTC time in the store's format: ISO-8601, microseconds, a Z."""
    global _second
    sec, us = divmod(time.time_ns() // 1000, 1_000_000)
    cached = _second  # one read: another thread may replace it meanwhile
    if cached[0] != sec:
        cached = _second = (sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec)))
    return "%s.%06dZ" % (cached[1], us)  # %-formatting: ~0.15 us less than an f-string here


def iso(t: float) -> str:
    """A unix time as the store's ISO-8601 UTC text (comparable with now_iso()).

    Before 1970 (a prune's cutoff of up to 1e11 seconds ago) it is '-infinity': the
    store holds nothing older, it sorts before every time as text, and PostgreSQL reads
    it as a timestamptz.
    """
    if t < 0:
        return "-infinity"
    sec, us = divmod(int(t * 1_000_000), 1_000_000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(sec))}.{us:06d}Z"


# -- the change feed and settings (SPEC §9, §10) ----------------------------------------

SETTINGS: dict[str, int] = {
    "feed_retention": 604_800,  # seconds of changes kept at least (7 days); 0: the feed is off
    "history_retention": 86_400,  # seconds a replaced value is kept (a day); 0: no history
}
"""Every setting of a store, with its default (a store keeps only what was set)."""


def check_cursor(since: int, head: int, retention: int, oldest: int | None) -> None:
    """Refuse a cursor whose changes are no longer all kept.

    ``head`` is the newest seq handed out, ``oldest`` the oldest seq kept
    (None: no row kept). The purge only ever removes a prefix of the feed, so
    the changes after ``since`` are all there exactly when the oldest kept one
    is at most ``since + 1``.

    :raises CursorExpired: the feed is off, or some change after ``since`` is gone.
    """
    if since >= head:
        return
    if retention == 0:
        raise CursorExpired(f"the change feed is off (feed_retention 0): only since={head} "
                            "(last_change()) is valid")
    if oldest is None or oldest > since + 1:
        raise CursorExpired(
            f"changes after {since} are no longer kept (the oldest kept is "
            f"{oldest if oldest is not None else 'none'}): read the current state and go on "
            f"from last_change() = {head}")


# -- who may use a thread's open transaction -----------------------------------------------

def check_owner(txn: contextvars.ContextVar[list[bool] | None], local: Any) -> None:
    """Refuse a call from code that is not inside this thread's open transaction.

    A thread's connection carries one transaction, but asyncio tasks on one
    thread interleave, and an async twin runs in a worker thread: a call from
    code that did not open the transaction must neither join it (and vanish
    with its rollback) nor wait for it (forever). ``txn`` is the store's
    context variable holding the token of the transaction the running code is
    inside of (``[True]`` while open); ``local`` is the thread's state
    (``depth``, ``owner``).
    """
    if local.depth:
        if txn.get() is not local.owner:
            raise Busy(
                "another task on this thread has an open transaction() on this database; "
                "a call from outside its block would join it (and be lost if it rolls back): "
                "await its end, or run this call in another thread (the async twins do)"
            )
    else:
        tok = txn.get()
        if tok is not None and tok[0]:
            raise UsageError(
                "this call runs in another thread than the transaction() it is inside of "
                "(an async twin, or a thread started in the block), so it cannot join it "
                "and would wait for it forever: use the plain calls inside transaction()"
            )


# -- tokens and grants (SPEC §12, §15) --------------------------------------------------------

TOKEN_ID: Final = 12  # hex digits of a token's hash that name it in ``tokens list`` (48 bits)

# -- the seam ---------------------------------------------------------------------------

Batched = tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]  # op, kind, sid, key, args, kwargs


class Ops(Protocol):
    """The store's logical operations: what the public objects call, and all they call.

    Arguments arrive validated and encoded (JSON as text); rows leave in the
    repositories' shapes. Each operation is one transaction (or one request).
    Implemented by ``LocalOps`` and ``RemoteOps``.
    """

    # the database
    @property
    def target(self) -> str: ...
    @property
    def durability(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def check_open(self) -> None: ...
    def close(self) -> None: ...
    def transaction(self) -> AbstractContextManager[None]:
        """A ``transaction()`` block (UsageError where calls cannot share one)."""
        ...
    def snapshot(self) -> AbstractContextManager[None]:
        """A ``snapshot()`` block: this thread's reads in it see one state (UsageError where
        reads cannot share one)."""
        ...
    def exclusive(self) -> AbstractContextManager[Any]:
        """Held while ``update()`` retries: the write lock where the store has one."""
        ...
    def clock(self) -> float:
        """The store's clock (unix time), by which every lease is judged: this machine's
        for a file, the database server's on PostgreSQL, the served store's over HTTP."""
        ...
    def in_block(self) -> str | None:
        """The block this thread is inside of — ``"transaction()"`` or ``"snapshot()"`` —,
        else None (a remote store has neither)."""
        ...
    def update_turn(self, kind: str, sid: str, key: str) -> AbstractContextManager[Any]:
        """Held around a whole ``update()``: this client's threads take turns on a key."""
        ...
    def apply_batch(self, ops: list[Batched]) -> list[Any]:
        """The writes of a ``batch()``, all or none; each one's result (an append's as
        (length, version), as ``kv_append``'s)."""
        ...
    def fenced(self, turn_id: str, owner: str | None = None) -> Ops:
        """The same operations, every write of which lands only while the turn
        ``turn_id`` holds its lease (checked in the write's own transaction; else
        ``LeaseLost`` and nothing written). SPEC §14. ``owner``: the turn must be of that
        principal's session, another's being as unknown (the server names its caller)."""
        ...

    # keys (SPEC §2, §10); a read with ``as_of`` reads the key as it was right after that
    # change (SPEC §17: CursorExpired past the history kept, InvalidValue past the head)
    def kv_get(self, kind: str, sid: str, key: str, raw: bool = False,
               as_of: int | None = None) -> Row | None: ...
    def kv_put(self, kind: str, sid: str, key: str, type_: str, stored: Stored, size: int,
               items: list[str] | None, if_version: int | None, ttl: Ttl) -> int: ...
    def kv_delete(self, kind: str, sid: str, key: str, if_version: int | None) -> bool: ...
    def kv_append(self, kind: str, sid: str, key: str, texts: list[str], size: int,
                  ttl: Ttl) -> tuple[int, int]: ...
    def kv_pop(self, kind: str, sid: str, key: str, n: int) -> list[str]: ...
    def kv_touch(self, kind: str, sid: str, key: str, ttl: float | None) -> bool: ...
    def kv_expires_at(self, kind: str, sid: str, key: str,
                      as_of: int | None = None) -> float | None: ...
    def kv_slice(self, kind: str, sid: str, key: str, start: int,
                 stop: int | None, as_of: int | None = None) -> list[str] | None: ...
    def kv_length(self, kind: str, sid: str, key: str, as_of: int | None = None) -> int | None: ...
    def kv_keys(self, kind: str, sid: str, prefix: str, after: str | None,
                limit: int | None, as_of: int | None = None) -> list[str]: ...
    def kv_get_many(self, kind: str, sid: str, keys: list[str],
                    as_of: int | None = None) -> list[Row]:
        """(key, type, stored, version, joined list items) of the live keys among ``keys``."""
        ...
    def kv_items(self, kind: str, sid: str, prefix: str, after: str | None,
                 limit: int | None, as_of: int | None = None) -> list[Row]:
        """``kv_keys`` with each key's (key, type, stored, version, joined list items)."""
        ...
    def kv_clear(self, kind: str, sid: str) -> int: ...

    # the past (SPEC §17)
    def kv_history(self, kind: str, sid: str, key: str, since: int, before: int | None,
                   limit: int | None) -> list[Row]:
        """The key's kept changes after ``since`` (and before ``before``), newest first:
        (seq, version, op, at, type, stored, joined list items) — what it held after each."""
        ...
    def diff(self, since: int, until: int | None, flt: Filters, readable: Readable | None = None,
             after: tuple[str, str, str] | None = None, limit: int | None = None) -> list[Row]:
        """(kind, scope id, key, before, after) of each key changed after ``since`` up to
        ``until`` (None: the head), ordered so, after the key ``after``, at most ``limit``;
        before and after as ``kv_get`` rows, None for absent. ``readable``: only what its
        owner may read, filtered by the store's own query (a server's reader)."""
        ...
    def kv_restore(self, kind: str, sid: str, seq: int, keys: list[str] | None) -> int:
        """Put the scope's keys (or only ``keys``) back as they were right after ``seq``, as
        new versions in one transaction; how many keys changed."""
        ...

    # vectors (SPEC §19): the framework stores' search by meaning, on a local store only
    def vector_search(self) -> str:
        """How ``kv_nearest`` scores here (``sqlite-vec``, ``pgvector``, ``exact``), decided
        once. UsageError remote; ImportError on a file without sqlite-vec."""
    def vector_value(self, values: list[float]) -> tuple[str, Stored, int]:
        """A vector as this store keeps it in a key: (type, stored, size), as a put takes."""
    def kv_nearest(self, kind: str, sid: str, ranges: list[tuple[str, str]],
                   query: list[float], metric: str, limit: int) -> list[tuple[str, float]]:
        """(key, score) of the ``limit`` live vector keys of ``len(query)`` numbers in the key
        ranges [low, high) nearest ``query``, best first (ties by key). ``metric``, as
        PostgresStore scores: ``cosine`` similarity (0 for a zero vector), ``l2`` (minus
        the distance), ``inner_product``."""

    # runs (SPEC §3, §10)
    def run_write(self, run_id: str, rows: list[tuple[int, str]], snapshot: str | None,
                  create: bool) -> None: ...
    def run_read(self, run_id: str) -> tuple[Row, list[tuple[int, str]]] | None: ...
    def run_head(self, run_id: str) -> Row | None: ...
    def run_entries(self, run_id: str, since: int, limit: int | None) -> list[tuple[int, str]]: ...
    def run_tail(self, run_id: str, n: int) -> list[tuple[int, str]]: ...
    def run_delete(self, run_id: str) -> bool: ...
    def run_list(self, after: str | None, limit: int | None,
                 grants: tuple[Rule, ...] | None = None) -> list[Row]:
        """Run summaries, newest update first; with ``grants`` only the runs a ``runs``
        rule covers (a server's reader: a remote store takes none)."""
        ...
    def run_fork(self, run_id: str, new_id: str, upto: int | None) -> None: ...
    def run_trim(self, run_id: str, before: int) -> int: ...
    def run_prune(self, older_than: float, finished_only: bool) -> list[str]: ...
    def run_pin(self, run_id: str, pinned: bool) -> bool: ...
    def run_claim(self, run_id: str, call_id: str, call: str | None, lease: float,
                  retry: bool) -> tuple[str, str]:
        """(status, the call's newest entry as JSON text) after claiming it if it was not
        (``claimed``), or as it stands: done, failed, in_progress, in_doubt (SPEC §14)."""
        ...
    def run_settle(self, run_id: str, call_id: str, outcome: str, retry: int | None) -> str:
        """Record a claimed call's outcome (``{"status", "result"|"error"}`` as JSON text):
        the tool_result entry written, as JSON text. ``retry``: the claim it settles (its
        entry's ``retry``, 0 for the first claim): InvalidTransition if a newer claim
        superseded it (None: whichever claim is open)."""
        ...

    # sessions and turns (SPEC §4), always for a principal (name, admin)
    def session_create(self, owner: str, metadata: str) -> Row: ...
    def session_get(self, session_id: str, name: str, admin: bool) -> Row: ...
    def session_list(self, name: str, admin: bool, after: str | None,
                     limit: int | None) -> list[Row]: ...
    def session_delete(self, session_id: str, name: str, admin: bool) -> None: ...
    def session_fork(self, session_id: str, name: str, admin: bool, seq: int | None,
                     metadata: str | None) -> Row:
        """A new session of ``name`` whose state is ``session_id``'s right after ``seq``
        (None: now), with no turns; ``metadata`` None: the original's."""
        ...
    def session_prune(self, name: str, admin: bool, idle_for: float) -> list[str]: ...
    def session_release(self, session_id: str, name: str, admin: bool) -> Row: ...
    def turn_start(self, session_id: str, name: str, admin: bool, status: str,
                   input_: str | None, lease: float) -> Row: ...
    def turn_get(self, turn_id: str, name: str, admin: bool) -> Row: ...
    def turn_list(self, session_id: str, name: str, admin: bool, after: str | None,
                  limit: int | None) -> list[Row]: ...
    def turn_find(self, name: str, admin: bool, live: tuple[str, ...], expired: bool,
                  after: str | None, limit: int | None) -> list[Row]: ...
    def turn_move(self, turn_id: str, name: str, admin: bool, from_states: tuple[str, ...],
                  to: str | None, what: str, lease: float | None, sets: Sets) -> Row: ...

    # the change feed and settings (SPEC §9, §10)
    def feed_scan(self, since: int, limit: int, flt: Filters, readable: Readable | None = None,
                  upto: int | None = None) -> tuple[list[Row], int]:
        """(change rows after ``since``, the head) from one snapshot. ``flt``: the §9 filters
        (column = value); for a server's reader, ``readable`` (what a token with grants may
        read) and ``upto`` (no seq past it); a remote store takes the §9 filters only."""
        ...
    def feed_head(self) -> int: ...
    def watch(self, since: int, timeout: float | None, limit: int,
              flt: Filters) -> list[Row]: ...
    def awatch(self, since: int, limit: int, flt: Filters) -> AsyncIterator[Row]: ...
    def settings(self) -> dict[str, Any]: ...
    def set_setting(self, name: str, value: int) -> None: ...

    # API tokens (SPEC §12, §15) and the pages' sign-ins
    def token_create(self, name: str, admin: bool, grants: str | None,
                     expires_in: float | None, first: bool = False) -> str | None:
        """A new token (returned once; only its hash is kept), with its grants (a JSON array
        of rules, or None) and its lifetime in seconds (None: no end). ``first``: only if
        the store has no token at all, checked in the insert's transaction (else None)."""
        ...
    def token_find(self, token: str) -> Row | None:
        """(name, admin, grants, seconds until it expires or None) of a live token."""
        ...
    def token_list(self) -> list[Row]:
        """(id, name, admin, grants, created_at, expires_at) per token; ``id`` is the start
        of its hash (``TOKEN_ID`` hex digits), which tells two tokens of one name apart."""
        ...
    def token_revoke(self, name: str, token_id: str) -> int:
        """End the tokens of ``name`` (only the one of ``token_id``, unless it is empty)."""
        ...
    def signin_create(self, token: str, lifetime: float) -> str | None:
        """A new sign-in id for a live token (only its hash is kept), or None."""
        ...
    def signin_find(self, signin: str) -> Row | None:
        """(token hash, name, admin, grants, seconds until the token expires or None,
        seconds until the sign-in lapses) of a live sign-in."""
        ...
    def signin_extend(self, signin: str, lifetime: float) -> None: ...
    def signin_end(self, signin: str) -> None: ...

    # administration
    def check(self) -> list[str]: ...
    def info(self) -> dict[str, Any]: ...
    def store_id(self) -> str:
        """The store's own id, made with it: the same through every server of one store."""
        ...
    def backup(self, dest: str, progress: Callable[[int, int], None] | None) -> str: ...
    def vacuum(self) -> dict[str, int]: ...
    def sql(self, query: str, params: tuple[Any, ...] | dict[str, Any]) -> list[dict[str, Any]]:
        """One read-only SQL statement's rows (``db.sql``); UsageError where there is no SQL."""
        ...


# -- what a backend supplies ------------------------------------------------------------

class Waiter(Protocol):
    """Waits for a commit by any client of the store (the change feed's wake-up)."""

    def mark(self) -> int: ...
    def wait(self, mark: int, deadline: float | None) -> bool: ...
    async def await_change(self, mark: int) -> None: ...


class Store(Protocol):
    """A backend's connections and transactions, shared by the threads of a process."""

    path: str
    durability: str

    @property
    def closed(self) -> bool: ...
    def check_open(self) -> None: ...
    def close(self) -> None: ...

    def call_write(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(connection, *args)`` in one write transaction (a savepoint inside
        ``transaction()``); its result once committed. The one write path."""
        ...

    def call_read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(connection, *args)`` as one read (inside a transaction: that one's)."""
        ...

    def write(self) -> AbstractContextManager[Conn]:
        """A ``transaction()`` block: one write transaction, or a savepoint inside one."""
        ...

    def read(self) -> AbstractContextManager[Conn]: ...
    def snapshot(self) -> AbstractContextManager[Conn]:
        """Several reads that see one consistent state (a read transaction)."""
        ...

    def waiter(self) -> AbstractContextManager[Waiter]: ...
    def in_write(self) -> bool: ...
    def in_snapshot(self) -> bool:
        """Whether this thread is inside ``snapshot()`` (not inside a write)."""
        ...
    def clock(self) -> float:
        """The store's clock (unix time): this machine's for a file, the server's for PostgreSQL."""
        ...

    def query(self, sql: str, args: Any = ...) -> list[Row]: ...


def conflict(what: str, expected: int, current: int) -> VersionConflict:
    """The refusal of a compare-and-set: ``what`` (e.g. "put app:a k") was to find the
    key at ``expected`` (PostgreSQL's functions raise the same text on the server)."""
    return VersionConflict(
        f"{what}: expected version {expected}, the current version is {current}", current)


def checked(ops: list[Batched], found: dict[int, int]) -> list[int]:
    """The results of a batch of checks only, from ``found`` (the live version of the
    key of each op, by its position from 1; absent: not there): the first op whose key
    is not at its ``if_version`` raises."""
    out = []
    for i, (_op, kind, sid, key, _args, kwargs) in enumerate(ops, 1):
        current = found.get(i, 0)
        if current != kwargs["if_version"]:
            raise conflict(f"check {kind}:{sid} {key}", kwargs["if_version"], current)
        out.append(current)
    return out


class KVRepo(Protocol):
    """Scoped keys (SPEC §2, §10). Writes run inside the caller's write transaction and
    record their change; reads are one statement each."""

    def get(self, c: Conn, kind: str, sid: str, key: str) -> Row | None: ...
    def put(self, c: Conn, kind: str, sid: str, key: str, type_: str, value: Any, size: int,
            items: list[str] | None, if_version: int | None, ttl: Any = None) -> int: ...
    def delete(self, c: Conn, kind: str, sid: str, key: str, if_version: int | None) -> bool: ...
    def append(self, c: Conn, kind: str, sid: str, key: str, items: list[str], items_size: int,
               ttl: Any = KEEP) -> tuple[int, int]: ...
    def pop(self, c: Conn, kind: str, sid: str, key: str, n: int) -> tuple[list[str], int]: ...
    def touch(self, c: Conn, kind: str, sid: str, key: str, ttl: float | None) -> int | None: ...
    def expires_at(self, c: Conn, kind: str, sid: str, key: str) -> tuple[float | None] | None: ...
    def slice_items(self, c: Conn, kind: str, sid: str, key: str, start: int,
                    stop: int | None) -> list[str] | None: ...
    def length(self, c: Conn, kind: str, sid: str, key: str) -> int | None: ...
    def keys(self, c: Conn, kind: str, sid: str, prefix: str, after: str | None,
             limit: int | None) -> list[str]: ...
    def get_many(self, c: Conn, kind: str, sid: str, keys: list[str]) -> list[Row]: ...
    def items(self, c: Conn, kind: str, sid: str, prefix: str, after: str | None,
              limit: int | None) -> list[Row]: ...
    def clear(self, c: Conn, kind: str, sid: str) -> int: ...
    def put_based(self, c: Conn, kind: str, sid: str, key: str, list_id: int, length: int,
                  size: int) -> int: ...
    def write_many(self, c: Conn, ops: list[Batched]) -> list[Any]: ...
    def check_many(self, c: Conn, ops: list[Batched]) -> list[int]: ...
    def vector_method(self, c: Conn) -> str: ...
    def vector(self, values: list[float]) -> tuple[str, Any, int]: ...
    def nearest(self, c: Conn, kind: str, sid: str, ranges: list[tuple[str, str]],
                query: list[float], metric: str, limit: int, method: str) -> list[tuple[str, float]]:
        """``Ops.kv_nearest``; ``method``: ``vector_method``'s answer."""
        ...


class RunsRepo(Protocol):
    """Runs (SPEC §3, §10): entries as (seq, JSON text), snapshots as JSON text."""

    def write(self, c: Conn, run_id: str, entries: list[tuple[int, str]], snapshot: str | None,
              create: bool) -> int: ...
    def head(self, c: Conn, run_id: str) -> Row | None: ...
    def entries(self, c: Conn, run_id: str, since: int,
                limit: int | None) -> list[tuple[int, str]]: ...
    def tail(self, c: Conn, run_id: str, n: int) -> list[tuple[int, str]]: ...
    def delete(self, c: Conn, run_id: str) -> bool: ...
    def trim(self, c: Conn, run_id: str, before: int) -> int: ...
    def prune(self, c: Conn, cutoff: str, finished_only: bool) -> list[str]: ...
    def summaries(self, c: Conn, after: str | None, limit: int | None,
                  grants: tuple[Rule, ...] | None = None) -> list[Row]: ...
    def fork(self, c: Conn, run_id: str, new_id: str, upto: int | None) -> None: ...
    def pin(self, c: Conn, run_id: str, pinned: bool) -> bool: ...
    def lock(self, c: Conn, run_id: str) -> Row | None:
        """``head()``, with the run held until the write commits (the first statement
        of a write that reads the run before it appends)."""
        ...
    def last_call(self, c: Conn, run_id: str, call_id: str,
                  claims: bool = False) -> tuple[int, str] | None:
        """The newest tool_call or tool_result entry of ``call_id`` (``claims``: the newest
        tool_call): an index probe, or what a trim kept of the call."""
        ...


class SessionsRepo(Protocol):
    """Sessions and turns (SPEC §4): rows in the column order of ``TURN_COLUMNS``."""

    def session_row(self, c: Conn, session_id: str, name: str, admin: bool) -> Row: ...
    def create(self, c: Conn, session_id: str, owner: str, metadata: str) -> Row: ...
    def sessions(self, c: Conn, name: str, admin: bool, after: str | None,
                 limit: int | None) -> list[Row]: ...
    def delete(self, c: Conn, session_id: str) -> None: ...
    def idle(self, c: Conn, cutoff: str, now: float) -> list[str]: ...
    def start(self, c: Conn, turn_id: str, session_id: str, status: str, input_: str | None,
              lease: float) -> Row: ...
    def turn_row(self, c: Conn, turn_id: str) -> Row | None: ...
    def turns(self, c: Conn, session_id: str, after: str | None, limit: int | None) -> list[Row]: ...
    def turns_by_status(self, c: Conn, name: str, admin: bool, live: tuple[str, ...],
                        expired: bool, now: float, after: str | None,
                        limit: int | None) -> list[Row]: ...
    def move(self, c: Conn, turn_id: str, from_states: tuple[str, ...], to: str,
             sets: dict[str, Any], lease: float | None, what: str) -> Row: ...
    def active_turn(self, c: Conn, session_id: str) -> Row | None: ...
    def check_fence(self, c: Conn, turn_id: str, owner: str | None = None) -> None:
        """First thing inside a write: ``LeaseLost`` unless the turn is running or resuming
        with its lease held by the store's clock (and is of ``owner``'s session, if named);
        no other turn of its session can start before this write commits."""
        ...


class HistoryRepo(Protocol):
    """Value history (SPEC §17): what each change replaced, and lists as they were. A
    state is (version, type, list_id, length, size, expires_at, value, updated_at)."""

    def on(self, c: Conn) -> bool: ...
    def floor(self, c: Conn) -> int: ...
    def moment(self, c: Conn, seq: int) -> float | None: ...
    def state_at(self, c: Conn, kind: str, sid: str, key: str, seq: int,
                 when: float | None) -> Row | None: ...
    def list_items(self, c: Conn, list_id: int, start: int, stop: int,
                   seq: int | None) -> list[str]: ...
    def changed_keys(self, c: Conn, kind: str, sid: str, since: int, lo: str | None = None,
                     hi: str | None = None) -> list[str]: ...
    def scope_keys(self, c: Conn, kind: str, sid: str, lo: str | None = None,
                   hi: str | None = None) -> list[str]: ...
    def revisions(self, c: Conn, kind: str, sid: str, key: str, since: int, before: int | None,
                  limit: int | None) -> list[Row]: ...
    def changed(self, c: Conn, since: int, until: int, flt: Filters,
                readable: Readable | None = None, after: tuple[str, str, str] | None = None,
                limit: int | None = None,
                window: tuple[float | None, float] | None = None) -> list[Row]: ...
    def expired_keys(self, c: Conn, kind: str, sid: str, after: float | None,
                     upto: float) -> list[str]: ...
    def restart(self, c: Conn, unseen: bool) -> None: ...
    def present(self, c: Conn, kind: str, sid: str) -> list[tuple[str, Row]]: ...
    def based_list(self, c: Conn, base_id: int, base_len: int, base_seq: int | None) -> int: ...


class FeedRepo(Protocol):
    """The change feed and the settings (SPEC §9, §10)."""

    def head(self, c: Conn) -> int: ...
    def scan(self, c: Conn, since: int, limit: int, flt: Filters,
             readable: Readable | None = None, upto: int | None = None) -> tuple[list[Row], int]: ...
    def settings(self, c: Conn) -> dict[str, Any]: ...
    def set_setting(self, c: Conn, name: str, value: Any) -> None: ...


class TokensRepo(Protocol):
    """API tokens (SPEC §12, §15) and the pages' sign-ins: hashes only."""

    def create(self, c: Conn, digest: str, name: str, admin: bool, grants: str | None,
               expires_in: float | None, first: bool = False) -> bool: ...
    def find(self, c: Conn, digest: str) -> Row | None: ...
    def tokens(self, c: Conn) -> list[Row]: ...
    def revoke(self, c: Conn, name: str, prefix: str = "") -> int: ...
    def signin_create(self, c: Conn, digest: str, token: str, lifetime: float) -> bool: ...
    def signin_find(self, c: Conn, digest: str) -> Row | None: ...
    def signin_extend(self, c: Conn, digest: str, lifetime: float) -> None: ...
    def signin_end(self, c: Conn, digest: str) -> None: ...


class AdminRepo(Protocol):
    """Administration: invariants, info, backup, vacuum, the bounded purge."""

    def check(self, store: Any) -> list[str]: ...
    def info(self, store: Any) -> dict[str, Any]: ...
    def store_id(self, store: Any) -> str: ...
    def backup(self, store: Any, dest: str,
               progress: Callable[[int, int], None] | None = None) -> str: ...
    def vacuum(self, store: Any) -> dict[str, int]: ...
    def purge(self, c: Conn, batch: int = ...) -> int: ...
    def sql(self, store: Any, query: str,
            params: tuple[Any, ...] | dict[str, Any]) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Backend:
    """A store and its repositories: what ``backends/sqlite`` and ``backends/postgres``
    each build in their ``connect()``."""

    store: Store
    kv: KVRepo
    runs: RunsRepo
    sessions: SessionsRepo
    feed: FeedRepo
    tokens: TokensRepo
    admin: AdminRepo
    history: HistoryRepo
