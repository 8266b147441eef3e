"""Search by meaning, for the framework adapters (SPEC §19): the LangGraph store's
``index=`` and the ADK memory service.

A vector is a key of the adapter's own scope, holding the vector as the database
keeps it (``Ops.vector_value``: float32 bytes on a file, a JSON array on
PostgreSQL). It is added to the same ``db.batch()`` as the thing it stands for, so
it is written and removed in that thing's transaction, and it is plain agentstate
state: it survives a restart and needs no table of its own. A search is one read
(``Ops.kv_nearest``: sqlite-vec on a file; pgvector, or an exact scan, on
PostgreSQL) of the vector keys in some key ranges, best first.

Embeddings are computed before anything is written, never inside a transaction: a
slow model never holds the file's write lock.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Sequence
from typing import Any

import agentstate
from agentstate._batch import BatchScope

METRICS = ("cosine", "l2", "inner_product")  # as Ops.kv_nearest scores: higher is nearer


class Vectors:
    """Where an adapter's vectors go, and how they are searched: ``dims`` numbers each,
    scored by ``metric`` (``cosine``, ``l2``, ``inner_product``: higher is nearer).

    Made when the adapter is: how the database scores vectors is decided then, once.

    :raises ValueError: ``dims`` is not a whole number of at least 1, or the metric is unknown.
    :raises ImportError: on a file, sqlite-vec is not installed (the ``vec`` extra).
    :raises UsageError: a remote database (agentstate.connect).
    """

    def __init__(self, db: agentstate.Database, dims: Any, metric: Any = "cosine") -> None:
        if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
            raise ValueError(f"index dims must be a whole number of at least 1, got {dims!r}")
        if metric not in METRICS:
            raise ValueError(f"unknown distance_type {metric!r}: one of {', '.join(METRICS)}")
        self.dims, self.metric = dims, metric
        self._ops = db._ops
        self.method = self._ops.vector_search()

    def check(self, vectors: Sequence[Sequence[float]], n: int) -> list[list[float]]:
        """The ``n`` vectors an embedding gave, as lists of floats.

        :raises ValueError: not ``n`` of them, or one that is not ``dims`` finite numbers
            (nothing is written).
        """
        out = [list(map(float, v)) for v in vectors]
        if len(out) != n:
            raise ValueError(f"the embedding gave {len(out)} vectors for {n} texts")
        for v in out:
            if len(v) != self.dims:
                raise ValueError(f"the embedding gave a vector of {len(v)} numbers; the index "
                                 f"has dims={self.dims}")
            if not all(map(math.isfinite, v)):
                raise ValueError("the embedding gave a vector with NaN or infinity")
        return out

    def put(self, w: BatchScope, key: str, vector: list[float]) -> None:
        """Add the vector's write to the batch ``w`` (checked already: ``check``)."""
        w._put_stored(key, self._ops.vector_value(vector))

    def nearest(self, kind: str, sid: str, ranges: list[tuple[str, str]], query: list[float],
                limit: int) -> list[tuple[str, float]]:
        """(vector key, score) of the ``limit`` best vectors in the key ranges, best first."""
        return self._ops.kv_nearest(kind, sid, ranges, query, self.metric, limit)


def prefix_range(prefix: str) -> tuple[str, str]:
    """The key range [low, high) of the keys that start with ``prefix``."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)


async def embed(fn: Any, texts: list[str], query: bool = False) -> list[list[float]]:
    """``texts`` embedded by ``fn``, never on the event loop's thread unless ``fn`` is a
    coroutine function: a LangChain ``Embeddings`` (``aembed_documents``, or
    ``aembed_query`` for a query), or a function of a list of texts, sync or async."""
    if not texts:
        return []
    if hasattr(fn, "aembed_documents"):
        if query:
            return [await fn.aembed_query(t) for t in texts]
        return list(await fn.aembed_documents(texts))
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__):
        return list(await fn(texts))
    if callable(fn):
        return list(await asyncio.to_thread(fn, texts))
    raise ValueError(f"embed must be an Embeddings object or a function of a list of texts, "
                     f"got {type(fn).__name__}")
