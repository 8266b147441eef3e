"""Value history (SPEC §17): the store as it was right after a change, a key's revisions,
what changed between two changes.

``db.as_of(seq)`` gives a read-only view whose scopes are ordinary ``Scope`` objects
over ``PastOps``: the same reads, each asking the store for the key as it was right
after change ``seq``; any write is ``UsageError``. A past read goes through the seam
like a read of the present (``as_of=``), so the remote client answers it too.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from ._encoding import check_int
from ._scope import ABSENT, Scope, State, Versioned, stored_value
from .errors import UsageError

if TYPE_CHECKING:
    from .backends.base import Ops


class Diff(NamedTuple):
    """A key changed between two changes: what it was (``before``) and became (``after``),
    as ``Versioned`` (an absent key: ``(None, 0)``)."""

    kind: str
    scope_id: str
    key: str
    before: Versioned
    after: Versioned


def versioned(row: tuple[Any, ...] | None) -> Versioned:
    return ABSENT if row is None else Versioned(stored_value(row), row[2])


_READS = ("kv_get", "kv_expires_at", "kv_slice", "kv_length", "kv_keys", "kv_get_many",
          "kv_items")


class PastOps:
    """An ``Ops`` whose reads are of the past (``as_of=seq``) and whose writes are refused."""

    def __init__(self, ops: Ops, seq: int) -> None:
        self._ops, self.seq = ops, seq

    def fenced(self, turn_id: str, owner: str | None = None) -> PastOps:
        return self

    def __getattr__(self, name: str) -> Any:
        if name in _READS:
            read = getattr(self._ops, name)
            return lambda *args, **kw: read(*args, **kw, as_of=self.seq)
        if name in ("check_open", "closed", "target"):
            return getattr(self._ops, name)
        raise UsageError(f"the store as of change {self.seq} is read-only: write to "
                         "db.scope(...), or put the past back with scope.restore(at=...)")


class Past:
    """The store as it was right after change ``seq`` (``db.as_of(seq)``): ``scope`` and
    ``state`` as on a ``Database``, reads only."""

    def __init__(self, ops: Ops, seq: int) -> None:
        self.seq = seq
        self._ops = cast("Ops", PastOps(ops, seq))

    def scope(self, kind: str, scope_id: str) -> Scope:
        """The keys of one scope as they were."""
        return Scope(self._ops, kind, scope_id)

    def state(self, **ids: str) -> State:
        """Several scopes at once, as ``db.state(...)``, as they were."""
        return State(self._ops, ids, None)

    def __repr__(self) -> str:
        return f"<agentstate past as of change {self.seq}>"


@contextmanager
def as_of(ops: Ops, seq: int) -> Iterator[Past]:
    """``db.as_of(seq)``: checked now (a seq past the head is InvalidValue, one older than
    the history kept CursorExpired), so a bad one fails at the ``with``."""
    check_int("seq", seq)
    ops.diff(seq, seq, {})  # the store's own check of the seq, of no scope (grants: none needed)
    yield Past(ops, seq)


def diff_rows(rows: builtins.list[tuple[Any, ...]]) -> builtins.list[Diff]:
    return [Diff(kind, sid, key, versioned(before), versioned(after))
            for kind, sid, key, before, after in rows]
