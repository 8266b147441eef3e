"""``AgentStateStore(db, index=...)``: LangGraph's ``IndexConfig``, what a put embeds, and
the embedding calls (made before anything is written, never inside a transaction).

The config is taken as LangGraph's stores take it: ``dims``; ``embed`` (an
``Embeddings``, a sync or async function of a list of texts, or a ``"provider:model"``
string), resolved by LangGraph's own ``ensure_embeddings``; ``fields`` (``text_fields``
in ``SqliteStore``'s spelling), default ``["$"]`` (the whole value); PostgresStore's
``distance_type`` (``cosine``, ``l2``, ``inner_product``) and ``ann_index_config``
(accepted: every search here is exact).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langgraph.store.base import PutOp, SearchOp
from langgraph.store.base.embed import ensure_embeddings, get_text_at_path, tokenize_path

import agentstate

from .._vectors import Vectors

Key = tuple[tuple[str, ...], str]  # (namespace, key) of an item


class Index:
    """What an index config says, checked when the store is made.

    :raises ValueError: no ``embed`` or ``dims``, fields that are not a list of paths,
        an unknown ``distance_type``.
    :raises ImportError: on a file, sqlite-vec is not installed (the ``vec`` extra).
    """

    def __init__(self, db: agentstate.Database, config: dict[str, Any]) -> None:
        self.config = dict(config)
        self.embeddings = ensure_embeddings(config.get("embed"))
        fields = config.get("fields") or config.get("text_fields") or ["$"]
        if isinstance(fields, str):
            fields = [fields]
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise ValueError(f"index fields must be a list of paths, got {fields!r}")
        self.fields: list[tuple[str, Any]] = [(f, f if f == "$" else tokenize_path(f))
                                              for f in fields]
        self.vectors = Vectors(db, config.get("dims"), config.get("distance_type", "cosine"))

    def texts(self, op: PutOp) -> list[str]:
        """The texts a put embeds, in order (one vector each): those at the put's
        ``index`` paths, or the config's; none for ``index=False`` or a delete."""
        if op.value is None or op.index is False:
            return []
        paths = self.fields if op.index is None else [(p, tokenize_path(p)) for p in op.index]
        return [text for _, path in paths for text in get_text_at_path(op.value, path)]

    def wanted(self, puts: dict[Key, PutOp], searches: list[SearchOp]
               ) -> tuple[dict[Key, list[str]], list[str], list[str]]:
        """(each put's texts, the distinct texts, the distinct queries) a batch embeds."""
        texts = {k: self.texts(op) for k, op in puts.items()}
        distinct = list(dict.fromkeys(t for ts in texts.values() for t in ts))
        queries = list(dict.fromkeys(op.query for op in searches if op.query))
        return texts, distinct, queries

    def embed(self, puts: dict[Key, PutOp], searches: list[SearchOp]) -> Embedded:
        texts, distinct, queries = self.wanted(puts, searches)
        docs = self.embeddings.embed_documents(distinct) if distinct else []
        return self._checked(texts, distinct, docs, queries,
                             [self.embeddings.embed_query(q) for q in queries])

    async def aembed(self, puts: dict[Key, PutOp], searches: list[SearchOp]) -> Embedded:
        texts, distinct, queries = self.wanted(puts, searches)
        docs = await self.embeddings.aembed_documents(distinct) if distinct else []
        found = await asyncio.gather(*(self.embeddings.aembed_query(q) for q in queries))
        return self._checked(texts, distinct, docs, queries, list(found))

    def _checked(self, texts: dict[Key, list[str]], distinct: list[str], docs: Any,
                 queries: list[str], found: list[Any]) -> Embedded:
        by_text = dict(zip(distinct, self.vectors.check(docs, len(distinct))))
        return Embedded({k: [by_text[t] for t in ts] for k, ts in texts.items()},
                        dict(zip(queries, self.vectors.check(found, len(queries)))))


class Embedded:
    """A batch's vectors: each put's (by namespace and key), each query's (by its text)."""

    __slots__ = ("puts", "queries")

    def __init__(self, puts: dict[Key, list[list[float]]],
                 queries: dict[str, list[float]]) -> None:
        self.puts, self.queries = puts, queries


NOTHING = Embedded({}, {})  # a store without an index embeds nothing
