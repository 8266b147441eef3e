"""The ``Database`` object and ``open()``."""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from . import _batch, _changes, _grants, _past
from ._batch import Batch
from ._changes import Change
from ._encoding import check_key, check_kind, fs_path
from ._past import Diff, Past
from ._scope import Scope, State
from ._runs import RunStore
from ._sessions import Principal, Sessions
from .backends.base import SETTINGS, TOKEN_ID, Ops
from .errors import InvalidValue, UsageError


class Options(BaseModel):
    """How a database is opened; checked where the caller's settings come in."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str
    durability: Literal["full", "normal"] = "full"
    busy_timeout: float = Field(default=5.0, ge=0, le=86_400, allow_inf_nan=False)  # SQLite takes int ms
    vfs: str | None = None  # an apsw/SQLite VFS name; the fault-injection tests use their own


class Database:
    """One agentstate store: a file, a server's tables, or a remote store over HTTP.

    Safe to share between threads; open one per process. Every call goes
    through one backend operation (``_ops``): this object never asks which
    backend it runs on.
    """

    def __init__(self, ops: Ops) -> None:
        self._ops = ops
        self._runs: RunStore | None = None
        self._sessions: Sessions | None = None

    @property
    def path(self) -> str:
        """The file's path (or the server's address)."""
        return self._ops.target

    @property
    def durability(self) -> str:
        return self._ops.durability

    @property
    def _store(self) -> Any:  # the connection manager of a local backend (tests reach for it)
        return getattr(self._ops, "store")  # noqa: B009 (not on the Ops protocol)

    def __repr__(self) -> str:
        return f"<agentstate.Database {self.path!r}{' closed' if self._ops.closed else ''}>"

    def _check_open(self) -> None:
        self._ops.check_open()

    def scope(self, kind: str, scope_id: str, *, fence: Any = None) -> Scope:
        """The keys of one scope: kind is thread, session, agent, user or app.

        ``fence``: a Turn (or turn id): every write through this scope lands only while
        that turn holds its lease, else ``LeaseLost`` and nothing is written (SPEC §14).
        """
        self._check_open()
        return Scope(self._ops, kind, scope_id, fence)

    def state(self, *, fence: Any = None, **ids: str) -> State:
        """Several scopes at once, e.g. ``db.state(session="s-1", agent="bot")``;
        ``fence`` as for :meth:`scope`."""
        self._check_open()
        return State(self._ops, ids, fence)

    @contextmanager
    def transaction(self) -> Iterator[Database]:
        """Group the calls made in the block (this thread) into one transaction.

        All are written or none: an exception in the block rolls back and propagates.
        """
        with self._ops.transaction():
            yield self

    @contextmanager
    def snapshot(self) -> Iterator[Database]:
        """Every read of this thread inside the block sees one consistent state, in one
        read transaction (nothing another writer commits meanwhile shows). Writes inside
        it are ``UsageError``; so is a snapshot over HTTP, where reads are separate
        requests (``get_many`` and ``items`` read several keys in one).

        :raises UsageError: a write inside the block; ``snapshot()`` on a remote client.
        """
        self._check_open()
        with self._ops.snapshot():
            yield self

    @contextmanager
    def batch(self, *, fence: Any = None) -> Iterator[Batch]:
        """Collect writes (``b.scope(kind, id).put/delete/append``, and ``check``, which
        writes nothing but holds the batch to a key's version) and apply them all or
        none when the block exits; the first refusal raises. ``b.results`` then holds
        each op's return value. An exception in the block applies nothing.
        ``fence``: a Turn (or turn id) fencing every write: ``LeaseLost`` fails them all."""
        b = Batch(self, fence)
        token = _batch._open.set(_batch._open.get() + 1)  # once() inside is UsageError
        try:
            yield b
        finally:
            _batch._open.reset(token)
        b.apply()

    # -- the past (SPEC §17) ---------------------------------------------------

    def as_of(self, seq: int) -> AbstractContextManager[Past]:
        """The store as it was right after change ``seq`` committed, read-only: ``with
        db.as_of(seq) as past: past.scope(kind, id).get(key)`` (get, get_versioned,
        get_many, items, list, slice, length, expires_at; a write is UsageError). A key
        that did not exist yet, was deleted or had expired by then reads as absent.

        :raises CursorExpired: the history kept does not reach back to ``seq``.
        :raises InvalidValue: ``seq`` is past the newest change.
        """
        self._check_open()
        return _past.as_of(self._ops, seq)

    def diff(self, since: int, until: int | None = None, *, kind: str | None = None,
             scope_id: str | None = None, key: str | None = None,
             after: tuple[str, str, str] | None = None, limit: int | None = None) -> list[Diff]:
        """Every key changed after change ``since`` up to ``until`` (default: the newest),
        ordered by kind, scope id and key: ``Diff(kind, scope_id, key, before, after)``,
        each a ``Versioned`` (absent: ``(None, 0)``); a key changed and changed back is
        listed with equal values. Filters as in the feed. Paged: ``after`` (the kind,
        scope id and key of a page's last) and ``limit``.

        :raises CursorExpired: the history kept does not reach back to ``since``.
        :raises InvalidValue: a seq past the newest change, or ``until`` before ``since``.
        """
        self._check_open()
        _changes.check_since(since, 1)
        if until is not None:
            _changes.check_since(until, 1)
        flt = _changes.filters(None, kind, scope_id, key)
        if after is not None:
            if not isinstance(after, tuple) or len(after) != 3:
                raise InvalidValue("after is (kind, scope id, key): a page's last Diff's")
            after = (check_kind(after[0]), check_key(after[1], "scope id"), check_key(after[2]))
        if limit is not None:
            _changes.check_since(0, limit)
        return _past.diff_rows(self._ops.diff(since, until, flt, None, after, limit))

    # -- the change feed (SPEC §9) -------------------------------------------

    def last_change(self) -> int:
        """The newest change's seq; 0 on a new file."""
        self._check_open()
        return self._ops.feed_head()

    def changes(self, since: int = 0, *, limit: int = 1000, topic: str | None = None,
                kind: str | None = None, scope_id: str | None = None,
                key: str | None = None) -> list[Change]:
        """Changes with seq > ``since``, ascending, filtered.

        :raises CursorExpired: changes after ``since`` are no longer kept.
        """
        self._check_open()
        _changes.check_since(since, limit)
        rows, _head = self._ops.feed_scan(since, limit, _changes.filters(topic, kind, scope_id, key))
        return [_changes.change(r) for r in rows]

    def watch(self, since: int, *, timeout: float | None = None, limit: int = 1000,
              **filters: Any) -> list[Change]:
        """Like ``changes``, but when there is nothing yet, wait until a matching change is
        committed by any process, or ``timeout`` seconds pass (then ``[]``)."""
        self._check_open()
        _changes.check_since(since, limit)
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                    or not 0 <= timeout < 1e9):
            raise InvalidValue(f"timeout must be a number of seconds >= 0 or None, got {timeout!r}")
        rows = self._ops.watch(since, timeout, limit, _changes.filters(**filters))
        return [_changes.change(r) for r in rows]

    def awatch(self, since: int, *, limit: int = 1000, **filters: Any) -> AsyncIterator[Change]:
        """An async iterator of the changes after ``since``, as they are committed; it never
        ends by itself and never blocks the event loop."""
        self._check_open()
        _changes.check_since(since, limit)
        return _changes.as_changes(self._ops.awatch(since, limit, _changes.filters(**filters)))

    # -- settings (SPEC §10) --------------------------------------------------

    def settings(self) -> dict[str, Any]:
        """Every setting of the file, with its default where none was set."""
        self._check_open()
        return self._ops.settings()

    def set_setting(self, name: str, value: Any) -> None:
        """Set a setting for every process of the file. :raises InvalidValue: unknown name or bad value."""
        self._check_open()
        if name not in SETTINGS:
            raise InvalidValue(f"no setting {name!r}; settings are {', '.join(SETTINGS)}")
        if type(value) is not int or not 0 <= value <= 100 * 365 * 86400:
            raise InvalidValue(f"{name} must be a whole number of seconds from 0 to 100 years, "
                               f"got {value!r}")
        self._ops.set_setting(name, value)

    @property
    def tokens(self) -> Tokens:
        """The HTTP API's tokens (SPEC §12): made, listed and revoked here."""
        self._check_open()
        return Tokens(self._ops)

    @property
    def runs(self) -> RunStore:
        """The run store (history entries and snapshots), SPEC §3."""
        self._check_open()
        if self._runs is None:
            self._runs = RunStore(self._ops)
        return self._runs

    @property
    def sessions(self) -> Sessions:
        """Sessions and turns, SPEC §4."""
        self._check_open()
        if self._sessions is None:
            self._sessions = Sessions(self._ops)
        return self._sessions

    def check(self) -> list[str]:
        """SQLite's integrity check plus the store's own invariants.

        Returns each problem as "location: what (invariant)"; [] when all hold.
        """
        return self._ops.check()

    def info(self) -> dict[str, Any]:
        """Path, file and WAL sizes, schema version, durability and row counts."""
        return self._ops.info()

    def backup(self, dest: str | os.PathLike[str],
               progress: Callable[[int, int], None] | None = None) -> str:
        """An online, consistent copy to the new owner-only file ``dest``.

        ``progress(done_pages, total_pages)`` is called after each step.
        """
        self._check_open()
        return self._ops.backup(os.fspath(dest), progress)

    def vacuum(self) -> dict[str, int]:
        """Checkpoint the WAL and rebuild the file; returns its size before and after."""
        return self._ops.vacuum()

    def sql(self, query: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[dict[str, Any]]:
        """Run one read-only SQL statement on the store: its rows, each a dict of column name
        to value, read from one consistent snapshot of committed state.

        This is how to query the tables and views of ``schema.sql`` (``state``,
        ``run_history``, ``runs``, ``active_turns``, ``changes``) from Python. Never open
        the file with Python's ``sqlite3`` module in a process that has it open through
        agentstate: that module links a second copy of SQLite, the two copies do not see
        each other's locks, and closing its connection drops agentstate's locks on the
        file. Within seconds that crashes the process (SIGBUS), makes agentstate report
        the file ``Damaged``, and with other processes writing loses acknowledged writes
        and corrupts the file for every process (README, "Reading the file with
        sqlite3"). The ``sqlite3`` shell in another process is safe.

        Placeholders are the backend's own: ``?`` or ``:name`` on a file, ``%s`` or
        ``%(name)s`` on PostgreSQL (where a literal ``%`` is then written ``%%``);
        ``params`` is a sequence for positional ones, a mapping for named ones. Values
        come back as the driver reads them, JSON as its text on both backends. On
        PostgreSQL the statement runs in a READ ONLY transaction on the server, which is
        then rolled back.

        :raises UsageError: the statement writes, or would change the transaction or the
            connection (INSERT, UPDATE, DELETE, DDL, BEGIN/COMMIT, ATTACH, a pragma other
            than the schema ones, SET): refused, nothing written. Also inside
            ``transaction()``, and through ``agentstate.connect()`` (SQL is for local stores).
        :raises InvalidValue: not one statement, an SQL error (syntax, an unknown table or
            column), or parameters that do not fit.
        """
        from . import _sql

        self._check_open()
        return self._ops.sql(query, _sql.check(query, params))

    def close(self) -> None:
        """Close every connection; idempotent. Any later call raises Closed."""
        self._ops.close()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open(
    path: str | os.PathLike[str] | None = None,
    *,
    durability: str = "full",
    busy_timeout: float = 5.0,
    vfs: str | None = None,
) -> Database:
    """Open (creating if needed) the agentstate database at ``path``.

    ``path`` defaults to ``$AGENTSTATE_DB``, else ``./agentstate.db``. A URL
    starting ``postgresql://`` or ``postgres://`` opens the same store on a
    PostgreSQL server (the ``postgres`` extra); a URL is never a file name.
    ``durability="full"``: every returned write is on disk; ``"normal"``: the
    last commits may be lost on power failure, the file is never corrupted.
    ``vfs`` names a registered SQLite VFS to use instead of the default one.

    Query the store from Python with ``db.sql()``. Never open the same file with
    Python's ``sqlite3`` module in this process while it is open here: that module
    links another copy of SQLite, which does not see agentstate's locks and drops them
    when its connection closes; within seconds the process crashes (SIGBUS) or the file
    is corrupted, for other processes too. The ``sqlite3`` shell, or Python's
    ``sqlite3`` in another process, is safe.

    :raises SchemaTooNew: the file was written by a newer agentstate.
    :raises Damaged: the file is not an agentstate database.
    :raises StorageError: the file cannot be opened for writing.
    """
    target = path if path is not None else (os.environ.get("AGENTSTATE_DB") or "agentstate.db")
    if isinstance(target, str) and is_server_url(target):
        return _open_server(target, durability, busy_timeout)
    if isinstance(target, str) and target.startswith(("http://", "https://")):
        raise UsageError(f"open() takes a file path or a postgresql:// URL, not {target!r}: "
                         "for an agentstate server use agentstate.connect(url, token=...)")
    try:
        options = Options.model_validate({"path": fs_path(target), "durability": durability,
                                          "busy_timeout": busy_timeout, "vfs": vfs})
    except (ValidationError, TypeError) as e:
        raise InvalidValue(f"bad open() argument: {e}") from None
    from .backends import sqlite

    return Database(sqlite.connect(options.path, options.durability, options.busy_timeout,
                                   options.vfs))


def is_server_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def _open_server(url: str, durability: str, busy_timeout: float) -> Database:
    try:
        options = Options.model_validate({"path": url, "durability": durability,
                                          "busy_timeout": busy_timeout})
    except (ValidationError, TypeError) as e:
        raise InvalidValue(f"bad open() argument: {e}") from None
    try:
        from .backends import postgres
    except ImportError as e:
        raise UsageError(
            "a postgresql:// URL needs the postgres extra: pip install 'agentstate-db[postgres]' "
            f"({e})") from None
    return Database(postgres.connect(url, options.durability, options.busy_timeout))


class Tokens:
    """``db.tokens``: bearer tokens for ``agentstate serve``; only their hashes are stored."""

    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    def create(self, name: str, *, admin: bool = False, grants: Sequence[str] | None = None,
               expires: float | None = None) -> str:
        """A new token acting as the principal ``name``; shown only now.

        ``grants``: rules ``KIND:ID[=r|rw]`` (SPEC §15) limiting the scopes and runs the
        token may use; None: every one. ``expires``: seconds from now after which the
        token is unknown; None: never. Checked before anything is stored (InvalidValue).
        """
        p = Principal(name, admin)
        rules = _grants.parse(grants)
        if rules is not None and p.admin:
            raise InvalidValue("an admin token is never restricted by grants: give the grants "
                               "to a token without admin")
        if expires is not None and (isinstance(expires, bool) or not isinstance(expires, (int, float))
                                    or not 0 < expires < 1e11):
            raise InvalidValue(f"expires must be a number of seconds > 0, got {expires!r}")
        token = self._ops.token_create(p.name, p.admin, _grants.dumps(rules),
                                       None if expires is None else float(expires))
        assert token is not None  # None only for a first token
        return token

    def create_first_admin(self, name: str = "admin") -> str | None:
        """An admin token for ``name`` only if the store has no token at all (expired ones
        count), decided in the insert's own transaction: servers started at once on an empty
        store make one between them. None when a token existed (``agentstate serve``)."""
        return self._ops.token_create(Principal(name, True).name, True, None, None, first=True)

    def principal(self, token: str) -> Principal | None:
        """The principal a token acts as; None for an unknown (or expired) token."""
        found = self._find(token)
        return None if found is None else found[0]

    def _find(self, token: str) -> tuple[Principal, tuple[_grants.Rule, ...] | None,
                                         float | None] | None:
        """(principal, its rules or None, seconds until it expires or None) of a live token."""
        if type(token) is not str or not 20 <= len(token) <= 200:
            return None
        found = self._ops.token_find(token)
        if found is None:
            return None
        name, admin, rules, expires_in = found
        return Principal(name, admin), _grants.loads(rules), expires_in

    def list(self) -> list[dict[str, Any]]:
        """Every token (never the token itself): ``id`` (the start of its hash: it tells two
        tokens of one principal apart), ``name``, ``admin``, ``grants`` (the rules, or None),
        ``created_at`` and ``expires_at`` (ISO-8601 UTC; None: never; past: expired)."""
        return [{"id": i, "name": n, "admin": bool(a), "grants": None if g is None else json.loads(g),
                 "created_at": t, "expires_at": e}
                for i, n, a, g, t, e in self._ops.token_list()]

    def revoke(self, name: str, *, id: str | None = None) -> int:
        """End every token of ``name`` (only the one ``id`` names, as ``list()`` shows it); how
        many there were."""
        check_key(name, "principal name")
        if id is not None and (type(id) is not str or not re.fullmatch(f"[0-9a-f]{{{TOKEN_ID}}}", id)):
            raise InvalidValue(f"a token's id is {TOKEN_ID} hex digits, as tokens list shows it, "
                               f"got {id!r}")
        return self._ops.token_revoke(name, id or "")
