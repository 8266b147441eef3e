"""Where AgentStateSaver keeps things, and how a checkpoint becomes stored parts.

Layout. One scope per LangGraph thread, ``thread:langgraph.<thread>``; ``<ns>``
is the checkpoint namespace, ``<id↓>`` the checkpoint id in a form that sorts
in descending id order:

================================  ====================================================
``c.<ns>.<id↓>.p``                the checkpoint's pending writes: a list value, one
                                  item per write (``put_writes`` appends)
``c.<ns>.<id↓>.r``                the checkpoint record (JSON): metadata, channel
                                  versions, the parent id, and where each channel's
                                  bytes are
``x.<ns>.<id↓>.<tag>.<k>``        the bytes of a large pending write
``b.<ns>.<hash>.<k>``             channel bytes, named by their content hash: written
                                  once, shared by every record that has them, never
                                  changed (so they may be cached in memory)
``n.<ns>``                        the namespace, so a thread's namespaces can be listed
``u.<run>``                       a run with checkpoints in this thread
``c.<ns>.-``                      in a thread migrated from the layout of agentstate
                                  0.2 (``_upgrade.py``): what makes 0.2 refuse it
================================  ====================================================

A checkpoint's writes sort right before its record and its record right before
the next older checkpoint's writes: one range read (``scope.items``) of a
namespace gives its checkpoints newest first, each with its writes, and the
newest one alone is one or two rows. The scope ``app:langgraph.saver`` indexes
threads (``t.<thread>``) and runs (``r.<run>.<thread>``). Ids are escaped into
key characters; a part too long for its place is a hash, and the original is
in the record.

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
never replaced), bytes are named by their content, and pending writes are
only ever appended (the reader applies LangGraph's rule: a write of a (task,
index) stored already is kept, unless the later one replaces it).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import agentstate
from agentstate._encoding import MAX_VALUE, check_value, decode
from agentstate._encoding import _dump as dump

from ._common import INLINE, descending, seg_size, segment, token

PREFIX = "langgraph"
RECORD_FORMAT = 2  # 1: agentstate 0.2's layout (one key per pending write), migrated on sight
STUB = "-"  # c.<ns>.- : what a 0.2 reader takes for a newest record, of format 2 (``_upgrade.py``)
MAX_ID_BYTES = 48  # checkpoint ids up to this long keep their order (LangGraph's are 36)
STANDARD = ("v", "id", "ts", "channel_versions", "versions_seen", "updated_channels")


# -- keys --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def names(ns: str, checkpoint_id: str) -> tuple[str, str]:
    """(namespace token, base key ``c.<ns>.<id↓>``) of a checkpoint; its record is
    ``base + ".r"``, its writes ``base + ".p"``."""
    s = ns_token(ns)
    return s, f"c.{s}.{descending(checkpoint_id, MAX_ID_BYTES)}"


@functools.lru_cache(maxsize=4096)
def ns_token(ns: str) -> str:
    """The token of a checkpoint namespace in keys."""
    return token(ns, 40)


@functools.lru_cache(maxsize=4096)
def thread_token(thread_id: Any) -> str:
    return token(str(thread_id), 150)


def run_token(run_id: Any) -> str:
    return token(str(run_id), 40)


def payload_keys(base: str) -> str:
    """The prefix of the keys holding the large pending writes of a checkpoint."""
    return f"x.{base[2:]}."


class OldLayout(agentstate.Damaged):
    """A key of the layout of agentstate 0.2, met while reading: the thread is to be
    migrated (``_upgrade.py``), then read again."""

    def __init__(self, scope: agentstate.Scope, key: str) -> None:
        super().__init__(f"{scope.kind}:{scope.id} holds {key!r}, a checkpoint key of the "
                         "layout of agentstate 0.2")
        self.scope, self.key = scope, key


def is_old(key: str) -> bool:
    """Whether a key of a thread's scope is of the layout of agentstate 0.2 only."""
    if key.startswith("c."):
        return key[-2:] not in (".r", ".p", "." + STUB)
    return key.startswith("r.")


# -- reading rows --------------------------------------------------------------------------


class Found:
    """One checkpoint as read: its base key, record (JSON) and pending writes (a list)."""

    __slots__ = ("base", "record", "version", "writes")

    def __init__(self, base: str, record: dict[str, Any], version: int,
                 writes: list[dict[str, Any]] | None) -> None:
        self.base, self.record, self.version, self.writes = base, record, version, writes


def checkpoints(scope: agentstate.Scope, prefix: str, after: str | None, first: int,
                then: int = 0, known: dict[Any, Any] | None = None) -> Iterator[Found]:
    """The checkpoints of ``scope`` under ``prefix`` (``c.<ns>.`` or one checkpoint's
    ``c.<ns>.<id↓>.``), after the key ``after``, newest first, each with its writes:
    pages of ``scope.items``, the first of ``first`` rows, the next ones of ``then``
    (default: twice the last) rows, up to 500. Writes whose record is not there are
    skipped (put_writes may come before put, or outlive a deleted record). ``known``:
    records already parsed, by (scope id, key, version) (a record at a version never
    changes), added to; they are never to be changed (``json_copy`` what is handed out).

    :raises OldLayout: a key of agentstate 0.2's layout.
    """
    size = max(1, first)
    if after is None:
        after = prefix + STUB  # sorts before every checkpoint of a namespace
    held: tuple[str, Any] | None = None  # a writes row waiting for its record
    while True:
        rows = _items(scope, prefix, after, size, known)
        for i, (key, value, version) in enumerate(rows):
            base, part = key[:-2], key[-2:]
            if part == ".r":
                writes = held[1] if held is not None and held[0] == base else None
                held = None
                if i + 1 < len(rows) and rows[i + 1][0].startswith(base + ".w."):
                    # a write of 0.2's layout (sorting after the record) for this one: it
                    # is migrated first (only seen when in the same page; _upgrade.py)
                    raise OldLayout(scope, rows[i + 1][0])
                if value is not None:
                    yield Found(base, value, version, writes)
            elif part == ".p":
                held = (base, value)
            elif part != "." + STUB:
                raise OldLayout(scope, key)
        if len(rows) < size:
            return
        after = rows[-1][0]
        size = min(then or 2 * size, 500)


def _items(scope: agentstate.Scope, prefix: str, after: str, limit: int,
           known: dict[Any, Any] | None) -> list[tuple[str, Any, int]]:
    """``scope.items(prefix, after=after, limit=limit)`` as (key, value, version), from the
    store's rows directly (the prefix and the key are the saver's own, valid by
    construction), records parsed once (``known``): a checkpoint's read is the
    hottest of the saver."""
    out = []
    for key, type_, stored, version, items in scope._ops.kv_items(scope.kind, scope.id, prefix, after,
                                                                   limit):
        if type_ == "list":
            out.append((key, decode(f"[{items or ''}]"), version))
            continue
        if known is None:
            out.append((key, decode(stored), version))
            continue
        name = (scope.id, key, version)
        value = known.get(name)
        if value is None:
            if len(known) >= 512:
                known.clear()
            value = known[name] = decode(stored)
        out.append((key, value, version))
    return out


def json_copy(value: Any) -> Any:
    """A copy of a parsed JSON value that shares no dict or list with it."""
    t = type(value)
    if t is dict:
        return {k: json_copy(v) if type(v) in (dict, list) else v for k, v in value.items()}
    if t is list:
        return [json_copy(v) if type(v) in (dict, list) else v for v in value]
    return value


def pending(writes: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The writes that count, in LangGraph's order (task path, task id, index): the
    first of each (task, index), or the last one marked as replacing."""
    if not writes:
        return []
    chosen: dict[tuple[str, int], dict[str, Any]] = {}
    for w in writes:
        k = (w["task_id"], w["idx"])
        if k not in chosen or w.get("rep"):
            chosen[k] = w
    return sorted(chosen.values(), key=lambda w: (w["task_path"], w["task_id"], w["idx"]))


# -- bytes ---------------------------------------------------------------------------------


def content_hash(data: memoryview | bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def blob(s: str, data: memoryview, blobs: list[tuple[str, memoryview]]) -> dict[str, Any]:
    """A segment for ``data``: inline when small, else a key named by its content."""
    return segment(f"b.{s}.{content_hash(data)}" if len(data) > INLINE else "", data, blobs)


def array(type_: str, data: memoryview) -> tuple[int, int] | None:
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


def array_header(n: int) -> bytes:
    if n < 16:
        return bytes([0x90 | n])
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def segments(s: str, kept: list[dict[str, Any]], data: memoryview, start: int,
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
        segs[-1] = blob(s, data[len(data) - sizes[-1]:], blobs)
    return segs


def byte_keys(record: dict[str, Any] | None) -> set[str]:
    """The channel-bytes keys (``b.``) a record points at."""
    if record is None:
        return set()
    segs = [seg for entry in record["channels"].values() for seg in entry["segs"]]
    segs.append(record.get("other", {}))
    return {seg["key"] for seg in segs if "key" in seg}


# -- values ----------------------------------------------------------------------------------


def record_bytes(record: dict[str, Any]) -> bytes:
    """A record's compact JSON text as UTF-8 bytes, stored as a bytes value: readable as
    the same JSON value by every caller (``get`` parses bytes as JSON), without the
    store's walk of the whole record (SPEC §2), which would check again what this
    module built from LangGraph's serializer (base64 of its bytes, keys, sizes). What
    came from outside is checked here by the same rules: the checkpoint's head and the
    metadata (``check_value``), and the size.

    :raises InvalidValue: metadata (or a head) that is not storable JSON.
    :raises TooLarge: over 1 MiB.
    """
    check_value(record["checkpoint"])
    check_value(record["metadata"])
    try:
        data = dump(record).encode("utf-8")
    except UnicodeEncodeError:
        raise agentstate.InvalidValue("strings may not contain lone surrogates") from None
    if len(data) > MAX_VALUE:
        raise agentstate.TooLarge(f"value is {len(data)} bytes, over the limit of {MAX_VALUE}",
                                  len(data), MAX_VALUE)
    return data



def normal(value: Any) -> Any:
    """``value`` as it reads back from the store (tuples become lists)."""
    return json.loads(json.dumps(value))


def jsonable(v: Any, depth: int = 0) -> bool:
    if depth > 100:
        return False
    if v is None or isinstance(v, (str, bool, int)):
        return True
    if isinstance(v, float):
        return v == v and v not in (float("inf"), float("-inf"))
    if isinstance(v, (list, tuple)):
        return all(jsonable(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and jsonable(x, depth + 1) for k, x in v.items())
    return False


def matches(metadata: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    """Whether metadata has every ``filter`` value (a dotted key walks into objects)."""
    for key, want in (filter or {}).items():
        have: Any = metadata
        for part in key.split("."):
            have = have.get(part) if isinstance(have, dict) else None
        if have != want:
            return False
    return True


# -- what the saver keeps and merges --------------------------------------------------


class Parent:
    """What a put needs of the parent's stored record: its channel versions and where
    its channels' bytes are (never handed out), its run, and its version, which the
    put's transaction checks."""

    __slots__ = ("versions", "channels", "run_id", "version", "other")

    def __init__(self, record: dict[str, Any], version: int) -> None:
        self.versions = dict(record["checkpoint"]["channel_versions"])
        self.channels = record["channels"]
        self.run_id = record["metadata"].get("run_id")
        self.version = version
        self.other = record.get("other")

    def blobs(self) -> set[str]:
        """The bytes keys it points at: kept while it is, so a child may point at them too."""
        return byte_keys({"channels": self.channels, "other": self.other or {}})


def ordered(scope: agentstate.Scope, thread_id: Any, prefix: str, found: Iterator[Found]
             ) -> Iterator[tuple[str, agentstate.Scope, Any, Found]]:
    """(order, scope, thread id, checkpoint): the order is the id part of the key, so
    streams of several threads and namespaces merge newest first."""
    start = len(prefix)
    for f in found:
        yield f.base[start:], scope, thread_id, f


def take(it: Iterator[Any], n: int) -> list[Any]:
    out = []
    for x in it:
        out.append(x)
        if len(out) == n:
            break
    return out
