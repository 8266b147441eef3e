"""``db.batch()``: writes collected in a block and applied all or none when it exits.

Over HTTP a transaction cannot span calls; a batch can, as one request. The
local ``Database`` has it too, so code written for one runs on the other.

Each write is validated and encoded when it is added, by the rules and the
functions a ``Scope`` uses: a refusal raises from that call, and what is
applied (locally, or spliced into the request as JSON text) is the encoding
checked there — one rule for both.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

from ._encoding import MAX_VALUE, check_fence, check_key, check_kind, encode_items
from ._scope import KEEP, Appended, _check_version, _encode_value, _ttl
from .errors import InvalidValue, TooLarge

if TYPE_CHECKING:
    from ._database import Database

_open: contextvars.ContextVar[int] = contextvars.ContextVar("agentstate_batches", default=0)


def inside() -> bool:
    """Whether the running code is inside a ``batch()`` block (of any store)."""
    return _open.get() > 0


# (op, kind, scope id, key, args, kwargs): the ops method ``kv_<op>(kind, sid, key, *args,
# **kwargs)`` applies it, with the encoded value (put: type, stored, size, items;
# append: item texts, size).
Op = tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]


class BatchScope:
    """The writes of one scope inside a batch: put, delete and append, each collected;
    and ``check``, which writes nothing but holds the batch to a key's version."""

    __slots__ = ("_batch", "kind", "id")

    def __init__(self, batch: Batch, kind: str, scope_id: str) -> None:
        self._batch = batch
        self.kind = check_kind(kind)
        self.id = check_key(scope_id, "scope id")

    def put(self, key: str, value: Any, *, if_version: int | None = None,
            ttl: float | None = None) -> None:
        """As ``Scope.put`` (``ttl`` in seconds, or None: no expiry).

        :raises InvalidKey: now, and the write is not added.
        :raises InvalidValue: now, and the write is not added.
        :raises TooLarge: now, and the write is not added.
        """
        check_key(key)
        if ttl == KEEP:  # the State API's batch has no keep_ttl: refused alike everywhere
            raise InvalidValue("ttl='keep' is not available in a batch: give seconds, or None")
        if_version, ttl = _check_version(if_version), _ttl(ttl)
        self._batch._add(("put", self.kind, self.id, key, _encode_value(value),
                          {"if_version": if_version, "ttl": ttl}))

    def delete(self, key: str, *, if_version: int | None = None) -> None:
        """As ``Scope.delete``.

        :raises InvalidKey: now.
        :raises InvalidValue: now.
        """
        check_key(key)
        self._batch._add(("delete", self.kind, self.id, key, (),
                          {"if_version": _check_version(if_version)}))

    def check(self, key: str, *, if_version: int) -> None:
        """Apply the batch only if ``key`` is at ``if_version`` when it is applied (0:
        absent); writes nothing. Its result is that version. The key stays at it until
        the batch commits: a read of another key's version and the writes it allows,
        in one batch (over HTTP, one request) where they would need a transaction.

        :raises InvalidKey: now, and nothing is added.
        :raises InvalidValue: now (``if_version`` not an integer of 0 or more).
        """
        check_key(key)
        version = _check_version(if_version)
        if version is None:
            raise InvalidValue("check needs if_version: the version the key must be at (0: absent)")
        self._batch._add(("check", self.kind, self.id, key, (), {"if_version": version}))

    def _put_stored(self, key: str, stored: tuple[str, Any, int]) -> None:
        """A put of a value the database encoded itself: (type, stored, size), as
        ``Ops.vector_value`` gives a vector (bytes on a file). For the framework adapters,
        which run on a local database only: the State API's batch carries JSON values.

        :raises InvalidKey: now.
        :raises TooLarge: now.
        """
        check_key(key)
        if stored[2] > MAX_VALUE:
            raise TooLarge(f"value is {stored[2]} bytes, over the limit of {MAX_VALUE}",
                           stored[2], MAX_VALUE)
        self._batch._add(("put", self.kind, self.id, key, (*stored, None),
                          {"if_version": None, "ttl": None}))

    def append(self, key: str, items: list[Any], *, ttl: float | None = None) -> None:
        """As ``Scope.append`` (``ttl`` None keeps the key's expiry).

        :raises InvalidKey: now, and the write is not added.
        :raises InvalidValue: now, and the write is not added.
        :raises TooLarge: now, and the write is not added.
        """
        check_key(key)
        ttl = _ttl(ttl)
        self._batch._add(("append", self.kind, self.id, key, encode_items(items),
                          {"ttl": KEEP if ttl is None else ttl}))


class Batch:
    """Collects writes; ``results`` holds each one's return value once applied."""

    def __init__(self, db: Database, fence: Any = None) -> None:
        self._db = db
        self._fence = check_fence(fence)
        self.ops: list[Op] = []
        self.results: list[Any] | None = None

    def scope(self, kind: str, scope_id: str) -> BatchScope:
        return BatchScope(self, kind, scope_id)

    def _add(self, op: Op) -> None:
        self.ops.append(op)

    def apply(self) -> list[Any]:
        """All or none: the first refusal raises and nothing is written."""
        ops = self._db._ops if self._fence is None else self._db._ops.fenced(self._fence)
        results = ops.apply_batch(self.ops)
        self.results = [Appended(*r) if op[0] == "append" else r for op, r in zip(self.ops, results)]
        return self.results
