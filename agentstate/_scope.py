"""Scoped key-value state: the public ``Scope`` and the ``State`` bundle.

Thin: validate and encode, run one repository function in one transaction,
turn stored text back into values.
"""

from __future__ import annotations

import asyncio
import builtins
import inspect
from datetime import datetime, timezone
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from ._changes import parse_at
from ._encoding import (INT_MIN, MAX_VALUE, SCOPE_KINDS, check_fence, check_int, check_key,
                        check_kind, decode, encode, encode_items, prefix_ok)
from ._turns import aturn
from ._twins import async_twin
from .backends.base import KEEP
from .errors import Damaged, InvalidValue, NotAList, TooLarge, VersionConflict

if TYPE_CHECKING:
    from .backends.base import Ops


class Versioned(NamedTuple):
    """A value with its version; an absent key is ``(None, 0)``."""

    value: Any
    version: int


ABSENT = Versioned(None, 0)
MAX_MANY = 1000  # keys one get_many() reads


class Appended(NamedTuple):
    """The length of a list and its version after an append."""

    length: int
    version: int


def _check_version(if_version: Any) -> int | None:
    return None if if_version is None else check_int("if_version", if_version)


MAX_TTL = 1e11  # seconds (about 3,000 years): past it a datetime cannot say when


def _ttl(ttl: Any) -> float | None:
    """A checked ttl in seconds (the store adds it to its own clock); None for no ttl."""
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= MAX_TTL:
        raise InvalidValue(f"ttl must be a number of seconds above 0 (at most {MAX_TTL:g}), got {ttl!r}")
    return float(ttl)


def _check_index(name: str, i: Any) -> None:
    check_int(name, i, INT_MIN)


def _value(row: tuple[Any, ...]) -> Any:
    type_, value, _version, items = row
    if type_ == "bytes":
        return decode(value)  # any bytes may be stored: JSONDecodeError if not JSON (SPEC §2)
    if type_ == "list":
        return _stored(f"[{items or ''}]")
    return _stored(value)


def _stored(text: str) -> Any:
    """Parse JSON that agentstate stored: if it does not parse, someone changed it by hand."""
    try:
        return decode(text)
    except ValueError as e:
        raise Damaged(f"a stored value is not valid JSON (changed outside agentstate?): {e}") from None


def _encode_value(value: Any) -> tuple[str, Any, int, list[str] | None]:
    """(type, stored value, size, items): lists are stored one row per item."""
    if isinstance(value, (list, tuple)):
        items, size = encode_items(value)
        return "list", None, size, items
    text, size = encode(value)
    return "json", text, size, None


class Revision(NamedTuple):
    """One kept change of a key: its ``seq`` and ``op`` in the feed, the key's ``version``
    after it, when (``at``), and the ``value`` it held after it (None after a delete or an
    expiry; bytes for a bytes value)."""

    seq: int
    version: int
    op: str
    at: datetime
    value: Any


def stored_value(row: tuple[Any, ...] | None) -> Any:
    """A stored row's value as history shows it: bytes as bytes, the rest decoded."""
    if row is None:
        return None
    return row[1] if row[0] == "bytes" else _value(row)


def _history(ops: Ops, kind: str, sid: str, key: str, since: int | None, before: int | None,
            limit: int | None) -> builtins.list[Revision]:
    check_key(key)
    for name, v in (("since", since), ("before", before), ("limit", limit)):
        if v is not None:
            check_int(name, v)
    rows = ops.kv_history(kind, sid, key, since or 0, before, limit)
    return [Revision(seq, version, op, parse_at(at), stored_value(
        None if type_ is None else (type_, stored, version, items)))
        for seq, version, op, at, type_, stored, items in rows]



class Scope:
    """The keys of one scope, e.g. ``db.scope("session", "s-42")``."""

    __slots__ = ("_ops", "kind", "id")

    def __init__(self, ops: Ops, kind: str, scope_id: str, fence: Any = None) -> None:
        turn_id = check_fence(fence)
        self._ops = ops if turn_id is None else ops.fenced(turn_id)
        self.kind = check_kind(kind)
        self.id = check_key(scope_id, "scope id")

    def _writer(self, fence: Any) -> Ops:
        """The operations a write goes through: fenced by ``fence`` (a Turn or a turn id)
        instead of the scope's own fence, if given (SPEC §16), else by the scope's."""
        turn_id = check_fence(fence)
        return self._ops if turn_id is None else self._ops.fenced(turn_id)

    def __repr__(self) -> str:
        return f"<Scope {self.kind}:{self.id}>"

    # -- the past (SPEC §17) -------------------------------------------------------------

    def history(self, key: str, *, since: int | None = None, before: int | None = None,
                limit: int | None = None) -> builtins.list[Any]:
        """The key's kept revisions, newest first: ``Revision(seq, version, op, at,
        value)`` for each change of it still kept (``value``: what it held after that
        change; None after a delete or an expiry). ``since``: only changes after that seq;
        ``before``: only changes before it (the next page of older ones); ``limit``: at
        most that many."""
        return _history(self._ops, self.kind, self.id, key, since, before, limit)

    def restore(self, at: int, *, keys: Iterable[str] | None = None, fence: Any = None) -> int:
        """Put the scope's keys (or only ``keys``) back as they were right after change
        ``at``, as new versions, in one transaction, recorded in the feed like any write;
        a key made since is deleted. A restored key does not expire. Returns how many keys
        changed.

        :raises CursorExpired: the history kept does not reach back to ``at``.
        :raises InvalidValue: ``at`` is past the newest change.
        :raises LeaseLost: ``fence``'s turn lost its lease; nothing changed.
        """
        check_int("at", at)
        wanted = None if keys is None else [check_key(k) for k in keys]
        return self._writer(fence).kv_restore(self.kind, self.id, at, wanted)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when absent."""
        check_key(key)
        row = self._ops.kv_get(self.kind, self.id, key)
        return default if row is None else _value(row)

    def get_versioned(self, key: str) -> Versioned:
        """``Versioned(value, version)``; ``(None, 0)`` when absent."""
        check_key(key)
        row = self._ops.kv_get(self.kind, self.id, key)
        return Versioned(None, 0) if row is None else Versioned(_value(row), row[2])

    def put(self, key: str, value: Any, *, if_version: int | None = None,
            ttl: float | None = None, fence: Any = None) -> int:
        """Write ``value``; return the new version.

        ``ttl``: seconds until the key expires; None: it does not expire
        (``"keep"``: the expiry it had, as ``update`` does). ``fence``: a Turn (or a
        turn id) whose lease must hold when the write commits (SPEC §14).

        :raises VersionConflict: ``if_version`` is not the current version (0: absent).
        :raises InvalidKey: refused before anything is written.
        :raises InvalidValue: refused before anything is written.
        :raises TooLarge: refused before anything is written.
        :raises LeaseLost: the fence's turn lost its lease; nothing was written.
        """
        check_key(key)
        if_version = _check_version(if_version)
        expiry: Any = KEEP if ttl == KEEP else _ttl(ttl)
        type_, stored, size, items = _encode_value(value)
        return self._writer(fence).kv_put(self.kind, self.id, key, type_, stored, size, items, if_version,
                                expiry)

    def delete(self, key: str, *, if_version: int | None = None, fence: Any = None) -> bool:
        """Remove ``key``; True if it existed.

        :raises VersionConflict: as for put.
        :raises LeaseLost: as for put.
        """
        check_key(key)
        if_version = _check_version(if_version)
        return self._writer(fence).kv_delete(self.kind, self.id, key, if_version)

    def update(self, key: str, fn: Callable[[Any], Any], *, default: Any = None,
               fence: Any = None) -> Any:
        """Replace the value by ``fn(value)`` atomically and return the new value.

        Compare-and-set: ``fn`` runs on a snapshot, outside any lock; the write
        goes through only if nobody wrote the key in between. If somebody did,
        ``fn`` runs again on the fresh value inside the write transaction, so
        it runs at most twice and no concurrent update is lost. ``fn`` gets
        ``default`` only when the key is absent; an exception from ``fn``
        writes nothing and propagates. ``fence``: as for put.
        """
        check_key(key)
        ops = self._writer(fence)
        with self._ops.update_turn(self.kind, self.id, key):  # remote: a client's threads take turns
            row, current = self._current(key, default)
            new = fn(current)
            if self._try_set(key, new, row, ops):
                return new
            # Lost the race: again, holding the write lock where the store has one
            # (then this cannot lose again); a remote store retries until it wins.
            with self._ops.exclusive():
                while True:
                    row, current = self._current(key, default)
                    new = fn(current)
                    if self._try_set(key, new, row, ops):
                        return new

    def _current(self, key: str, default: Any) -> tuple[tuple[Any, ...] | None, Any]:
        """The read of update() and aupdate(): the stored row, and what ``fn`` gets."""
        row = self._ops.kv_get(self.kind, self.id, key)
        return row, default if row is None else _value(row)

    def _try_set(self, key: str, new: Any, row: tuple[Any, ...] | None, ops: Ops) -> bool:
        """The compare-and-set of update(): writes only at the version read; keeps the expiry."""
        type_, stored, size, items = _encode_value(new)
        try:
            ops.kv_put(self.kind, self.id, key, type_, stored, size, items,
                             0 if row is None else row[2], KEEP)
            return True
        except VersionConflict:
            return False

    def append(self, key: str, items: list[Any], *, ttl: float | None = None,
               fence: Any = None) -> Appended:
        """Add ``items`` at the end of the list ``key`` (created if absent).

        ``ttl``: seconds until the key expires; None keeps the expiry it had.

        :raises NotAList: the key holds another kind of value.
        :raises TooLarge: the whole list would be over 1 MiB of JSON.
        :raises LeaseLost: ``fence``'s turn lost its lease (as for put).
        """
        check_key(key)
        ttl = _ttl(ttl)
        texts, size = encode_items(items)
        return Appended(*self._writer(fence).kv_append(self.kind, self.id, key, texts, size,
                                             KEEP if ttl is None else ttl))

    def touch(self, key: str, ttl: float | None = None, *, fence: Any = None) -> bool:
        """Set a new expiry, ``ttl`` seconds from now (None: never); value and version
        unchanged. False if the key is absent. ``fence``: as for put."""
        check_key(key)
        ttl = _ttl(ttl)
        return self._writer(fence).kv_touch(self.kind, self.id, key, ttl)

    def expires_at(self, key: str) -> datetime | None:
        """When the key expires (UTC); None if it does not, or is absent."""
        check_key(key)
        at = self._ops.kv_expires_at(self.kind, self.id, key)
        return None if at is None else datetime.fromtimestamp(at, timezone.utc)

    def pop(self, key: str, n: int = 1, *, fence: Any = None) -> list[Any]:
        """Remove the last ``n`` items of the list ``key`` and return them in list order.

        Fewer when the list is shorter; [] when absent. Atomic; the version rises
        when something was removed. :raises NotAList: the key holds another kind of value.
        ``fence``: as for put.
        """
        check_key(key)
        check_int("n", n)
        texts = self._writer(fence).kv_pop(self.kind, self.id, key, n)
        return _stored("[" + ",".join(texts) + "]") if texts else []

    def slice(self, key: str, start: int = 0, stop: int | None = None) -> list[Any]:
        """``list[start:stop]`` with Python's slice rules; [] when absent.

        :raises NotAList: the key holds another kind of value.
        """
        check_key(key)
        _check_index("start", start)
        if stop is not None:
            _check_index("stop", stop)
        texts = self._ops.kv_slice(self.kind, self.id, key, start, stop)
        if texts is None:
            raise NotAList(f"{self.kind}:{self.id} {key} does not hold a list")
        return _stored("[" + ",".join(texts) + "]")

    def length(self, key: str) -> int:
        """Items in the list ``key``; 0 when absent. :raises NotAList:"""
        check_key(key)
        n = self._ops.kv_length(self.kind, self.id, key)
        if n is None:
            raise NotAList(f"{self.kind}:{self.id} {key} does not hold a list")
        return n

    def list(self, prefix: str = "", *, after: str | None = None, limit: int | None = None) -> list[str]:
        """Keys of this scope starting with the literal ``prefix``, ascending.

        ``after`` returns only keys after that one (for paging); ``limit`` caps the count.
        """
        if after is not None and after != "":
            check_key(after, "after")  # a key from an earlier page
        if limit is not None:
            check_int("limit", limit)
        if not prefix_ok(prefix):
            self._ops.check_open()  # still refuse a closed database
            return []
        return self._ops.kv_keys(self.kind, self.id, prefix, after, limit)

    def get_many(self, keys: Iterable[str]) -> dict[str, Versioned]:
        """Several keys at once, in one read: ``{key: Versioned(value, version)}`` for each
        of ``keys`` (an absent one: ``(None, 0)``), in the order given.

        :raises InvalidKey: a key breaks the key rules.
        :raises InvalidValue: more than 1,000 keys, or ``keys`` is a string.
        """
        if isinstance(keys, (str, bytes)):
            raise InvalidValue("get_many() takes a list of keys, not one string")
        wanted = [check_key(k) for k in keys]
        if len(wanted) > MAX_MANY:
            raise InvalidValue(f"get_many() reads at most {MAX_MANY} keys a call, got {len(wanted)}")
        found = {row[0]: Versioned(_value(row[1:]), row[3])
                 for row in self._ops.kv_get_many(self.kind, self.id, list(dict.fromkeys(wanted)))} \
            if wanted else {}
        return {k: found.get(k, ABSENT) for k in wanted}

    def items(self, prefix: str = "", *, after: str | None = None,
              limit: int | None = None) -> builtins.list[tuple[str, Versioned]]:
        """The keys of this scope with their values, ascending, in one read: as
        :meth:`list` (the same literal prefix and paging), each ``(key, Versioned)``."""
        if after is not None and after != "":
            check_key(after, "after")
        if limit is not None:
            check_int("limit", limit)
        if not prefix_ok(prefix):
            self._ops.check_open()
            return []
        return [(row[0], Versioned(_value(row[1:]), row[3]))
                for row in self._ops.kv_items(self.kind, self.id, prefix, after, limit)]

    def clear(self, *, fence: Any = None) -> int:
        """Delete every key of this scope, in one transaction; how many there were.

        The change feed gets a ``delete`` change per key (versions stay remembered, as
        for :meth:`delete`). ``fence``: as for put.
        """
        return self._writer(fence).kv_clear(self.kind, self.id)

    def put_bytes(self, key: str, data: bytes, *, if_version: int | None = None,
                  ttl: float | None = None, fence: Any = None) -> int:
        """Store raw bytes under ``key``; return the new version (``ttl``, ``fence`` as for put)."""
        check_key(key)
        if_version = _check_version(if_version)
        ttl = _ttl(ttl)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidValue(f"data must be bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) > MAX_VALUE:
            raise TooLarge(f"value is {len(data)} bytes, over the limit of {MAX_VALUE}", len(data), MAX_VALUE)
        return self._writer(fence).kv_put(self.kind, self.id, key, "bytes", data, len(data), None,
                                          if_version, ttl)

    def get_bytes(self, key: str) -> bytes | None:
        """The stored bytes; a JSON value as its UTF-8 JSON text; None when absent."""
        check_key(key)
        row = self._ops.kv_get(self.kind, self.id, key, raw=True)
        if row is None:
            return None
        type_, value, _version, items = row
        if type_ == "bytes":
            return value
        if type_ == "list":
            return f"[{items or ''}]".encode("utf-8")
        return value.encode("utf-8")


    # -- async twins: each runs its plain twin in a worker thread ----------------

    aget = async_twin(get)
    aget_versioned = async_twin(get_versioned)
    aput = async_twin(put)
    adelete = async_twin(delete)
    aappend = async_twin(append)
    apop = async_twin(pop)
    aslice = async_twin(slice)
    alength = async_twin(length)
    alist = async_twin(list)
    aput_bytes = async_twin(put_bytes)
    aget_bytes = async_twin(get_bytes)
    atouch = async_twin(touch)
    aexpires_at = async_twin(expires_at)
    aget_many = async_twin(get_many)
    aitems = async_twin(items)
    aclear = async_twin(clear)
    ahistory = async_twin(history)
    arestore = async_twin(restore)

    async def aupdate(self, key: str, fn: Callable[[Any], Any], *, default: Any = None,
                      fence: Any = None) -> Any:
        """The async twin of :meth:`update`; ``fn`` may be a plain or an async function.

        ``fn`` runs on the event loop; the read and the write run in a worker thread,
        and are update()'s own (so the write keeps the key's expiry, as update's does).
        Compare-and-set: read with the version, call ``fn``, write at that version;
        on a conflict, again with the fresh value.
        """
        check_key(key)
        ops = self._writer(fence)
        async with aturn((self.kind, self.id, key)):  # the loop's tasks take turns on a key
            while True:
                row, current = await asyncio.to_thread(self._current, key, default)
                new = fn(current)
                if inspect.isawaitable(new):
                    new = await new
                if await asyncio.to_thread(self._try_set, key, new, row, ops):
                    return new


class State:
    """Several scopes at once: ``db.state(session="s", agent="a").session``."""

    def __init__(self, ops: Ops, ids: dict[str, str], fence: Any = None) -> None:
        turn_id = check_fence(fence)
        if turn_id is not None:
            ops = ops.fenced(turn_id)
        for kind, scope_id in ids.items():
            check_kind(kind)
            if scope_id is not None:
                object.__setattr__(self, kind, Scope(ops, kind, scope_id))

    def __getattr__(self, name: str) -> Scope:
        if name in SCOPE_KINDS:
            raise AttributeError(f"no {name} id was given to db.state(...)")
        raise AttributeError(name)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={getattr(self, k).id!r}" for k in SCOPE_KINDS if k in self.__dict__)
        return f"<State {inner}>"
