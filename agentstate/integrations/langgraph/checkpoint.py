"""``AgentStateSaver``: LangGraph's checkpointer on agentstate.

Layout. One scope per LangGraph thread, ``thread:langgraph.<thread>``; ``<ns>``
is the checkpoint namespace, ``<id↓>`` the checkpoint id in a form that sorts
in descending id order:

================================  ====================================================
``c.<ns>.<id↓>``                  a checkpoint record (JSON): metadata, channel
                                  versions, the parent id, and where each channel's
                                  bytes are
``c.<ns>.<id↓>.w.<task>.<i>``     a pending write of that checkpoint (JSON); it sorts
                                  right after its record, so one range scan reads a
                                  namespace's records newest first with their writes
``x.<ns>.<id↓>.<task>.<i>.<k>``   the bytes of a large pending write
``b.<ns>.<hash>.<k>``             channel bytes, named by their content hash: written
                                  once, shared by every record that has them, never
                                  changed (so they may be cached in memory)
``n.<ns>``                        the namespace, so a thread's namespaces can be listed
``r.<run>.<ns>.<id↓>``            marks a checkpoint of a run, for ``delete_for_runs``
================================  ====================================================

The scope ``app:langgraph.saver`` indexes threads (``t.<thread>``) and runs
(``r.<run>.<thread>``). Ids are escaped into key characters; a part too long
for its place is a hash, and the original is in the record.

Why adding a checkpoint costs the same at 10 and at 10,000 in a thread:

- a channel that did not change is not written again: the record points at
  the bytes its parent pointed at (LangGraph's SQLite saver stores every
  channel value in every checkpoint);
- a list channel that grew (the message history) is written as its new items
  only: the record keeps the list as segments, checks that the parent's items
  are an unchanged prefix (a hash of their bytes), and adds a segment for the
  new tail. Adjacent segments are merged so that each is at least twice the
  size of the next: a list of n bytes has at most about log2(n) segments, and
  each byte is rewritten at most about log2(n) times.

Two writers of one thread never share a key they could disagree on: records
are created only if absent (an id that exists with other content is refused,
never replaced), and bytes are named by their content.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import heapq
import json
import random
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

import agentstate

from ._common import (CHUNK, INLINE, BytesCache, Missing, conn_string, descending, fetch, get_json,
                      in_thread, keys, seg_keys, seg_size, segment, stash, token, write)

PREFIX = "langgraph"
RECORD_FORMAT = 1
MAX_ID_BYTES = 48  # checkpoint ids up to this long keep their order (LangGraph's are 36)
_STANDARD = ("v", "id", "ts", "channel_versions", "versions_seen", "updated_channels")


class AgentStateSaver(BaseCheckpointSaver[Any]):
    """A LangGraph checkpointer that keeps its checkpoints in an agentstate file.

    ``AgentStateSaver(db)`` stands where ``SqliteSaver(conn)`` stood; many
    processes may share the file. Every method has an async twin (``aput``,
    ``aget_tuple``, ``alist``, ...) that runs it in a worker thread.
    """

    def __init__(self, db: agentstate.Database, *, serde: SerializerProtocol | None = None,
                 cache_bytes: int = 32 << 20) -> None:
        """``cache_bytes``: memory for recently read channel bytes (immutable, so
        always current); 0 turns the cache off."""
        super().__init__(serde=serde)
        self.db = db
        self._index = db.scope("app", f"{PREFIX}.saver")
        self._cache = BytesCache(cache_bytes) if cache_bytes else None

    @classmethod
    @contextmanager
    def from_conn_string(cls, path: str) -> Iterator[AgentStateSaver]:
        """A saver on the agentstate file at ``path`` (``":memory:"``: a temporary one),
        closed on exit, like ``SqliteSaver.from_conn_string``."""
        with conn_string(path) as db:
            yield cls(db)

    def setup(self) -> None:
        """Nothing to do: the agentstate file carries its own schema."""

    # -- where things are ------------------------------------------------------

    def _scope(self, thread_id: Any) -> agentstate.Scope:
        return self.db.scope("thread", f"{PREFIX}.{_thread_token(thread_id)}")

    # -- put -----------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint; return the config that names it.

        Channels not in ``new_versions`` point at the parent's bytes (the
        parent is ``config``'s checkpoint_id); a changed list channel whose
        parent items are an unchanged prefix is stored as its new items.
        Re-putting an identical checkpoint changes nothing.

        :raises VersionConflict: the checkpoint id exists with other content
            (another writer put it): nothing is written.
        :raises InvalidKey: a checkpoint id over 48 bytes.
        :raises InvalidValue, TooLarge: metadata that is not JSON or over 1 MiB.
        """
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        parent_id = conf.get("checkpoint_id")
        cid = checkpoint["id"]
        scope = self._scope(thread_id)
        s, key = _names(ns, cid)
        parent_key = _names(ns, parent_id)[1] if parent_id else None
        metadata = get_checkpoint_metadata(config, metadata)
        for _attempt in range(3):
            # Serialize outside the write lock; the parent's record never changes,
            # unless it is deleted, which the transaction checks.
            parent = scope.get_versioned(parent_key) if parent_key else agentstate.Versioned(None, 0)
            record, blobs = self._record(scope, checkpoint, metadata, new_versions, ns, s,
                                         parent_id, parent.value)
            with self.db.transaction():
                if parent_key and scope.get_versioned(parent_key).version != parent.version:
                    continue  # the parent was deleted meanwhile: serialize again without it
                try:
                    scope.put(key, record, if_version=0)
                except agentstate.VersionConflict:
                    if get_json(scope, key) != _normal(record):
                        raise agentstate.VersionConflict(
                            f"checkpoint {cid!r} of thread {thread_id!r} exists with other "
                            "content (another writer put it); it is not replaced", 1) from None
                    break  # the same checkpoint again: a retry
                for base, data in blobs:
                    self._store_blob(scope, base, data)
                run_id = record["metadata"].get("run_id")
                # The indexes exist while a record of their namespace, thread and run does.
                known = parent.value is not None
                if not known or parent.value["metadata"].get("run_id") != run_id:
                    self._register(scope, thread_id, ns, s, key, run_id, index=not known)
                elif run_id is not None:
                    scope.put(f"r.{token(str(run_id), 40)}.{key[2:]}", {"run_id": str(run_id)})
                break
        else:
            raise agentstate.VersionConflict(f"the parent of checkpoint {cid!r} keeps changing", 0)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}

    def _register(self, scope: agentstate.Scope, thread_id: Any, ns: str, s: str, key: str,
                  run_id: Any, *, index: bool) -> None:
        """Index the run of a new checkpoint, and (``index``) its namespace and thread."""
        t = _thread_token(thread_id)
        if index:
            if scope.get_bytes(f"n.{s}") is None:
                scope.put(f"n.{s}", {"ns": ns})
            if self._index.get_bytes(f"t.{t}") is None:
                self._index.put(f"t.{t}", {"thread_id": thread_id})
        if run_id is not None:
            r = token(str(run_id), 40)
            scope.put(f"r.{r}.{key[2:]}", {"run_id": str(run_id)})
            if self._index.get_bytes(f"r.{r}.{t}") is None:
                self._index.put(f"r.{r}.{t}", {"run_id": str(run_id), "thread_id": thread_id})

    def _record(
        self, scope: agentstate.Scope, checkpoint: Checkpoint, metadata: dict[str, Any],
        new_versions: ChannelVersions, ns: str, s: str, parent_id: str | None,
        parent: dict[str, Any] | None,
    ) -> tuple[dict[str, Any], list[tuple[str, memoryview]]]:
        """The JSON record of a checkpoint, and the (key, bytes) it needs stored."""
        versions = checkpoint.get("channel_versions", {})
        values = checkpoint.get("channel_values", {})
        p_versions = parent["checkpoint"]["channel_versions"] if parent else {}
        p_channels = parent["channels"] if parent else {}
        channels: dict[str, Any] = {}
        blobs: list[tuple[str, memoryview]] = []
        for ch in sorted(set(versions) | set(values)):
            old = p_channels.get(ch)
            if ch not in new_versions and old is not None and ch in versions \
                    and p_versions.get(ch) == versions[ch]:
                channels[ch] = old  # unchanged: the parent's bytes
            elif ch in values:
                channels[ch] = self._channel(scope, values[ch], old, s, blobs)
        head = {k: checkpoint[k] for k in _STANDARD if k in checkpoint}  # type: ignore[literal-required]
        other = {k: v for k, v in checkpoint.items() if k not in _STANDARD and k != "channel_values"}
        record: dict[str, Any] = {"format": RECORD_FORMAT, "id": checkpoint["id"], "ns": ns,
                                  "parent": parent_id, "checkpoint": head, "metadata": metadata,
                                  "channels": channels}
        if other:
            if _jsonable(other):
                head.update(other)
            else:  # e.g. Send objects of older checkpoint formats
                t, data = self.serde.dumps_typed(other)
                record["other"] = {"type": t, **_blob(s, memoryview(data), blobs)}
        return record, blobs

    def _channel(self, scope: agentstate.Scope, value: Any, old: dict[str, Any] | None, s: str,
                 blobs: list[tuple[str, memoryview]]) -> dict[str, Any]:
        """The entry of a changed channel; its new bytes go to ``blobs``."""
        t, data = self.serde.dumps_typed(value)
        view = memoryview(data)
        array = _array(t, view)
        if array is None:
            return {"type": t, "segs": [_blob(s, view, blobs)]}
        n, header = array
        items = view[header:]
        start, kept = 0, []
        if old is not None and old.get("items") is not None and old["type"] == t \
                and old["items"] <= n and old["size"] <= len(items) \
                and self._same_bytes(scope, old["segs"], items):
            start, kept = old["size"], old["segs"]  # the parent's items are a prefix
        segs = _segments(s, kept, items, start, blobs)
        return {"type": t, "segs": segs, "items": n, "size": len(items)}

    def _same_bytes(self, scope: agentstate.Scope, segs: list[dict[str, Any]], data: memoryview) -> bool:
        """Whether ``data`` starts with the bytes of ``segs``: compared with the
        bytes when they are at hand (inline, or cached), else by their hash,
        which names their key. Costs a comparison of memory, not a read."""
        pos = 0
        for seg in segs:
            # bytes(...) first: comparing a memoryview is element by element, bytes is memcmp
            if "key" not in seg:
                stored = fetch(scope, seg)
                if bytes(data[pos:pos + len(stored)]) != stored:
                    return False
                pos += len(stored)
                continue
            part = bytes(data[pos:pos + seg["size"]])
            name = (scope.id, seg["key"])
            cached = self._cache.get(name) if self._cache else None
            if cached is not None:
                if part != cached:
                    return False
            elif len(part) != seg["size"] or _hash(part) != seg["key"].rsplit(".", 1)[1]:
                return False
            elif self._cache:
                self._cache.put(name, part)
            pos += seg["size"]
        return True

    def _store_blob(self, scope: agentstate.Scope, base: str, data: memoryview) -> None:
        """Write a blob's chunks unless they are there: a key named by its content
        holds the same bytes, whoever wrote it (in a transaction, so all or none)."""
        if self._cache:
            self._cache.put((scope.id, base), bytes(data))
        try:
            scope.put_bytes(f"{base}.0", bytes(data[:CHUNK]), if_version=0)
        except agentstate.VersionConflict:
            return
        write(scope, [(base, data)], start=1)

    # -- writes ----------------------------------------------------------------------

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint.

        A write whose (task, index) is stored already is kept (a retry), except
        for the special channels (errors, interrupts), which replace it, as in
        LangGraph's own savers.
        """
        conf = config["configurable"]
        scope = self._scope(conf["thread_id"])
        s, key = _names(conf.get("checkpoint_ns", ""), conf["checkpoint_id"])
        task = token(task_id, 40)
        replace = all(ch in WRITES_IDX_MAP for ch, _ in writes)
        prepared = []
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            prepared.append((idx, channel, *self.serde.dumps_typed(value)))
        with self.db.transaction():
            for idx, channel, t, data in prepared:
                wkey = f"{key}.w.{task}.{idx}"
                old = get_json(scope, wkey)
                if old is not None:
                    if not replace:
                        continue
                    for k in seg_keys(old["seg"]):
                        scope.delete(k)
                seg = stash(scope, f"x.{key[2:]}.{task}.{idx}", data)
                scope.put(wkey, {"task_id": task_id, "task_path": task_path, "channel": channel,
                                 "idx": idx, "type": t, "seg": seg})

    # -- reading ------------------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the newest of its thread and namespace;
        None when there is none."""
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        scope = self._scope(thread_id)
        cid = conf.get("checkpoint_id")
        for _attempt in range(3):  # deleted while read: look again
            if cid:
                key = _names(ns, cid)[1]
                found = _group(scope, thread_id, key, keys(scope, key, first=8))
            else:
                found = next(_records(scope, thread_id, token(ns, 40), None, 4), None)
            if found is None:
                return None
            record = get_json(scope, found[3])
            if record is None:
                continue
            try:
                return self._tuple(scope, thread_id, record, found[4])
            except Missing:
                continue
        raise agentstate.Damaged(f"thread {thread_id!r}: a checkpoint keeps vanishing while read")

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id): of ``config``'s thread (and
        namespace, when it names one; all threads when ``config`` is None),
        whose metadata has the ``filter`` values, older than ``before``, at most
        ``limit``. Reads a page at a time, so stopping early reads little."""
        conf = (config or {}).get("configurable", {})
        before_id = (before or {}).get("configurable", {}).get("checkpoint_id")
        if limit is not None and limit <= 0:
            return
        count = 0
        for _order, scope, thread_id, key, write_keys in self._candidates(conf, before_id, limit):
            record = get_json(scope, key)
            if record is None or not _matches(record["metadata"], filter):
                continue
            try:
                tup = self._tuple(scope, thread_id, record, write_keys)
            except Missing:
                continue  # deleted while we read it
            yield tup
            count += 1
            if limit is not None and count >= limit:
                return

    def _candidates(self, conf: dict[str, Any], before_id: str | None, limit: int | None
                    ) -> Iterator[tuple[str, agentstate.Scope, Any, str, list[str]]]:
        """(order, scope, thread id, record key, its write keys), newest first."""
        if "thread_id" in conf:
            threads = [conf["thread_id"]]
        else:
            entries = (get_json(self._index, k) for k in keys(self._index, "t."))
            threads = [e["thread_id"] for e in entries if e is not None]
        first = (limit or 8) + 8
        streams: list[Iterator[Any]] = []
        for thread_id in threads:
            scope = self._scope(thread_id)
            cid = conf.get("checkpoint_id")
            if cid:
                key = _names(conf.get("checkpoint_ns", ""), cid)[1]
                if before_id is None or descending(cid) > descending(before_id):
                    found = _group(scope, thread_id, key, keys(scope, key, first=8))
                    streams.append(iter([found] if found else []))
                continue
            if conf.get("checkpoint_ns") is not None:  # None or absent: every namespace
                spaces = [token(conf["checkpoint_ns"], 40)]
            else:
                spaces = [k[2:] for k in keys(scope, "n.")]
            for s in spaces:
                # after the record named by before and its writes (c.<ns>.<id↓>.w...)
                start = f"c.{s}.{descending(before_id, MAX_ID_BYTES)}.x" if before_id else None
                streams.append(_records(scope, thread_id, s, start, first))
        return heapq.merge(*streams, key=lambda x: x[0])

    def _tuple(self, scope: agentstate.Scope, thread_id: Any, record: dict[str, Any],
               write_keys: list[str]) -> CheckpointTuple:
        """A record as LangGraph's tuple.

        :raises Missing: its bytes were deleted meanwhile.
        :raises SchemaTooNew: the record was written by a newer agentstate.
        """
        if record.get("format", 1) > RECORD_FORMAT:
            raise agentstate.SchemaTooNew(
                f"checkpoint {record.get('id')!r} has record format {record['format']}; "
                f"this agentstate reads {RECORD_FORMAT}: upgrade agentstate")
        ns, cid = record["ns"], record["id"]
        checkpoint: dict[str, Any] = dict(record["checkpoint"])
        if "other" in record:
            other = record["other"]
            checkpoint.update(self.serde.loads_typed((other["type"], fetch(scope, other, self._cache))))
        checkpoint["channel_values"] = {
            ch: self._value(scope, entry) for ch, entry in record["channels"].items()
        }
        writes = [w for w in (get_json(scope, k) for k in write_keys) if w is not None]
        writes.sort(key=lambda w: (w["task_path"], w["task_id"], w["idx"]))
        pending = [(w["task_id"], w["channel"],
                    self.serde.loads_typed((w["type"], fetch(scope, w["seg"])))) for w in writes]
        conf = {"thread_id": thread_id, "checkpoint_ns": ns}
        parent = record["parent"]
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": cid}},
            checkpoint=checkpoint,  # type: ignore[arg-type]
            metadata=record["metadata"],
            parent_config={"configurable": {**conf, "checkpoint_id": parent}} if parent else None,
            pending_writes=pending,
        )

    def _value(self, scope: agentstate.Scope, entry: dict[str, Any]) -> Any:
        data = b"".join(fetch(scope, seg, self._cache) for seg in entry["segs"])
        if entry.get("items") is not None:
            data = _array_header(entry["items"]) + data
        return self.serde.loads_typed((entry["type"], data))

    # -- deleting and copying ---------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Remove every checkpoint and write of a thread (one transaction)."""
        scope = self._scope(thread_id)
        t = _thread_token(thread_id)
        with self.db.transaction():
            runs = set()
            for key in list(keys(scope, "")):
                if key.startswith("r."):
                    runs.add(key.split(".")[1])
                scope.delete(key)
            self._index.delete(f"t.{t}")
            for r in runs:
                self._index.delete(f"r.{r}.{t}")

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) whose metadata names one of
        ``run_ids``, in every thread; bytes other checkpoints still use stay."""
        with self.db.transaction():
            for run_id in run_ids:
                r = token(str(run_id), 40)
                for index_key in list(keys(self._index, f"r.{r}.")):
                    entry = get_json(self._index, index_key)
                    if entry is None or entry["run_id"] != str(run_id):
                        continue
                    scope = self._scope(entry["thread_id"])
                    victims = set()
                    for marker in list(keys(scope, f"r.{r}.")):
                        if get_json(scope, marker)["run_id"] == str(run_id):
                            victims.add("c." + marker.split(".", 2)[2])
                    self._delete_records(scope, entry["thread_id"], victims)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another (one transaction).

        :raises VersionConflict: the target holds one of the keys with other
            content; nothing is copied.
        """
        src, dst = self._scope(source_thread_id), self._scope(target_thread_id)
        t = _thread_token(target_thread_id)
        with self.db.transaction():
            copied = False
            for key in list(keys(src, "")):
                value, have = src.get_bytes(key), dst.get_bytes(key)
                if have is not None and have != value:
                    raise agentstate.VersionConflict(
                        f"thread {target_thread_id!r} holds {key} with other content", 1)
                if have is None:
                    if key[0] in "bx":  # payload chunks are bytes; the rest JSON
                        dst.put_bytes(key, value, if_version=0)
                    else:
                        dst.put(key, json.loads(value), if_version=0)
                if key.startswith("r."):
                    r = key.split(".")[1]
                    if self._index.get_bytes(f"r.{r}.{t}") is None:
                        self._index.put(f"r.{r}.{t}", {"run_id": json.loads(value)["run_id"],
                                                       "thread_id": target_thread_id})
                copied = copied or key.startswith("c.")
            if copied and self._index.get_bytes(f"t.{t}") is None:
                self._index.put(f"t.{t}", {"thread_id": target_thread_id})

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep the newest checkpoint of each namespace, with its
        writes, and the ancestors a ``DeltaChannel`` still needs (back to one
        whose metadata has no ``counters_since_delta_snapshot``: every delta
        channel has a snapshot there). ``"delete"``: remove the threads.

        :raises ValueError: an unknown strategy.
        """
        if strategy == "delete":
            for thread_id in thread_ids:
                self.delete_thread(thread_id)
            return
        if strategy != "keep_latest":
            raise ValueError(f"unknown prune strategy {strategy!r} (keep_latest or delete)")
        for thread_id in thread_ids:
            scope = self._scope(thread_id)
            with self.db.transaction():
                kept = set()
                for n in list(keys(scope, "n.")):
                    newest = next(_records(scope, thread_id, n[2:], None, 4), None)
                    record = get_json(scope, newest[3]) if newest else None
                    while record is not None:
                        kept.add(_names(record["ns"], record["id"])[1])
                        if not record["metadata"].get("counters_since_delta_snapshot") \
                                or not record["parent"]:
                            break
                        record = get_json(scope, _names(record["ns"], record["parent"])[1])
                victims = {k for k in keys(scope, "c.") if _is_record(k) and k not in kept}
                self._delete_records(scope, thread_id, victims)

    def _delete_records(self, scope: agentstate.Scope, thread_id: Any, victims: set[str]) -> None:
        """Delete checkpoint records with their writes, run markers and the bytes
        no surviving record of their namespace points at (in a transaction)."""
        spaces: dict[str, set[str]] = {}
        for key in victims:
            spaces.setdefault(key.split(".")[1], set()).add(key)
        t = _thread_token(thread_id)
        for s, doomed in spaces.items():
            used: set[str] = set()
            unused: set[str] = set()
            for key in keys(scope, f"c.{s}."):
                if _is_record(key):
                    (unused if key in doomed else used).update(_byte_keys(get_json(scope, key)))
            for key in doomed:
                record = get_json(scope, key)
                if record is None:
                    continue
                for k in list(keys(scope, f"{key}.w.")) + list(keys(scope, f"x.{key[2:]}.")):
                    scope.delete(k)
                run_id = record["metadata"].get("run_id")
                if run_id is not None:
                    r = token(str(run_id), 40)
                    scope.delete(f"r.{r}.{key[2:]}")
                    if not scope.list(f"r.{r}.", limit=1):
                        self._index.delete(f"r.{r}.{t}")
                scope.delete(key)
            for base in unused - used:
                for k in list(keys(scope, f"{base}.")):
                    scope.delete(k)
            if not scope.list(f"c.{s}.", limit=1):
                scope.delete(f"n.{s}")
        if not scope.list("n.", limit=1):
            self._index.delete(f"t.{t}")

    # -- versions ------------------------------------------------------------------------

    def get_next_version(self, current: Any, channel: None = None) -> Any:
        """Integers 1, 2, 3, ...; a string version (LangGraph's SQLite format) stays one."""
        if isinstance(current, str):
            n = int(current.split(".")[0]) + 1
            return f"{n:032}.{random.random():016}"
        return 1 if current is None else current + 1

    # -- async twins ----------------------------------------------------------------------

    aput = in_thread(put)
    aput_writes = in_thread(put_writes)
    aget_tuple = in_thread(get_tuple)
    adelete_thread = in_thread(delete_thread)
    adelete_for_runs = in_thread(delete_for_runs)
    acopy_thread = in_thread(copy_thread)
    aprune = in_thread(prune)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Async twin of ``list``: pages of tuples are read in a worker thread."""
        it = self.list(config, filter=filter, before=before, limit=limit)
        while True:
            page = await asyncio.to_thread(_take, it, 20)
            for tup in page:
                yield tup
            if len(page) < 20:
                return


# -- keys --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def _names(ns: str, checkpoint_id: str) -> tuple[str, str]:
    """(namespace token, record key) of a checkpoint."""
    s = token(ns, 40)
    return s, f"c.{s}.{descending(checkpoint_id, MAX_ID_BYTES)}"


@functools.lru_cache(maxsize=4096)
def _thread_token(thread_id: Any) -> str:
    return token(str(thread_id), 150)


def _is_record(key: str) -> bool:
    return key.count(".") == 2  # c.<ns>.<id↓>; a write key has more parts


def _group(scope: agentstate.Scope, thread_id: Any, key: str, found: Iterator[str]
           ) -> tuple[str, agentstate.Scope, Any, str, list[str]] | None:
    """The record ``key`` with its write keys, from the keys that start with it."""
    first = next(found, None)
    if first != key:
        return None
    return key.split(".", 2)[2], scope, thread_id, key, [k for k in found if k.startswith(f"{key}.w.")]


def _records(scope: agentstate.Scope, thread_id: Any, s: str, after: str | None, first: int
             ) -> Iterator[tuple[str, agentstate.Scope, Any, str, list[str]]]:
    """(order, scope, thread id, record key, its write keys) of a namespace, newest
    first, from one range scan (a record's writes sort right after it)."""
    prefix = f"c.{s}."
    current: str | None = None
    writes: list[str] = []
    for k in keys(scope, prefix, after=after, first=first):
        if _is_record(k):
            if current is not None:
                yield current[len(prefix):], scope, thread_id, current, writes
            current, writes = k, []
        elif current is not None and k.startswith(f"{current}.w."):
            writes.append(k)
    if current is not None:
        yield current[len(prefix):], scope, thread_id, current, writes


# -- bytes -------------------------------------------------------------------------------


def _hash(data: memoryview | bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def _blob(s: str, data: memoryview, blobs: list[tuple[str, memoryview]]) -> dict[str, Any]:
    """A segment for ``data``: inline when small, else a key named by its content."""
    return segment(f"b.{s}.{_hash(data)}" if len(data) > INLINE else "", data, blobs)


def _array(type_: str, data: memoryview) -> tuple[int, int] | None:
    """(item count, header length) when ``data`` is a msgpack array, else None."""
    if type_ != "msgpack" or not data:
        return None
    b = data[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F, 1
    if b == 0xDC and len(data) >= 3:
        return int.from_bytes(data[1:3], "big"), 3
    if b == 0xDD and len(data) >= 5:
        return int.from_bytes(data[1:5], "big"), 5
    return None


def _array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def _segments(s: str, kept: list[dict[str, Any]], data: memoryview, start: int,
              blobs: list[tuple[str, memoryview]]) -> list[dict[str, Any]]:
    """``kept`` (the stored segments of ``data[:start]``) plus ``data[start:]``,
    merging from the end while a segment is under twice the size of the next;
    merged bytes come from ``data``, which holds them all. New bytes go to ``blobs``."""
    sizes = [seg_size(seg) for seg in kept]
    segs: list[Any] = list(kept)
    if len(data) > start or not segs:
        segs.append(None)  # None: a new segment, its bytes are data[its start:]
        sizes.append(len(data) - start)
    while len(segs) >= 2 and sizes[-2] < 2 * sizes[-1]:
        sizes[-2:] = [sizes[-2] + sizes[-1]]
        segs[-2:] = [None]
    if segs[-1] is None:  # the new (possibly merged) tail
        segs[-1] = _blob(s, data[len(data) - sizes[-1]:], blobs)
    return segs


def _byte_keys(record: dict[str, Any] | None) -> set[str]:
    """The payload keys a record points at."""
    if record is None:
        return set()
    segs = [seg for entry in record["channels"].values() for seg in entry["segs"]]
    segs.append(record.get("other", {}))
    return {seg["key"] for seg in segs if "key" in seg}


# -- values ------------------------------------------------------------------------------


def _take(it: Iterator[Any], n: int) -> list[Any]:
    out = []
    for x in it:
        out.append(x)
        if len(out) == n:
            break
    return out


def _normal(value: Any) -> Any:
    """``value`` as it reads back from the store (tuples become lists)."""
    return json.loads(json.dumps(value))


def _jsonable(v: Any, depth: int = 0) -> bool:
    if depth > 100:
        return False
    if v is None or isinstance(v, (str, bool, int)):
        return True
    if isinstance(v, float):
        return v == v and v not in (float("inf"), float("-inf"))
    if isinstance(v, (list, tuple)):
        return all(_jsonable(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _jsonable(x, depth + 1) for k, x in v.items())
    return False


def _matches(metadata: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    """Whether metadata has every ``filter`` value (a dotted key walks into objects)."""
    for key, want in (filter or {}).items():
        have: Any = metadata
        for part in key.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        if have != want:
            return False
    return True


__all__ = ["AgentStateSaver"]
