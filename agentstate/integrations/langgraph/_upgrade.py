"""Threads stored by agentstate 0.2 (record format 1): brought to the current
layout (``_layout.py``) the first time this saver meets one, a whole thread in
one transaction, so that nothing stored before an upgrade is lost.

The 0.2 layout of a thread's scope differs in three kinds of keys:

================================  ====================================================
``c.<ns>.<id↓>``                  the record (JSON, format 1; otherwise as now):
                                  now ``c.<ns>.<id↓>.r``, format 2
``c.<ns>.<id↓>.w.<task>.<i>``     one pending write (the JSON entry a ``.p`` list now
                                  holds, one key per (task, index)): now items of
                                  ``c.<ns>.<id↓>.p``, before any appended since
``r.<run>.<ns>.<id↓>``            a checkpoint of a run: now ``u.<run>``, one per run
================================  ====================================================

Channel bytes (``b.``), namespaces (``n.``), large pending writes (``x.``: an
entry names its keys, under the checkpoint's ``x.`` prefix as now) and the
index scope are the same in both, and stay where they are.

Two processes migrating one thread at once: the database serializes them (the
keys a write transaction reads stay locked until it ends: SQLite's write lock,
PostgreSQL's row locks), so the second waits, then finds nothing to move. Were
it to read stale rows anyway, it could not apply them: every old key is deleted
at the version read and every record created only if absent, so it would get
``VersionConflict``, change nothing, and read again. A 0.2 process still running: each namespace of
a migrated thread gets the key ``c.<ns>.-``, which sorts before its
checkpoints and which 0.2 reads as a record of format 2, so its ``get_tuple``
and ``list`` raise ``SchemaTooNew`` ("upgrade agentstate") instead of finding
the thread empty. A checkpoint it still stores (a step it had started) is in
the old layout again, and, being the newest, is migrated by the next read, with
every write 0.2 stored in the thread meanwhile. The one gap: a pending write
0.2 stores for a migrated checkpoint (sorting after its record), when no 0.2
checkpoint follows (its process died in that step), is found only by a read
that has it in the page with the record, or a whole-thread operation; until
then that task runs again on resume. Hence: stop the 0.2 processes first.
"""

from __future__ import annotations

from typing import Any

import agentstate

from ._common import PAGE
from ._layout import RECORD_FORMAT, STUB

STUB_VALUE = {"format": RECORD_FORMAT, "id": None,
              "note": "this thread was migrated to the layout of agentstate 0.3: upgrade agentstate"}


def upgrade(db: agentstate.Database, scope: agentstate.Scope) -> bool:
    """Migrate the 0.2 keys of a thread's scope, in one transaction; whether there
    were any (False also when another process migrated them first).

    :raises Damaged: a key under ``c.`` of neither layout; or the thread keeps
        changing under the migration (a refused transaction changes nothing).
    """
    for _attempt in range(8):
        try:
            with db.transaction():
                return _move(scope)
        except agentstate.VersionConflict:
            continue  # another migrator (or a 0.2 writer) was first: read again
    raise agentstate.Damaged(f"{scope.kind}:{scope.id}: the thread keeps changing while "
                             "migrated from the layout of agentstate 0.2")


def _move(scope: agentstate.Scope) -> bool:
    records: dict[str, agentstate.Versioned] = {}  # base key -> old record
    writes: dict[str, list[tuple[str, agentstate.Versioned]]] = {}  # base -> old write keys
    lists: dict[str, agentstate.Versioned] = {}  # base -> a .p list there already
    current: set[str] = set()  # bases with a .r record
    for key, v in _rows(scope, "c."):
        part = key[-2:]
        if part == ".r":
            current.add(key[:-2])
        elif part == ".p":
            lists[key[:-2]] = v
        elif part != "." + STUB:
            fields = key.split(".")
            base = ".".join(fields[:3])
            if len(fields) == 3:
                records[base] = v
            elif fields[3] == "w" and len(fields) == 6:
                writes.setdefault(base, []).append((key, v))
            else:
                raise agentstate.Damaged(f"{scope.kind}:{scope.id} holds {key!r}, a checkpoint "
                                         "key of no layout this agentstate knows")
    markers = _rows(scope, "r.")
    if not records and not writes and not markers:
        return False
    for base, v in records.items():
        if base not in current:
            scope.put(base + ".r", {**v.value, "format": RECORD_FORMAT}, if_version=0)
        scope.delete(base, if_version=v.version)
        current.add(base)
    for base, found in writes.items():
        # 0.2 kept one entry per (task, index), replacing it when LangGraph's rule said so:
        # as a list they come first, so a later append applies the same rule to them
        entries = sorted((w.value for _k, w in found),
                         key=lambda w: (w["task_path"], w["task_id"], w["idx"]))
        for key, w in found:
            scope.delete(key, if_version=w.version)
        have = lists.get(base)
        scope.put(base + ".p", entries + list(have.value if have else []),
                  if_version=have.version if have else 0)
    for key, v in markers:
        run = f"u.{key.split('.')[1]}"
        if scope.get_bytes(run) is None:
            scope.put(run, {"run_id": v.value["run_id"]})
        scope.delete(key, if_version=v.version)
    for s in {base.split(".")[1] for base in current}:
        if scope.get_bytes(f"c.{s}.{STUB}") is None:
            scope.put(f"c.{s}.{STUB}", STUB_VALUE)
    return True


def _rows(scope: agentstate.Scope, prefix: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    after = None
    while True:
        page = scope.items(prefix, after=after, limit=PAGE)
        out.extend(page)
        if len(page) < PAGE:
            return out
        after = page[-1][0]
