"""Thread-scoped clients (SPEC §5): the ``thread`` scope behind a small API."""

from __future__ import annotations

import os
from typing import Any

from ._database import Database, open
from ._scope import Scope
from ._encoding import check_key
from .errors import InvalidKey


class _ThreadScoped:
    def __init__(self, thread_id: str | None = None, db: Database | None = None) -> None:
        thread_id = thread_id if thread_id is not None else os.environ.get("AGENTSTATE_THREAD_ID")
        if thread_id is None:
            raise InvalidKey("no thread id: pass thread_id or set $AGENTSTATE_THREAD_ID")
        check_key(thread_id, "thread id")  # before open(): a refusal creates no file
        self._owns_db = db is None
        self.db = db if db is not None else open()
        self.thread_id = thread_id
        self._scope: Scope = self.db.scope("thread", thread_id)

    def delete(self, key: str) -> None:
        """Remove ``key``; nothing if absent."""
        self._scope.delete(key)

    def list(self, prefix: str = "") -> list[str]:
        """Keys of this thread starting with ``prefix``, ascending."""
        return self._scope.list(prefix)

    def close(self) -> None:
        """Close the database if this client opened it."""
        if self._owns_db:
            self.db.close()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ThreadStateClient(_ThreadScoped):
    """Bytes values in one thread's scope."""

    def get(self, key: str) -> bytes | None:
        return self._scope.get_bytes(key)

    def put(self, key: str, value: bytes) -> None:
        self._scope.put_bytes(key, value)


class ThreadStateStore(_ThreadScoped):
    """JSON values in one thread's scope."""

    def get_json(self, key: str) -> Any:
        """The value, or None; :raises json.JSONDecodeError: the stored bytes are not JSON."""
        return self._scope.get(key)

    def put_json(self, key: str, value: Any) -> None:
        """:raises TypeError: ``value`` is not JSON-serializable (InvalidValue is one)."""
        self._scope.put(key, value)
