"""AgentStateSaver's operations on whole threads: delete, delete a run's
checkpoints, copy, prune. Each is one transaction; bytes a surviving checkpoint
still points at are kept (the layout: ``_layout.py``). Those that read checkpoints
raise ``OldLayout`` on a thread of agentstate 0.2's layout, having changed nothing:
the saver migrates it and calls again."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import agentstate

from ._common import get_json, keys
from ._layout import (STUB, Found, OldLayout, byte_keys, checkpoints, is_old, names, payload_keys,
                      run_token, thread_token)

if TYPE_CHECKING:
    from .checkpoint import AgentStateSaver


def delete_thread(saver: AgentStateSaver, thread_id: Any) -> None:
    scope = saver._scope(thread_id)
    t = thread_token(thread_id)
    with saver.db.transaction():
        for key in list(keys(scope, "u.")) + list(keys(scope, "r.")):  # r.<run>.<ns>.<id↓>: 0.2's
            saver._index.delete(f"r.{key.split('.')[1]}.{t}")
        scope.clear()
        saver._index.delete(f"t.{t}")
    saver._forget(scope)


def delete_for_runs(saver: AgentStateSaver, run_ids: Sequence[str]) -> None:
    with saver.db.transaction():
        for run_id in run_ids:
            r = run_token(run_id)
            for index_key in list(keys(saver._index, f"r.{r}.")):
                entry = get_json(saver._index, index_key)
                if entry is None or entry["run_id"] != str(run_id):
                    continue
                thread_id = entry["thread_id"]
                scope = saver._scope(thread_id)
                victims = {f.base for f in _all(scope, "c.")
                           if str(f.record["metadata"].get("run_id")) == str(run_id)
                           and f.record["metadata"].get("run_id") is not None}
                delete_records(saver, scope, thread_id, victims)
                saver._forget(scope)


def copy_thread(saver: AgentStateSaver, source_thread_id: Any, target_thread_id: Any) -> None:
    src, dst = saver._scope(source_thread_id), saver._scope(target_thread_id)
    t = thread_token(target_thread_id)
    with saver.db.transaction():
        copied = False
        for key in list(keys(src, "")):
            if is_old(key):
                raise OldLayout(src, key)  # migrated first (by the caller), then copied
            value, have = src.get_bytes(key), dst.get_bytes(key)
            if value is None:
                continue
            if have is not None and have != value:
                raise agentstate.VersionConflict(
                    f"thread {target_thread_id!r} holds {key} with other content", 1)
            if have is None:
                if key[0] in "bx":  # payload chunks are bytes
                    dst.put_bytes(key, value, if_version=0)
                elif key.endswith(".p"):  # pending writes: a list, appended to later
                    dst.append(key, json.loads(value))
                else:
                    dst.put(key, json.loads(value), if_version=0)
            if key.startswith("u."):
                r = key[2:]
                if saver._index.get_bytes(f"r.{r}.{t}") is None:
                    saver._index.put(f"r.{r}.{t}", {"run_id": json.loads(value)["run_id"],
                                                    "thread_id": target_thread_id})
            copied = copied or key.startswith("c.")
        if copied and saver._index.get_bytes(f"t.{t}") is None:
            saver._index.put(f"t.{t}", {"thread_id": target_thread_id})
    saver._forget(dst)


def prune(saver: AgentStateSaver, thread_ids: Sequence[str], strategy: str) -> None:
    if strategy == "delete":
        for thread_id in thread_ids:
            delete_thread(saver, thread_id)
        return
    if strategy != "keep_latest":
        raise ValueError(f"unknown prune strategy {strategy!r} (keep_latest or delete)")
    for thread_id in thread_ids:
        scope = saver._scope(thread_id)
        with saver.db.transaction():
            victims: set[str] = set()
            for n in list(keys(scope, "n.")):
                found = list(_all(scope, f"c.{n[2:]}."))
                by_base = {f.base: f for f in found}
                kept = set()
                record = found[0].record if found else None
                while record is not None:
                    base = names(record["ns"], record["id"])[1]
                    kept.add(base)
                    if not record["metadata"].get("counters_since_delta_snapshot") \
                            or not record["parent"]:
                        break
                    parent = by_base.get(names(record["ns"], record["parent"])[1])
                    record = parent.record if parent else None
                victims.update(f.base for f in found if f.base not in kept)
            delete_records(saver, scope, thread_id, victims)
        saver._forget(scope)


def delete_records(saver: AgentStateSaver, scope: agentstate.Scope, thread_id: Any,
                   victims: set[str]) -> None:
    """Delete checkpoints (by base key) with their writes and the channel bytes no
    surviving checkpoint of their namespace points at; then the indexes of the runs,
    namespaces and the thread they leave empty (call inside a transaction)."""
    spaces: dict[str, set[str]] = {}
    for base in victims:
        spaces.setdefault(base.split(".")[1], set()).add(base)
    t = thread_token(thread_id)
    for s, doomed in spaces.items():
        used: set[str] = set()
        unused: set[str] = set()
        for f in _all(scope, f"c.{s}."):
            (unused if f.base in doomed else used).update(byte_keys(f.record))
        for base in doomed:
            for k in list(keys(scope, payload_keys(base))):
                scope.delete(k)
            scope.delete(base + ".p")
            scope.delete(base + ".r")
        for key in unused - used:
            for k in list(keys(scope, f"{key}.")):
                scope.delete(k)
        if not scope.list(f"c.{s}.", after=f"c.{s}.{STUB}", limit=1):
            scope.delete(f"c.{s}.{STUB}")
            scope.delete(f"n.{s}")
    runs_left = {str(f.record["metadata"].get("run_id")) for f in _all(scope, "c.")}
    for key in list(keys(scope, "u.")):
        run_id = get_json(scope, key)["run_id"]
        if run_id not in runs_left:
            scope.delete(key)
            saver._index.delete(f"r.{key[2:]}.{t}")
    if not scope.list("n.", limit=1):
        saver._index.delete(f"t.{t}")


def _all(scope: agentstate.Scope, prefix: str) -> list[Found]:
    return list(checkpoints(scope, prefix, None, 100))
