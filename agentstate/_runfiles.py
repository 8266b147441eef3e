"""Runs in and out of plain files: ``DIR/{id}/log.jsonl`` and ``DIR/{id}/snapshot.json``.

Files are owner-only and flushed to disk (file and folder fsync) before the
call returns; a file is written under a temporary name and renamed, so a
crash leaves the old file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ._encoding import _KEY
from .errors import AgentStateError, InvalidKey, RunExists, RunNotFound, StorageError

if TYPE_CHECKING:
    from ._runs import RunStore

LOG, SNAPSHOT = "log.jsonl", "snapshot.json"


class ImportResult(NamedTuple):
    """What ``import_runs`` did with one folder: entries added, or why it refused it."""

    run_id: str
    added: int
    error: str | None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def _dump(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def export_run(runs: RunStore, run_id: str, folder: str | os.PathLike[str]) -> Path:
    """Write one run to ``folder/{run_id}/``; return that folder.

    :raises RunNotFound: no such run. :raises StorageError: the files cannot be written.
    """
    if set(run_id) <= {"."}:
        raise InvalidKey(f"run id {run_id!r} cannot name a folder of its own")
    record = runs.read(run_id)
    if record is None:
        raise RunNotFound(f"no run {run_id!r}")
    out = Path(folder) / run_id
    try:
        out.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = "".join(_dump(e) + "\n" for e in record.entries)
        _write_file(out / LOG, log.encode("utf-8"))
        _write_file(out / SNAPSHOT, (_dump(record.snapshot) + "\n").encode("utf-8"))
        _fsync_dir(out)
        _fsync_dir(out.parent)
    except OSError as e:
        raise StorageError(f"cannot write {out}: {e.strerror or e}") from None
    return out


def _read_run(folder: Path) -> tuple[list[Any], Any]:
    """Parse one run folder; ValueError names the file and line of the first problem."""
    entries: list[Any] = []
    log = folder / LOG
    if log.exists():
        with log.open("rb") as f:
            for n, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    entry = json.loads(raw.decode("utf-8"))
                except (UnicodeDecodeError, ValueError, RecursionError) as e:
                    raise ValueError(f"{log}:{n}: not a JSON line: {e}") from None
                if not isinstance(entry, dict) or type(entry.get("seq")) is not int:
                    raise ValueError(f"{log}:{n}: an entry must be an object with an integer seq")
                entries.append(entry)
    snapshot = None
    snap = folder / SNAPSHOT
    if snap.exists():
        try:
            snapshot = json.loads(snap.read_bytes().decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise ValueError(f"{snap}:1: not JSON: {e}") from None
        if snapshot is not None and not isinstance(snapshot, dict):
            raise ValueError(f"{snap}:1: the snapshot must be an object or null")
    return entries, snapshot


def _write_run(runs: RunStore, run_id: str, entries: list[Any], snapshot: Any) -> int:
    """Continue the run, or create it; retried if another writer creates or deletes it."""
    for _ in range(3):
        before = runs._next_seq(run_id)
        # An export that adds nothing to a stored run is older than it (or the
        # same): its snapshot must not replace the newer one.
        stale = before is not None and all(e["seq"] < before for e in entries)
        try:
            runs.write(run_id, entries, None if stale else snapshot, create=before is None)
        except (RunExists, RunNotFound):
            continue
        return (runs._next_seq(run_id) or 0) - (before or 0)
    runs.write(run_id, entries, snapshot, create=runs._next_seq(run_id) is None)
    return 0


def import_runs(runs: RunStore, folder: str | os.PathLike[str]) -> list[ImportResult]:
    """Import every ``folder/{id}/`` holding a log.jsonl or snapshot.json.

    Each run is one transaction: a malformed file writes nothing of that run and
    is reported with its file and line. Entries already stored are skipped, so
    importing the same folder twice adds nothing the second time.
    """
    root = Path(folder)
    if not root.is_dir():
        raise StorageError(f"{root} is not a folder")
    results = []
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        if not ((sub / LOG).exists() or (sub / SNAPSHOT).exists()):
            continue
        run_id = sub.name
        if _KEY.fullmatch(run_id) is None:
            results.append(ImportResult(run_id, 0, f"{sub}: not a valid run id"))
            continue
        try:
            entries, snapshot = _read_run(sub)
            added = _write_run(runs, run_id, entries, snapshot)
            results.append(ImportResult(run_id, added, None))
        except (ValueError, AgentStateError) as e:
            msg = str(e)
            if isinstance(e, AgentStateError):
                msg = f"{sub / LOG}: {e.code}: {e}"
            results.append(ImportResult(run_id, 0, msg))
        except OSError as e:
            results.append(ImportResult(run_id, 0, f"{sub}: {e.strerror or e}"))
    return results
