"""``AgentStateStore``: LangGraph's long-term memory store on agentstate.

Layout. One scope, ``app:langgraph.store``; ``<ns>`` is the namespace's labels
escaped and joined with ``.``, ``<key>`` the escaped item key (each hashed when
too long; the originals are in the item):

=========================  =====================================================
``i.<ns>:<key>``           the item (JSON): value, times, ttl and expiry
``u.<ns>:<t↓>.<key>``      recency index: newest first, so a search reads only
                           the items it returns (a filter reads until it has
                           enough)
``x.<t>.<ns>:<key>``       expiry index, soonest first: ``sweep_ttl`` reads
                           only what has expired
``n.<ns>``                 the namespace, while it has items
``v.<ns>:<key>.<i>``        with ``index=``: the item's i-th vector (``_vectors.py``);
                           the item says how many it has
=========================  =====================================================

An item, its index keys, its vectors and its namespace change in one
transaction; its vectors are computed before it (``_index.py``). An expired
item is absent to every read from the instant it expires; ``sweep_ttl``
removes its keys. TTLs are in minutes, as in LangGraph.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    validate_op_namespace,
)

import agentstate
from agentstate._batch import BatchScope

from .._vectors import prefix_range
from ._common import PAGE, conn_string, digest, esc, get_json, keys, local, token, unesc
from ._filters import check_filter, matches
from ._index import NOTHING, Embedded, Index, Key

logger = logging.getLogger(__name__)

MANY = 1000  # keys one get_many reads at most
KNOWN = 4096  # items and namespaces whose last write a store remembers (then it starts over)
_FAR = 10**17  # microseconds; 17 digits hold any time this side of year 5000


class AgentStateStore(BaseStore):
    """A LangGraph store (``BaseStore``) that keeps its items in an agentstate file.

    ``AgentStateStore(db, ttl={"default_ttl": 60, "refresh_on_read": True})``
    stands where ``SqliteStore(conn, ttl=...)`` stood. ``batch`` and ``abatch``
    run get, search (filters, paging), list_namespaces and put/delete; the
    reads of a batch see the store before its writes, and its writes are one
    transaction.

    ``index={"dims": N, "embed": ..., "fields": [...]}`` (LangGraph's ``IndexConfig``,
    see ``_index.py``) makes ``search(ns, query=...)`` rank by similarity, each item
    with its ``score`` (its best vector's), as LangGraph's stores do; items without
    vectors (``index=False``) follow the scored ones, unscored. On a file it needs
    sqlite-vec (the ``vec`` extra).
    """

    supports_ttl = True

    def __init__(self, db: agentstate.Database, *, ttl: TTLConfig | None = None,
                 index: IndexConfig | None = None) -> None:
        self.db = local(db, "AgentStateStore")
        self.ttl_config = ttl
        self._index = None if index is None else Index(db, index)
        self.index_config = None if self._index is None else self._index.config
        self.embeddings = None if self._index is None else self._index.embeddings
        self._scope = db.scope("app", "langgraph.store")
        self._sweeper: threading.Thread | None = None
        self._stop = threading.Event()
        # What this store last wrote of an item or a namespace entry: key -> (version, what
        # a later put needs of the item). A put held to it by its batch's checks needs no
        # read first; when another writer came in between, the batch is refused.
        self._known: dict[str, tuple[int, dict[str, Any] | None]] = {}

    @classmethod
    @contextmanager
    def from_conn_string(cls, path: str, *, ttl: TTLConfig | None = None,
                         index: IndexConfig | None = None) -> Iterator[AgentStateStore]:
        """A store on the agentstate file at ``path`` (``":memory:"``: a temporary one),
        closed on exit, like ``SqliteStore.from_conn_string``."""
        with conn_string(path) as db:
            store = cls(db, ttl=ttl, index=index)
            try:
                yield store
            finally:
                store._stop_sweeper(None)

    def setup(self) -> None:
        """Nothing to do: the agentstate file carries its own schema."""

    # -- batch -------------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops``; results in their order (None for puts).

        Reads first, as LangGraph's own stores do; then the puts (the last one
        of a namespace and key wins) and TTL refreshes in one transaction.

        With an index, the texts of the puts and the queries are embedded first (in
        this thread), then the batch runs.

        :raises InvalidNamespaceError: a namespace label is not a non-empty
            string without ``.``; nothing runs.
        :raises ValueError: a filter key or operator LangGraph's SQLite store refuses;
            an embedding that is not ``dims`` finite numbers (nothing is written).
        :raises InvalidValue, TooLarge: a value that is not JSON, or over 1 MiB.
        """
        ops, puts, searches = self._check(ops)
        embedded = NOTHING if self._index is None else self._index.embed(puts, searches)
        return self._batch(ops, puts, embedded)

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async twin of ``batch``: the embeddings by the index's async calls, on the
        event loop; the rest in a worker thread."""
        ops, puts, searches = self._check(ops)
        embedded = NOTHING if self._index is None else await self._index.aembed(puts, searches)
        return await asyncio.to_thread(self._batch, ops, puts, embedded)

    def _check(self, ops: Iterable[Op]) -> tuple[list[Op], dict[Key, PutOp], list[SearchOp]]:
        """The ops, checked; the puts that count (the last of each item) and the searches."""
        ops = list(ops)
        puts: dict[Key, PutOp] = {}
        for op in ops:
            validate_op_namespace(op)
            if isinstance(op, SearchOp):
                check_filter(op.filter)
            elif isinstance(op, PutOp):
                puts[(tuple(op.namespace), op.key)] = op
        return ops, puts, [op for op in ops if isinstance(op, SearchOp)]

    def _batch(self, ops: list[Op], puts: dict[Key, PutOp], embedded: Embedded) -> list[Result]:
        now = time.time()
        results: list[Result] = []
        refresh: dict[str, dict[str, Any]] = {}
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op, now, refresh))
            elif isinstance(op, SearchOp):
                results.append(self._search(op, now, refresh, embedded.queries.get(op.query)))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            elif isinstance(op, PutOp):
                results.append(None)
            else:
                raise ValueError(f"unknown store operation {op!r}")
        if puts or refresh:
            if not refresh and all(op.value is not None for op in puts.values()):
                for attempt in range(3):
                    if self._put_at_once(list(puts.values()), embedded, now, attempt == 0):
                        return results
            emptied: set[str] = set()
            with self.db.transaction():
                # The reads first, each put's in one call; the writes they decide on in
                # one batch (on PostgreSQL one round trip); then the namespaces that a
                # delete may have emptied are looked at, after the deletes.
                with self.db.batch() as b:
                    w = b.scope("app", "langgraph.store")
                    added: set[str] = set()
                    for op in puts.values():
                        key, n = self._keys(op)
                        self._put(op, embedded, now, w, added, emptied,
                                  self._scope.get_many([key, n]))
                        refresh.pop(key, None)
                    for key, item in refresh.items():
                        self._refresh(key, item, now, w)
                for n in sorted(emptied):
                    self._drop_empty_namespace(n)
            for op in puts.values():
                for key in self._keys(op):
                    self._known.pop(key, None)
        return results

    def _put_at_once(self, puts: list[PutOp], embedded: Embedded, now: float, guess: bool
                     ) -> bool:
        """Puts without a delete as one batch whose checks hold each to what it was decided
        on (on PostgreSQL one round trip, where the transaction takes three): with
        ``guess``, what this store last wrote of the items and namespaces, and an item it
        never wrote into a namespace it knows taken for absent; else (or for what it does
        not know) one read first. False when a writer came in between: nothing written."""
        seen: dict[str, Any] = {}
        unknown = []
        for op in puts:
            key, n = self._keys(op)
            if guess and n in self._known:
                seen[n] = agentstate.Versioned(True, self._known[n][0])
                version, old = self._known.get(key, (0, None))
                seen[key] = agentstate.Versioned(old, version)
            else:
                unknown += [key, n]
        if unknown:
            seen.update(self._scope.get_many(unknown))
        wrote: dict[str, dict[str, Any]] = {}
        try:
            with self.db.batch() as b:
                w = b.scope("app", "langgraph.store")
                added: set[str] = set()
                for op in puts:
                    self._put(op, embedded, now, w, added, set(), seen, wrote)
        except agentstate.VersionConflict:
            for op in puts:
                for key in self._keys(op):
                    self._known.pop(key, None)
            return False
        if len(self._known) > KNOWN:
            self._known.clear()
        for (op, _kind, _sid, key, _args, _kw), result in zip(b.ops, b.results or []):
            if op == "check" or (op == "put" and key[0] in "in"):
                self._known[key] = (result, wrote.get(key))
            elif op == "delete":
                self._known.pop(key, None)
        return True

    # -- keys ------------------------------------------------------------------------------

    @staticmethod
    def _ns_token(namespace: tuple[str, ...]) -> str:
        joined = ".".join(esc(label) for label in namespace)
        return joined if len(joined) <= 100 else "_h" + digest(".".join(namespace))

    def _item_key(self, namespace: tuple[str, ...], key: str) -> str:
        return _item_key_in(self._ns_token(namespace), key)

    # -- reads -------------------------------------------------------------------------------

    def _get(self, op: GetOp, now: float, refresh: dict[str, dict[str, Any]]) -> Item | None:
        key = self._item_key(tuple(op.namespace), op.key)
        item = get_json(self._scope, key)
        if not _live(item, now) or item["key"] != op.key or tuple(item["ns"]) != tuple(op.namespace):
            return None
        self._want_refresh(op.refresh_ttl, key, item, refresh)
        return _item(item, Item)

    def _want_refresh(self, asked: bool, key: str, item: dict[str, Any],
                      refresh: dict[str, dict[str, Any]]) -> None:
        """LangGraph's SQLite store refreshes on a read only when its ttl config
        says ``refresh_on_read`` and the read did not say ``refresh_ttl=False``."""
        if asked and item["ttl"] is not None and (self.ttl_config or {}).get("refresh_on_read"):
            refresh[key] = item

    def _search(self, op: SearchOp, now: float, refresh: dict[str, dict[str, Any]],
                query: list[float] | None) -> list[SearchItem]:
        """Items of the namespaces under ``op.namespace_prefix`` that pass the filter, from
        ``op.offset`` on: with a ``query`` (its vector, when the store has an index), the
        ones with vectors by score (``_nearest``), then the others; else (and for those
        others) newest update first (``_newest``)."""
        if op.limit <= 0:
            return []
        if query is None:
            return self._newest(op, now, refresh, op.offset, op.limit, set())
        with self.db.snapshot():  # the vectors and the items they stand for, of one moment
            found, skip, scored = self._nearest(op, now, refresh, query)
            if len(found) < op.limit:
                found += self._newest(op, now, refresh, skip, op.limit - len(found), scored)
        return found

    def _nearest(self, op: SearchOp, now: float, refresh: dict[str, dict[str, Any]],
                 query: list[float]) -> tuple[list[SearchItem], int, set[str]]:
        """(the items found, how many of ``op.offset`` are still to skip, the keys of every
        item with a vector met): items scored by their best vector, best first.

        One read of the best vectors: twice as many as the items wanted have; with a
        filter, which may turn most down, at least MANY (a read scores every vector
        whatever its limit, so asking again would cost as much again, while rows cost
        little). Then their items, a ``get_many`` at a time, as many as the share the
        filter let through says are needed (as ``_newest`` reads). More vectors only if
        those were not enough."""
        index = self._index
        assert index is not None
        ranges = self._vector_ranges(tuple(op.namespace_prefix))
        want = (op.offset + op.limit) * len(index.fields)
        size = max(MANY, 8 * want) if op.filter else 2 * want + 1
        found: list[SearchItem] = []
        skip, judged = op.offset, set()
        while True:
            rows = index.vectors.nearest("app", "langgraph.store", ranges, query, size)
            best: dict[str, float] = {}  # an item's first row is its best
            for vkey, score in rows:
                best.setdefault("i." + vkey[2:vkey.rindex(".")], score)
            fresh = [key for key in best if key not in judged]
            pos, chunk = 0, min(skip + op.limit, MANY)
            while pos < len(fresh):
                batch = fresh[pos:pos + chunk]
                pos += len(batch)
                items = self._scope.get_many(batch)
                passed = 0
                for key in batch:
                    judged.add(key)
                    item = items[key].value
                    if not _live(item, now) or not matches(item["value"], op.filter):
                        continue
                    passed += 1
                    if skip:
                        skip -= 1
                        continue
                    self._want_refresh(op.refresh_ttl, key, item, refresh)
                    found.append(_item(item, SearchItem, score=best[key]))
                    if len(found) == op.limit:
                        return found, skip, judged
                chunk = _next_read(skip + op.limit - len(found), len(batch), passed)
            if len(rows) < size:
                return found, skip, judged
            size *= 4

    def _vector_ranges(self, path: tuple[str, ...]) -> list[tuple[str, str]]:
        """The key ranges of the vectors of the namespaces under ``path``: those whose
        token extends path's (the namespace itself, and its children), and each hashed one."""
        if not path:
            return [prefix_range("v.")]
        t = ".".join(esc(label) for label in path)
        ranges = [prefix_range(f"v.{t}:"), prefix_range(f"v.{t}.")] if len(t) <= 100 else []
        return ranges + [prefix_range(f"v.{n}:") for n, _ns in self._listed("n._h", path)]

    def _newest(self, op: SearchOp, now: float, refresh: dict[str, dict[str, Any]], skip: int,
                limit: int, scored: set[str]) -> list[SearchItem]:
        """``limit`` items after ``skip``, newest update first, leaving out ``scored``.

        Walks the recency index of each namespace, merged, so it reads the items
        it returns, plus those a filter turns down, a ``get_many`` of candidates at
        a time.
        """
        want = skip + limit
        # With a filter, more candidates than wanted (it may turn most down): 8 times as
        # many in the first read; then as many as _next_read says.
        first = min(8 * want, MANY) if op.filter else want
        streams = [self._recent(n, first + 1)
                   for n, _ns in self._namespaces(tuple(op.namespace_prefix), prefix_only=True)]
        found: list[SearchItem] = []
        merged = heapq.merge(*streams)
        size = first
        while len(found) < limit:
            batch = [(stamp, f"i.{n}:{key_token}")
                     for stamp, n, key_token in itertools.islice(merged, size)]
            if not batch:
                break
            items = self._scope.get_many([key for _stamp, key in batch])  # one read
            passed = 0
            for stamp, key in batch:
                item = items[key].value
                if (key in scored or not _live(item, now) or item["r"] != stamp
                        or not matches(item["value"], op.filter)):
                    continue  # scored, gone, updated since the index was read, filtered out
                passed += 1
                if skip:
                    skip -= 1
                    continue
                self._want_refresh(op.refresh_ttl, key, item, refresh)
                found.append(_item(item, SearchItem))
                if len(found) == limit:
                    break
            size = _next_read(skip + limit - len(found), len(batch), passed)
        return found

    def _recent(self, n: str, first: int) -> Iterator[tuple[str, str, str]]:
        """(time stamp, namespace token, key token) of a namespace's items, newest first."""
        start = len(n) + 3
        for k in keys(self._scope, f"u.{n}:", first=first):
            yield k[start:start + 17], n, k[start + 18:]

    def _namespaces(self, path: tuple[str, ...], *, prefix_only: bool = False
                    ) -> Iterator[tuple[str, tuple[str, ...]]]:
        """(token, namespace) of stored namespaces that may start with ``path``:
        the labels before the first ``*`` narrow the scan; hashed (long)
        namespaces are always read. With ``prefix_only`` the result is exact."""
        lead = []
        for label in path:
            if label == "*" and not prefix_only:
                break
            lead.append(esc(label))
        starts = [f"n.{'.'.join(lead)}"] if lead else ["n."]
        if lead and not starts[0].startswith("n._h"):
            starts.append("n._h")
        for start in starts:
            yield from self._listed(start, path if prefix_only else None)

    def _listed(self, start: str, path: tuple[str, ...] | None
                ) -> Iterator[tuple[str, tuple[str, ...]]]:
        """(token, namespace) of the namespace entries whose keys start with ``start``
        (only those under ``path``, if given)."""
        for k in keys(self._scope, start):
            if k.startswith("n._h"):  # hashed: the namespace is in the value
                entry = self._scope.get(k)
                if entry is None:
                    continue
                ns = tuple(entry["ns"])
            else:
                ns = tuple(unesc(label) for label in k[2:].split("."))
            if path is None or ns[:len(path)] == path:
                yield k[2:], ns

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = [c for c in op.match_conditions or () if c.path]
        prefixes = [tuple(c.path) for c in conditions if c.match_type == "prefix"]
        found = set()
        for _n, ns in self._namespaces(prefixes[0] if prefixes else ()):
            if all(_match(c, ns) for c in conditions):
                found.add(ns if op.max_depth is None else ns[:op.max_depth])
        ordered = sorted(found, key=".".join)
        return ordered[op.offset:op.offset + op.limit]

    # -- writes (inside the batch's transaction) -------------------------------------------

    def _keys(self, op: PutOp) -> tuple[str, str]:
        """The keys of a put's item and of its namespace's entry."""
        n = self._ns_token(tuple(op.namespace))
        return _item_key_in(n, op.key), f"n.{n}"

    def _put(self, op: PutOp, embedded: Embedded, now: float, w: BatchScope, added: set[str],
             emptied: set[str], seen: dict[str, agentstate.Versioned],
             wrote: dict[str, dict[str, Any]] | None = None) -> None:
        """Add a put's writes to ``w``, decided on ``seen`` (its item and namespace entry, as
        read) and held to it: the item at the version read, its vectors (``embedded``), the
        namespace entry there (a delete of the last item drops it) or created. ``wrote``:
        what a later put needs of the item written (its times and index keys)."""
        ns = tuple(op.namespace)
        n = self._ns_token(ns)
        key = _item_key_in(n, op.key)
        old, version = seen[key]
        vectors = embedded.puts.get((ns, op.key), []) if op.value is not None else []
        if old is not None:
            self._unindex(n, key, old, w, keep=len(vectors))
        if op.value is None:
            if old is not None:
                w.delete(key, if_version=version)
                emptied.add(n)
            return
        stamp = f"{_FAR - int(now * 1e6):017d}"
        created = old["created_at"] if _live(old, now) else now
        expires = None if op.ttl is None else now + op.ttl * 60
        item = {"ns": list(ns), "key": op.key, "value": dict(op.value), "created_at": created,
                "updated_at": now, "ttl": op.ttl, "expires_at": expires, "r": stamp,
                "v": len(vectors)}
        w.put(key, item, if_version=version)
        if wrote is not None:
            wrote[key] = {"created_at": created, "expires_at": expires, "r": stamp,
                          "v": len(vectors)}
        for i, vector in enumerate(vectors):  # an index's (else there are none)
            self._index.vectors.put(w, f"v.{key[2:]}.{i}", vector)  # type: ignore[union-attr]
        w.put(f"u.{n}:{stamp}.{key[len(n) + 3:]}", 0)
        if expires is not None:
            w.put(f"x.{_stamp(expires)}.{key[2:]}", 0)
        if n not in added:
            entry = seen[f"n.{n}"]
            if entry.value is None:
                w.put(f"n.{n}", {"ns": list(ns)}, if_version=entry.version)
            else:
                w.check(f"n.{n}", if_version=entry.version)
            added.add(n)

    def _drop_empty_namespace(self, n: str) -> None:
        """Remove the namespace's index entry if it has no item left. Its entry is read
        first: inside the transaction that read locks it, and a put of a new item
        holds it too (``_put``), so the look for items comes after any such put's
        commit (a list() locks no key that is not there yet)."""
        self._scope.get(f"n.{n}")
        if not self._scope.list(f"i.{n}:", limit=1):
            self._scope.delete(f"n.{n}")
            self._known.pop(f"n.{n}", None)

    def _unindex(self, n: str, key: str, item: dict[str, Any],
                 w: agentstate.Scope | BatchScope, keep: int = 0) -> None:
        """Remove an item's index keys (its recency and expiry) and its vectors but the
        first ``keep`` (which a put writes again)."""
        w.delete(f"u.{n}:{item['r']}.{key[len(n) + 3:]}")
        if item["expires_at"] is not None:
            w.delete(f"x.{_stamp(item['expires_at'])}.{key[2:]}")
        for i in range(keep, item.get("v", 0)):
            w.delete(f"v.{key[2:]}.{i}")

    def _refresh(self, key: str, seen: dict[str, Any], now: float, w: BatchScope) -> None:
        """Push an item's expiry ``ttl`` minutes past now, if it is still the one read."""
        item = get_json(self._scope, key)
        if item is None or item["r"] != seen["r"] or not _live(item, now):
            return
        if item["expires_at"] is not None:
            w.delete(f"x.{_stamp(item['expires_at'])}.{key[2:]}")
        item["expires_at"] = now + item["ttl"] * 60
        w.put(key, item)
        w.put(f"x.{_stamp(item['expires_at'])}.{key[2:]}", 0)

    # -- expiry ------------------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Remove the items whose TTL has passed; return how many.

        Reads the expiry index up to now, a page per transaction, so a sweep
        holds the write lock briefly however much has expired.
        """
        return self._sweep()

    async def asweep_ttl(self) -> int:
        """Async twin of ``sweep_ttl``, run in a worker thread."""
        return await asyncio.to_thread(self._sweep)

    def _sweep(self) -> int:
        removed = 0
        while True:
            now = time.time()
            cut = _stamp(now)
            with self.db.transaction():
                due = [k for k in self._scope.list("x.", limit=PAGE) if k[2:19] <= cut]
                for x in due:
                    key = "i." + x[20:]
                    item = get_json(self._scope, key)
                    self._scope.delete(x)
                    if item is not None and item["expires_at"] is not None \
                            and _stamp(item["expires_at"]) == x[2:19]:
                        n = key[2:key.index(":")]
                        self._unindex(n, key, item, self._scope)
                        self._scope.delete(key)
                        self._drop_empty_namespace(n)
                        removed += 1
            if len(due) < PAGE:
                return removed

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None
                          ) -> concurrent.futures.Future[None]:
        """Sweep in a background thread every ``sweep_interval_minutes`` (default:
        the ttl config's, else 5); the future completes when it stops."""
        return self._start_sweeper(sweep_interval_minutes)

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; True if it has stopped (or never ran)."""
        return self._stop_sweeper(timeout)

    def _start_sweeper(self, sweep_interval_minutes: float | None) -> concurrent.futures.Future[None]:
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._sweeper is not None and self._sweeper.is_alive():
            done.set_result(None)
            return done
        interval = 60 * (sweep_interval_minutes
                         or (self.ttl_config or {}).get("sweep_interval_minutes") or 5)
        self._stop.clear()

        def loop() -> None:
            try:
                while not self._stop.wait(interval):
                    try:
                        self._sweep()
                    except Exception:  # a locked or closed file: try again next time
                        logger.exception("TTL sweep failed")
            finally:
                done.set_result(None)

        self._sweeper = threading.Thread(target=loop, daemon=True, name="agentstate-ttl-sweeper")
        self._sweeper.start()
        return done

    def _stop_sweeper(self, timeout: float | None) -> bool:
        if self._sweeper is None:
            return True
        self._stop.set()
        self._sweeper.join(timeout)
        stopped = not self._sweeper.is_alive()
        if stopped:
            self._sweeper = None
        return stopped


# -- helpers ----------------------------------------------------------------------------


def _item_key_in(n: str, key: str) -> str:
    """The key of item ``key`` in the namespace whose token is ``n``."""
    return f"i.{n}:{token(key, 60)}"


def _next_read(need: int, read: int, passed: int) -> int:
    """How many items to read next when ``passed`` of the last ``read`` passed a filter and
    ``need`` more are wanted: as many as that share says, with a margin (twice as many as
    last time if none passed), at most MANY."""
    return min(-(-need * 5 * read // (4 * passed)) if passed else 2 * read, MANY)


def _stamp(t: float) -> str:
    return f"{int(t * 1e6):017d}"


def _live(item: dict[str, Any] | None, now: float) -> bool:
    return item is not None and (item["expires_at"] is None or item["expires_at"] > now)


def _time(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


def _item(item: dict[str, Any], cls: type, **more: Any) -> Any:
    return cls(namespace=tuple(item["ns"]), key=item["key"], value=item["value"],
               created_at=_time(item["created_at"]), updated_at=_time(item["updated_at"]), **more)


def _match(condition: MatchCondition, ns: tuple[str, ...]) -> bool:
    """A namespace matches a prefix or suffix path label by label; ``*`` is any one label."""
    path = tuple(condition.path)
    if len(ns) < len(path):
        return False
    part = ns[:len(path)] if condition.match_type == "prefix" else ns[len(ns) - len(path):]
    return all(p == "*" or p == label for p, label in zip(path, part))


__all__ = ["AgentStateStore"]
