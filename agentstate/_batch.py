"""``db.batch()``: writes collected in a block and applied all or none when it exits.

Over HTTP a transaction cannot span calls; a batch can, as one request. The
local ``Database`` has it too, so code written for one runs on the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._encoding import check_key, check_kind

if TYPE_CHECKING:
    from ._database import Database


class BatchScope:
    """The writes of one scope inside a batch: put, delete and append, each collected."""

    __slots__ = ("_batch", "kind", "id")

    def __init__(self, batch: Batch, kind: str, scope_id: str) -> None:
        self._batch = batch
        self.kind = check_kind(kind)
        self.id = check_key(scope_id, "scope id")

    def put(self, key: str, value: Any, *, if_version: int | None = None, **opts: Any) -> None:
        self._batch._add("put", self, key, (value,), {"if_version": if_version, **opts})

    def delete(self, key: str, *, if_version: int | None = None) -> None:
        self._batch._add("delete", self, key, (), {"if_version": if_version})

    def append(self, key: str, items: list[Any], **opts: Any) -> None:
        self._batch._add("append", self, key, (items,), opts)


class Batch:
    """Collects writes; ``results`` holds each one's return value once applied."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]] = []
        self.results: list[Any] | None = None

    def scope(self, kind: str, scope_id: str) -> BatchScope:
        return BatchScope(self, kind, scope_id)

    def _add(self, op: str, scope: BatchScope, key: str, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> None:
        check_key(key)
        self.ops.append((op, scope.kind, scope.id, key, args, kwargs))

    def apply(self) -> list[Any]:
        """All or none: the first refusal raises and nothing is written."""
        db = self._db

        def call(op: str, kind: str, sid: str, key: str, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
            return getattr(db.scope(kind, sid), op)(key, *args, **kwargs)

        self.results = db._ops.apply_batch(self.ops, call)
        return self.results
