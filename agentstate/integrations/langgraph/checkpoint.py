"""``AgentStateSaver``: LangGraph's checkpointer on agentstate.

Where things are and why a checkpoint costs the same at any history length:
``_layout.py``. Deleting, copying and pruning threads: ``_threads.py``.

Each LangGraph call is one call of the store where LangGraph's SQLite saver
runs one query: ``get_tuple`` is one range read (``scope.items``) of the
checkpoint's record with its writes, ``list`` reads pages of them, and
``put_writes`` is one append. ``put`` is one batch: a check that the parent
(whose bytes the new record may point at) is still the one read, and the
record; one transaction instead when it has new channel bytes to store or the
parent was not read before. Channel bytes are named by their content and never
change, so recently used ones are kept in memory; so are the records this
saver wrote or read last (a record is never changed either: its version
says whether it is still the one stored).

A thread stored by agentstate 0.2 is migrated to this layout, in one
transaction, the first time a call meets it (``_upgrade.py``).
"""

from __future__ import annotations

import asyncio
import heapq
import random
import uuid
from collections import OrderedDict
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
from agentstate._encoding import encode
from agentstate._twins import async_twin
from agentstate.integrations import on_a_file

from . import _threads
from ._common import (CHUNK, BytesCache, Missing, conn_string, descending, fetch, get_json,
                      keys, local, on_pool, segment, write)
from ._layout import (MAX_ID_BYTES, PREFIX, RECORD_FORMAT, STANDARD, Found, OldLayout, Parent,
                      array, array_header, blob, checkpoints, content_hash, jsonable, matches,
                      json_copy, names, normal, ns_token, ordered, payload_keys, pending,
                      record_bytes, run_token, segments, take, thread_token)
from ._upgrade import upgrade

PARENTS = 256  # records kept in memory to serve as the parent of the next put


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
        self.db = local(db, "AgentStateSaver")
        self._index = db.scope("app", f"{PREFIX}.saver")
        self._cache = BytesCache(cache_bytes) if cache_bytes else None
        # (scope id, base key) -> what a put needs of a stored record as its parent (a
        # copy: the tuples handed to LangGraph share nothing with it)
        self._records: OrderedDict[tuple[str, str], Parent] = OrderedDict()
        # (scope id, namespace token) -> rows its newest checkpoint took to read last time
        self._newest_rows: dict[tuple[str, str], int] = {}
        self._inline = on_a_file(db)  # aget_tuple reads on the loop's thread
        self._scopes: dict[Any, agentstate.Scope] = {}
        self._known: dict[Any, Any] = {}  # records parsed (see _layout.checkpoints)

    @classmethod
    @contextmanager
    def from_conn_string(cls, path: str) -> Iterator[AgentStateSaver]:
        """A saver on the agentstate file at ``path`` (``":memory:"``: a temporary one),
        closed on exit, like ``SqliteSaver.from_conn_string``."""
        with conn_string(path) as db:
            yield cls(db)

    def setup(self) -> None:
        """Nothing to do: the agentstate file carries its own schema."""

    def _scope(self, thread_id: Any) -> agentstate.Scope:
        """The thread's scope (kept: a Scope holds nothing that changes)."""
        scope = self._scopes.get(thread_id)
        if scope is None:
            if len(self._scopes) >= PARENTS:
                self._scopes.clear()
            scope = self._scopes[thread_id] = self.db.scope("thread", f"{PREFIX}.{thread_token(thread_id)}")
        return scope

    def _remember(self, scope: agentstate.Scope, base: str, record: dict[str, Any],
                  version: int) -> Parent:
        entry = (scope.id, base)
        parent = self._records.get(entry)
        if parent is None or parent.version != version:  # a record at a version never changes
            parent = self._records[entry] = Parent(record, version)
            while len(self._records) > PARENTS:
                self._records.popitem(last=False)
        self._records.move_to_end(entry)
        return parent

    # -- put -----------------------------------------------------------------------

    @on_pool
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
        s, base = names(ns, cid)
        parent_base = names(ns, parent_id)[1] if parent_id else None
        meta: dict[str, Any] = dict(get_checkpoint_metadata(config, metadata))
        for attempt in range(3):
            # Serialized outside the write lock, against the parent as last seen; the
            # transaction checks it is still the one stored (its version), since a
            # parent deleted meanwhile may have taken bytes this record points at.
            parent: Parent | None = None
            if parent_base:
                parent = self._records.get((scope.id, parent_base)) if attempt == 0 else None
                if parent is None:
                    stored = scope.get_versioned(parent_base + ".r")
                    if stored.value is None and scope.get_bytes(parent_base) is not None:
                        upgrade(self.db, scope)  # the parent is of agentstate 0.2's layout
                        stored = scope.get_versioned(parent_base + ".r")
                    if stored.value is not None:
                        parent = Parent(stored.value, stored.version)
            record, blobs = self._record(scope, checkpoint, meta, new_versions, ns, s,
                                         parent_id, parent)
            if attempt == 0 and parent is not None:
                done = self._put_at_once(scope, thread_id, base, parent_base, parent, record, blobs)
                if done is not None:
                    version = done
                    break
            with self.db.transaction():
                if parent_base and scope.get_versioned(parent_base + ".r").version != \
                        (parent.version if parent else 0):
                    self._records.pop((scope.id, parent_base), None)
                    continue  # the parent changed (or went) meanwhile: serialize again
                try:
                    version = scope.put(base + ".r", record, if_version=0)
                except agentstate.VersionConflict:
                    stored = scope.get_versioned(base + ".r")
                    if stored.value != normal(record):
                        raise agentstate.VersionConflict(
                            f"checkpoint {cid!r} of thread {thread_id!r} exists with other "
                            "content (another writer put it); it is not replaced", 1) from None
                    record, version = stored  # the same checkpoint again: a retry
                    break
                for key, data in blobs:
                    self._store_blob(scope, key, data)
                run_id = record["metadata"].get("run_id")
                if parent is None:
                    self._register(scope, thread_id, s, ns)
                if run_id is not None and (parent is None or parent.run_id != run_id):
                    self._register_run(scope, thread_id, run_id)
            break
        else:
            raise agentstate.VersionConflict(f"the parent of checkpoint {cid!r} keeps changing", 0)
        self._remember(scope, base, record, version)
        return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}}

    def _put_at_once(self, scope: agentstate.Scope, thread_id: Any, base: str, parent_base: Any,
                     parent: Parent, record: dict[str, Any],
                     blobs: list[tuple[str, memoryview]]) -> int | None:
        """The put as one batch (on PostgreSQL one round trip, where the transaction takes
        three), when all its channel bytes are inline or the parent's, which exist while
        the parent does: the parent checked at the version seen, the record put if
        absent, a new run indexed. The record's version; None when the batch is refused
        (the parent changed, a retry of this put, a run indexed before): nothing is
        written, and the transaction sorts each case out."""
        if blobs and not {key for key, _data in blobs} <= parent.blobs():
            return None
        run_id = record["metadata"].get("run_id")
        data = record_bytes(record)
        ops: list[Any] = [
            ("check", scope.kind, scope.id, parent_base + ".r", (), {"if_version": parent.version}),
            ("put", scope.kind, scope.id, base + ".r", ("bytes", data, len(data), None),
             {"if_version": 0, "ttl": None})]
        if run_id is not None and parent.run_id != run_id:
            r, t = run_token(run_id), thread_token(thread_id)
            for kind, sid, key, value in ((scope.kind, scope.id, f"u.{r}", {"run_id": str(run_id)}),
                                          (self._index.kind, self._index.id, f"r.{r}.{t}",
                                           {"run_id": str(run_id), "thread_id": thread_id})):
                text, size = encode(value)
                ops.append(("put", kind, sid, key, ("json", text, size, None), {"if_version": 0, "ttl": None}))
        try:  # the batch's ops as db.batch() makes them (_batch.py), its keys ours by construction
            return self.db._ops.apply_batch(ops)[1]
        except agentstate.VersionConflict:
            return None

    def _register(self, scope: agentstate.Scope, thread_id: Any, s: str, ns: str) -> None:
        """Index the namespace and the thread of a checkpoint without a stored parent."""
        if scope.get_bytes(f"n.{s}") is None:
            scope.put(f"n.{s}", {"ns": ns})
        t = thread_token(thread_id)
        if self._index.get_bytes(f"t.{t}") is None:
            self._index.put(f"t.{t}", {"thread_id": thread_id})

    def _register_run(self, scope: agentstate.Scope, thread_id: Any, run_id: Any) -> None:
        """Index a run that has a checkpoint in this thread (for ``delete_for_runs``)."""
        r, t = run_token(run_id), thread_token(thread_id)
        if scope.get_bytes(f"u.{r}") is None:
            scope.put(f"u.{r}", {"run_id": str(run_id)})
        if self._index.get_bytes(f"r.{r}.{t}") is None:
            self._index.put(f"r.{r}.{t}", {"run_id": str(run_id), "thread_id": thread_id})

    def _record(
        self, scope: agentstate.Scope, checkpoint: Checkpoint, metadata: dict[str, Any],
        new_versions: ChannelVersions, ns: str, s: str, parent_id: str | None,
        parent: Parent | None,
    ) -> tuple[dict[str, Any], list[tuple[str, memoryview]]]:
        """The JSON record of a checkpoint, and the (key, bytes) it needs stored."""
        versions = checkpoint.get("channel_versions", {})
        values = checkpoint.get("channel_values", {})
        p_versions = parent.versions if parent else {}
        p_channels = parent.channels if parent else {}
        channels: dict[str, Any] = {}
        blobs: list[tuple[str, memoryview]] = []
        for ch in sorted(set(versions) | set(values)):
            old = p_channels.get(ch)
            if ch not in new_versions and old is not None and ch in versions \
                    and p_versions.get(ch) == versions[ch]:
                channels[ch] = old  # unchanged: the parent's bytes
            elif ch in values:
                channels[ch] = self._channel(scope, values[ch], old, s, blobs)
        head = {k: checkpoint[k] for k in STANDARD if k in checkpoint}
        other = {k: v for k, v in checkpoint.items() if k not in STANDARD and k != "channel_values"}
        record: dict[str, Any] = {"format": RECORD_FORMAT, "id": checkpoint["id"], "ns": ns,
                                  "parent": parent_id, "checkpoint": head, "metadata": metadata,
                                  "channels": channels}
        if other:
            if jsonable(other):
                head.update(other)
            else:  # e.g. Send objects of older checkpoint formats
                t, data = self.serde.dumps_typed(other)
                record["other"] = {"type": t, **blob(s, memoryview(data), blobs)}
        return record, blobs

    def _channel(self, scope: agentstate.Scope, value: Any, old: dict[str, Any] | None, s: str,
                 blobs: list[tuple[str, memoryview]]) -> dict[str, Any]:
        """The entry of a changed channel; its new bytes go to ``blobs``."""
        t, data = self.serde.dumps_typed(value)
        view = memoryview(data)
        found = array(t, view)
        if found is None:
            return {"type": t, "segs": [blob(s, view, blobs)]}
        n, header = found
        items = view[header:]
        start, kept = 0, []
        if old is not None and old.get("items") is not None and old["type"] == t \
                and old["items"] <= n and old["size"] <= len(items) \
                and self._same_bytes(scope, old["segs"], items):
            start, kept = old["size"], old["segs"]  # the parent's items are a prefix
        segs = segments(s, kept, items, start, blobs)
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
            elif len(part) != seg["size"] or content_hash(part) != seg["key"].rsplit(".", 1)[1]:
                return False
            elif self._cache:
                self._cache.put(name, part)
            pos += seg["size"]
        return True

    def _store_blob(self, scope: agentstate.Scope, key: str, data: memoryview) -> None:
        """Write a blob's chunks unless they are there: a key named by its content
        holds the same bytes, whoever wrote it (in a transaction, so all or none)."""
        if self._cache:
            self._cache.put((scope.id, key), bytes(data))
        try:
            scope.put_bytes(f"{key}.0", bytes(data[:CHUNK]), if_version=0)
        except agentstate.VersionConflict:
            return
        write(scope, [(key, data)], start=1)

    # -- writes ----------------------------------------------------------------------

    @on_pool
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's pending writes for a checkpoint: one append to its list.

        A write whose (task, index) is stored already is kept (a retry), except
        for the special channels (errors, interrupts), which replace it, as in
        LangGraph's own savers: each write is appended, and readers apply that rule.
        """
        if not writes:
            return
        conf = config["configurable"]
        scope = self._scope(conf["thread_id"])
        base = names(conf.get("checkpoint_ns", ""), conf["checkpoint_id"])[1]
        replace = all(ch in WRITES_IDX_MAP for ch, _ in writes)
        entries: list[dict[str, Any]] = []
        large: list[tuple[str, Any]] = []
        for i, (channel, value) in enumerate(writes):
            t, data = self.serde.dumps_typed(value)
            seg = segment(f"{payload_keys(base)}{uuid.uuid4().hex[:24]}", data, large)
            entry = {"task_id": task_id, "task_path": task_path, "channel": channel,
                     "idx": WRITES_IDX_MAP.get(channel, i), "type": t, "seg": seg}
            if replace:
                entry["rep"] = True
            entries.append(entry)
        if large:
            with self.db.transaction():
                write(scope, large)
                scope.append(base + ".p", entries)
        else:
            scope.append(base + ".p", entries)

    # -- reading ------------------------------------------------------------------------

    @on_pool
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names, or the newest of its thread and namespace;
        None when there is none. One range read: the record with its writes."""
        return self._get_tuple(config)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """Async twin of ``get_tuple``. On a file it reads on the loop's own thread: the
        read costs less than the hop to a worker thread, and in WAL mode a read never
        waits for a writer. A thread of agentstate 0.2's layout (whose migration is a
        write) and every read of a PostgreSQL store (round trips) go to a worker thread."""
        if self._inline:
            try:
                return self._get_tuple(config, migrate=False)
            except OldLayout:
                pass
        return await asyncio.to_thread(self.get_tuple, config)

    def _get_tuple(self, config: RunnableConfig, migrate: bool = True) -> CheckpointTuple | None:
        """``get_tuple``; without ``migrate`` a thread of 0.2's layout raises OldLayout."""
        conf = config["configurable"]
        thread_id, ns = conf["thread_id"], conf.get("checkpoint_ns", "")
        scope = self._scope(thread_id)
        cid = conf.get("checkpoint_id")
        s = ns_token(ns)
        newest = (scope.id, s)
        for _attempt in range(4):  # deleted while read, or migrated: look again
            try:
                if cid:
                    base = names(ns, cid)[1]
                    found = next(checkpoints(scope, base + ".", None, 2, known=self._known), None)
                    if found is None and scope.get_bytes(base) is not None:
                        raise OldLayout(scope, base)  # a 0.2 record (without writes)
                else:
                    # The newest checkpoint is its writes (if any) then its record: as
                    # many rows as last time, then one more at a time.
                    rows = self._newest_rows.get(newest, 1)
                    found = next(checkpoints(scope, f"c.{s}.", None, rows, 1, self._known), None)
                    if found is not None:
                        self._newest_rows[newest] = 1 if found.writes is None else 2
            except OldLayout:
                if not migrate:
                    raise
                upgrade(self.db, scope)
                continue
            if found is None:
                return None
            try:
                return self._tuple(scope, thread_id, found)
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
        # A thread of agentstate 0.2's layout met on the way is migrated, and the
        # reading resumes at the last checkpoint given (skipped, with its equals).
        resume: str | None = None
        given: set[tuple[str, str]] = set()  # those given whose order is `resume`
        for _attempt in range(16):
            try:
                for order, scope, thread_id, found in self._candidates(conf, before_id, limit,
                                                                       filter, resume):
                    if (scope.id, found.base) in given or \
                            not matches(found.record["metadata"], filter):
                        continue
                    try:
                        tup = self._tuple(scope, thread_id, found)
                    except Missing:
                        continue  # deleted while we read it
                    yield tup
                    if order != resume:
                        resume, given = order, set()
                    given.add((scope.id, found.base))
                    count += 1
                    if limit is not None and count >= limit:
                        return
                return
            except OldLayout as old:
                upgrade(self.db, old.scope)
        raise agentstate.Damaged("list: threads keep changing back to agentstate 0.2's layout")

    def _candidates(self, conf: dict[str, Any], before_id: str | None, limit: int | None,
                    filter: dict[str, Any] | None, resume: str | None = None
                    ) -> Iterator[tuple[str, agentstate.Scope, Any, Found]]:
        """(order, scope, thread id, checkpoint), newest first; from the order
        ``resume`` on (included) when given."""
        if "thread_id" in conf:
            threads = [conf["thread_id"]]
        else:
            entries = (get_json(self._index, k) for k in keys(self._index, "t."))
            threads = [e["thread_id"] for e in entries if e is not None]
        # A checkpoint is one row, or two with its writes: the first page holds `limit`
        # of them when they have no writes (a filter may turn some down).
        first = (limit or 8) * (2 if filter else 1)
        streams: list[Iterator[Any]] = []
        for thread_id in threads:
            scope = self._scope(thread_id)
            cid = conf.get("checkpoint_id")
            if cid:
                if before_id is None or descending(cid) > descending(before_id):
                    s, base = names(conf.get("checkpoint_ns", ""), cid)
                    streams.append(ordered(scope, thread_id, f"c.{s}.",
                                            checkpoints(scope, base + ".", None, 2, known=self._known)))
                continue
            if conf.get("checkpoint_ns") is not None:  # None or absent: every namespace
                spaces = [ns_token(conf["checkpoint_ns"])]
            else:
                spaces = [k[2:] for k in keys(scope, "n.")]
            for s in spaces:
                # after the checkpoint named by before (its writes and record sort first)
                start = f"c.{s}.{descending(before_id, MAX_ID_BYTES)}.r" if before_id else None
                start = f"c.{s}.{resume}" if resume else start  # resume: past before
                streams.append(ordered(scope, thread_id, f"c.{s}.",
                                        checkpoints(scope, f"c.{s}.", start, first, known=self._known)))
        return heapq.merge(*streams, key=lambda x: x[0])

    def _tuple(self, scope: agentstate.Scope, thread_id: Any, found: Found) -> CheckpointTuple:
        """A stored checkpoint as LangGraph's tuple.

        :raises Missing: its bytes were deleted meanwhile.
        :raises SchemaTooNew: the record was written by a newer agentstate.
        """
        record = found.record
        if record.get("format", 1) > RECORD_FORMAT:
            raise agentstate.SchemaTooNew(
                f"checkpoint {record.get('id')!r} has record format {record['format']}; "
                f"this agentstate reads {RECORD_FORMAT}: upgrade agentstate")
        self._remember(scope, found.base, record, found.version)
        ns, cid = record["ns"], record["id"]
        checkpoint: dict[str, Any] = json_copy(record["checkpoint"])  # the record is kept: a copy
        loads = self.serde.loads_typed
        if "other" in record:
            other = record["other"]
            checkpoint.update(loads((other["type"], fetch(scope, other, self._cache))))
        values = {}
        for ch, entry in record["channels"].items():
            segs = entry["segs"]
            data = fetch(scope, segs[0], self._cache) if len(segs) == 1 else \
                b"".join([fetch(scope, seg, self._cache) for seg in segs])
            if entry.get("items") is not None:
                data = array_header(entry["items"]) + data
            values[ch] = loads((entry["type"], data))
        checkpoint["channel_values"] = values
        writes = [(w["task_id"], w["channel"], loads((w["type"], fetch(scope, w["seg"]))))
                  for w in pending(found.writes)]
        conf = {"thread_id": thread_id, "checkpoint_ns": ns}
        parent = record["parent"]
        return CheckpointTuple(
            config={"configurable": {**conf, "checkpoint_id": cid}},
            checkpoint=checkpoint,
            metadata=json_copy(record["metadata"]),
            parent_config={"configurable": {**conf, "checkpoint_id": parent}} if parent else None,
            pending_writes=writes,
        )

    # -- deleting and copying (``_threads.py``) ------------------------------------------

    @on_pool
    def delete_thread(self, thread_id: str) -> None:
        """Remove every checkpoint and write of a thread (one transaction)."""
        _threads.delete_thread(self, thread_id)

    @on_pool
    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) whose metadata names one of
        ``run_ids``, in every thread; bytes other checkpoints still use stay."""
        self._upgrading(_threads.delete_for_runs, run_ids)

    @on_pool
    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and write of a thread to another (one transaction).

        :raises VersionConflict: the target holds one of the keys with other
            content; nothing is copied.
        """
        self._upgrading(_threads.copy_thread, source_thread_id, target_thread_id)

    @on_pool
    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep the newest checkpoint of each namespace, with its
        writes, and the ancestors a ``DeltaChannel`` still needs (back to one
        whose metadata has no ``counters_since_delta_snapshot``: every delta
        channel has a snapshot there). ``"delete"``: remove the threads.

        :raises ValueError: an unknown strategy.
        """
        self._upgrading(_threads.prune, thread_ids, strategy)

    def _upgrading(self, op: Any, *args: Any) -> None:
        """``op(self, *args)``, after migrating the threads of agentstate 0.2's layout
        it meets (it raises OldLayout having changed nothing)."""
        for _attempt in range(16):
            try:
                return op(self, *args)
            except OldLayout as old:
                upgrade(self.db, old.scope)
        raise agentstate.Damaged("threads keep changing back to agentstate 0.2's layout")

    def _forget(self, scope: agentstate.Scope) -> None:
        """Drop what is remembered of a thread whose checkpoints were deleted."""
        for entry in [e for e in self._records if e[0] == scope.id]:
            self._records.pop(entry, None)

    # -- versions ------------------------------------------------------------------------

    def get_next_version(self, current: Any, channel: None = None) -> Any:
        """Integers 1, 2, 3, ...; a string version (LangGraph's SQLite format) stays one."""
        if isinstance(current, str):
            n = int(current.split(".")[0]) + 1
            return f"{n:032}.{random.random():016}"
        return 1 if current is None else current + 1

    # -- async twins ----------------------------------------------------------------------

    aput = async_twin(put)
    aput_writes = async_twin(put_writes)
    adelete_thread = async_twin(delete_thread)
    adelete_for_runs = async_twin(delete_for_runs)
    acopy_thread = async_twin(copy_thread)
    aprune = async_twin(prune)

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
        page = limit if limit is not None and limit <= 50 else 20
        while True:
            got = await asyncio.to_thread(take, it, page)
            for tup in got:
                yield tup
            if len(got) < page:
                return


__all__ = ["AgentStateSaver"]
