"""Google ADK memory in agentstate (SPEC §19): ``pip install 'agentstate-db[adk]'``.

    from agentstate.integrations.adk import AgentStateSessionService
    from agentstate.integrations.adk_memory import AgentStateMemoryService
    runner = Runner(agent=agent, app_name="app", session_service=AgentStateSessionService(db),
                    memory_service=AgentStateMemoryService(db))

``AgentStateMemoryService`` is an ADK ``BaseMemoryService`` in the same store as
the sessions. Without an index it finds memories by keywords, as ADK's
``InMemoryMemoryService`` does (the same memories, in the same order: at most
ten, those sharing the most words with the query); with
``index={"dims": N, "embed": fn}`` by meaning (the ten nearest, by cosine
similarity, or the index's ``distance_type``). A memory is an event of a
session that has content: what ``add_session_to_memory`` or
``add_events_to_memory`` was given, less what ``delete_memory`` removed.

Where it is kept, in the user's scope of the session service
(``user:adk:APP:USER``), so a user's memories are found only by that user:

- ``mem.s.<session>``: the session's memories, in order, and when the session
  was first added (searches list memories session by session, in that order);
- ``mem.e.<session>:<event>``: a memory: the event's id, author, time, content
  and text;
- ``mem.v.<session>:<event>.0``: with an index, its vector (``_vectors.py``);
- ``mem.d.<event>``: an event deleted from memory, which is not added again;
- ``mem.n``: how many sessions were added.

Adding a session writes what changed since it was last added, in one
transaction: adding it twice adds nothing twice. Texts are embedded before that
transaction (only the events not embedded yet), never inside it.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import re
import unicodedata
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

try:
    from google.adk.events.event import Event
    from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
    from google.adk.memory.memory_entry import MemoryEntry
    from google.adk.sessions.session import Session
    from google.genai import types
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "agentstate.integrations.adk_memory needs Google ADK: pip install 'agentstate-db[adk]'"
    ) from e

import agentstate
from agentstate._encoding import MAX_VALUE
from agentstate._scope import MAX_MANY

from ._vectors import Vectors, embed, prefix_range
from .adk import _escape, _name

__all__ = ["AgentStateMemoryService"]

MAX_RESULTS = 10  # as InMemoryMemoryService
UNKNOWN_SESSION = "__unknown_session_id__"  # events added without a session, as ADK names them
_TOKEN = 60  # characters of an escaped id in a key; a longer one is hashed


def _token(text: str) -> str:
    """An id in key characters without ``:`` (``_hh`` escapes; ``_h...``: a hash, which
    no escaped id starts with)."""
    e = _escape(text)
    return e if len(e) <= _TOKEN else "_h" + hashlib.sha256(text.encode()).hexdigest()[:40]


def _text(content: types.Content) -> str:
    return " ".join(part.text for part in content.parts or () if part.text)


class AgentStateMemoryService(BaseMemoryService):
    """ADK memories in an agentstate store, beside its sessions.

    ``db``: an open ``agentstate.Database`` (the session service's), or a path,
    opened here and closed by ``close()``. ``index``: ``{"dims": N, "embed": fn}``
    (``fn`` a function of a list of texts, sync or async, or a LangChain
    ``Embeddings``; optional ``distance_type``: ``cosine``, ``l2``,
    ``inner_product``) to search by meaning; without it, by keywords. Every method
    runs its store work in a worker thread.

    :raises ValueError: a bad index (see ``Vectors``).
    :raises ImportError: an index on a file without sqlite-vec (the ``vec`` extra).
    """

    def __init__(self, db: agentstate.Database | str | os.PathLike[str],
                 index: Mapping[str, Any] | None = None) -> None:
        self._owns_db = not isinstance(db, agentstate.Database)
        self._db = db if isinstance(db, agentstate.Database) else agentstate.open(db)
        self._embed = None if index is None else index.get("embed")
        if index is not None and self._embed is None:
            raise ValueError("an index needs embed: a function of a list of texts")
        self._vectors = None if index is None else Vectors(
            self._db, index.get("dims"), index.get("distance_type", "cosine"))

    @property
    def db(self) -> agentstate.Database:
        return self._db

    def _user(self, app_name: str, user_id: str) -> agentstate.Scope:
        return self._db.scope("user", _name("adk:", "adk.h:", app_name, user_id))

    # -- the ADK interface ---------------------------------------------------------

    async def add_session_to_memory(self, session: Session) -> None:
        """The session's events with content become its memories (those it had and no
        longer has are forgotten; an event deleted from memory is not added again)."""
        events = [e for e in session.events if e.content and e.content.parts]
        await self._add(session.app_name, session.user_id, session.id, events, replace=True)

    async def add_events_to_memory(self, *, app_name: str, user_id: str, events: Sequence[Event],
                                   session_id: str | None = None,
                                   custom_metadata: Mapping[str, object] | None = None) -> None:
        """Adds the events with content that the session's memories do not have yet."""
        kept = [e for e in events if e.content and e.content.parts]
        await self._add(app_name, user_id, session_id or UNKNOWN_SESSION, kept, replace=False)

    async def search_memory(self, *, app_name: str, user_id: str,
                            query: str) -> SearchMemoryResponse:
        """The user's memories that best match ``query``: by meaning with an index, else
        by the words they share with it (as InMemoryMemoryService)."""
        user = self._user(app_name, user_id)
        if self._vectors is None:
            return SearchMemoryResponse(memories=await asyncio.to_thread(self._by_words, user, query))
        (q,) = self._vectors.check(await embed(self._embed, [query], query=True), 1)
        return SearchMemoryResponse(memories=await asyncio.to_thread(self._nearest, user, q))

    async def delete_memory(self, *, app_name: str, user_id: str,
                            memory_id: str | None = None) -> None:
        """Forgets the memory (an event's id) in every session of the user; an event
        forgotten is not added again by a later add."""
        if memory_id:
            await asyncio.to_thread(self._delete, self._user(app_name, user_id), memory_id)

    async def close(self) -> None:
        """Closes the database if this service opened it (given a path)."""
        if self._owns_db:
            self._db.close()

    # -- adding -------------------------------------------------------------------------

    async def _add(self, app_name: str, user_id: str, session_id: str, events: list[Event],
                   replace: bool) -> None:
        user = self._user(app_name, user_id)
        s = _token(session_id)
        vectors: dict[str, list[float]] = {}
        for _ in range(5):  # again only if another writer removed a vector meanwhile
            if self._vectors is not None:
                have = await asyncio.to_thread(self._embedded, user, s, events, replace)
                need = [e for e in events if e.id not in vectors and e.id not in have
                        and _text(e.content)]
                found = await embed(self._embed, [_text(e.content) for e in need])
                vectors.update(zip((e.id for e in need), self._vectors.check(found, len(need))))
            if await asyncio.to_thread(self._write, user, session_id, s, events, vectors,
                                       replace):
                return
        raise agentstate.Busy(f"the memories of session {session_id!r} kept changing meanwhile")

    def _embedded(self, user: agentstate.Scope, s: str, events: list[Event],
                  replace: bool) -> set[str]:
        """The ids among ``events`` whose memory has its vector already (and, when they
        replace the session's memories, is the same event)."""
        with self._db.snapshot():
            digests = (user.get(f"mem.s.{s}") or {}).get("digests", {})
            have = set(_listed(user, f"mem.v.{s}:"))  # the session's vectors (``s`` has no ":")
        return {e.id for e in events if f"mem.v.{s}:{_token(e.id)}.0" in have
                and (not replace or digests.get(_token(e.id)) == _digest(_entry(e)))}

    def _write(self, user: agentstate.Scope, session_id: str, s: str, events: list[Event],
               vectors: dict[str, list[float]], replace: bool) -> bool:
        """The session's memories made ``events`` (``replace``) or extended by them, in one
        transaction; False (nothing written) if a vector it needs is not in ``vectors``."""
        with self._db.transaction():
            record = user.get(f"mem.s.{s}")
            order = record["order"] if record else user.get("mem.n", 0)
            old = record["events"] if record else []
            gone = _get_many(user, [f"mem.d.{_token(e.id)}" for e in events])
            add = [e for e in dict((e.id, e) for e in events).values()
                   if not gone[f"mem.d.{_token(e.id)}"].version]
            tokens = [_token(e.id) for e in add]
            have = set(_listed(user, f"mem.v.{s}:")) if self._vectors else set()
            digests = dict(record.get("digests", {})) if record else {}
            entries = {t: _entry(e) for e, t in zip(add, tokens)}
            sums = {t: _digest(entry) for t, entry in entries.items()}
            # What is written: the events it does not have; replacing, those that changed too
            # (as InMemoryMemoryService, which keeps the last copy of a session's events)
            stored = set(old)
            new = [(e, t) for e, t in zip(add, tokens)
                   if t not in stored or replace and digests.get(t) != sums[t]]
            changed = {t for _, t in new}
            redo = [(e, t) for e, t in zip(add, tokens) if self._vectors is not None
                    and _text(e.content) and (f"mem.v.{s}:{t}.0" not in have or t in changed)]
            if any(e.id not in vectors for e, _ in redo):
                return False
            listed = tokens if replace else old + [t for _, t in new]
            keep = set(listed)
            if record and listed == old and not new and not redo:
                return True  # nothing new
            with self._db.batch() as b:
                w = b.scope(user.kind, user.id)
                for t in old:
                    if t not in keep:
                        w.delete(f"mem.e.{s}:{t}")
                        w.delete(f"mem.v.{s}:{t}.0")
                for e, t in new:
                    w.put(f"mem.e.{s}:{t}", entries[t])
                    digests[t] = sums[t]
                    if not _text(e.content):
                        w.delete(f"mem.v.{s}:{t}.0")  # a text it no longer has
                for e, t in redo:
                    self._vectors.put(w, f"mem.v.{s}:{t}.0", vectors[e.id])  # type: ignore[union-attr]
                w.put(f"mem.s.{s}", {"session_id": session_id, "order": order, "events": listed,
                                     "digests": {t: digests[t] for t in listed}})
                if record is None:
                    w.put("mem.n", order + 1)
        return True

    def _delete(self, user: agentstate.Scope, memory_id: str) -> None:
        t = _token(memory_id)
        with self._db.transaction():
            found = False
            for key in _listed(user, "mem.e."):
                if key.endswith(":" + t):
                    s = key[len("mem.e."):-len(t) - 1]
                    record = user.get(f"mem.s.{s}")
                    record["events"] = [x for x in record["events"] if x != t]
                    record.get("digests", {}).pop(t, None)
                    user.put(f"mem.s.{s}", record)
                    user.delete(key)
                    user.delete(f"mem.v.{s}:{t}.0")
                    found = True
            if found:
                user.put(f"mem.d.{t}", memory_id)

    # -- searching ------------------------------------------------------------------------

    def _by_words(self, user: agentstate.Scope, query: str) -> list[MemoryEntry]:
        """InMemoryMemoryService's search: each memory scored by the query words it has,
        the ten best, ties in the order the memories were added."""
        words = _words(query)
        with self._db.snapshot():
            records = [record for _, record in _items(user, "mem.s.")]
            entries = dict(_items(user, "mem.e."))
        scored = []
        for record in sorted(records, key=lambda r: r["order"]):
            s = _token(record["session_id"])
            for t in record["events"]:
                entry = entries.get(f"mem.e.{s}:{t}")
                if entry is None:
                    continue
                has, lower = _searchable(entry["text"]), unicodedata.normalize("NFC", entry["text"]).lower()
                if not has:
                    continue
                n = sum(1 for w in words if w in has or (not w.isascii() and w in lower))
                if n:
                    scored.append((n, entry))
        scored.sort(key=lambda p: -p[0])  # stable: equal ones stay in the order added
        return [_memory(entry) for _, entry in scored[:MAX_RESULTS]]

    def _nearest(self, user: agentstate.Scope, query: list[float]) -> list[MemoryEntry]:
        """The ten memories whose vectors are nearest the query's, nearest first."""
        assert self._vectors is not None
        with self._db.snapshot():
            rows = self._vectors.nearest(user.kind, user.id, [prefix_range("mem.v.")], query,
                                         MAX_RESULTS)
            keys = ["mem.e." + k[len("mem.v."):k.rindex(".")] for k, _ in rows]
            found = _get_many(user, keys)
        return [_memory(found[k].value) for k in keys if found[k].value is not None]


# -- helpers --------------------------------------------------------------------------------

def _entry(e: Event) -> dict[str, Any]:
    """What a memory keeps of an event. Its content is kept whole, unless that passes
    what a value may hold (an image, say): then its text parts, which are what ADK's
    memory tools read of it."""
    entry = {"id": e.id, "author": e.author, "timestamp": e.timestamp, "text": _text(e.content),
             "content": e.content.model_dump(mode="json", exclude_none=True)}
    if len(json.dumps(entry, ensure_ascii=False).encode()) > MAX_VALUE // 2:
        entry["content"] = types.Content(role=e.content.role, parts=[
            p for p in e.content.parts or () if p.text]).model_dump(mode="json", exclude_none=True)
    return entry


def _digest(entry: dict[str, Any]) -> str:
    """What tells a changed memory from the one stored (kept in its session's record)."""
    return hashlib.blake2b(json.dumps(entry, sort_keys=True).encode(), digest_size=8).hexdigest()


def _get_many(scope: agentstate.Scope, keys: list[str]) -> dict[str, agentstate.Versioned]:
    """``get_many`` of any number of keys (it reads at most MAX_MANY at a time)."""
    out: dict[str, agentstate.Versioned] = {}
    for i in range(0, len(keys), MAX_MANY):
        out.update(scope.get_many(keys[i:i + MAX_MANY]))
    return out


def _listed(scope: agentstate.Scope, prefix: str) -> list[str]:
    keys: list[str] = []
    while page := scope.list(prefix, after=keys[-1] if keys else None, limit=500):
        keys += page
    return keys


def _items(scope: agentstate.Scope, prefix: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    while page := scope.items(prefix, after=out[-1][0] if out else None, limit=500):
        out += [(k, v.value) for k, v in page]
    return out


def _memory(entry: dict[str, Any]) -> MemoryEntry:
    return MemoryEntry(id=entry["id"], author=entry["author"],
                       content=types.Content.model_validate(entry["content"]),
                       timestamp=datetime.fromtimestamp(entry["timestamp"]).isoformat())


# The words of a text, as InMemoryMemoryService reads them (google.adk.memory
# .in_memory_memory_service): Unicode \w+ runs, lowercased after NFC; an event's text
# also by each run of Latin or of other letters inside a word that mixes them (so a
# Latin word inside Japanese text is a word of its own).

def _words(text: str) -> set[str]:
    return {w.lower() for w in re.findall(r"\w+", unicodedata.normalize("NFC", text))}


def _latin(c: str) -> bool:
    if c.isascii():
        return c.isalnum() or c == "_"
    return unicodedata.name(c, "").startswith("LATIN")


def _searchable(text: str) -> set[str]:
    words = _words(text)
    for word in list(words):
        if not word.isascii():
            words.update("".join(g) for _, g in itertools.groupby(word, _latin))
    return words
