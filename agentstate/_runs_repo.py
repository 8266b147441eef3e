"""Repository of runs: history entries and snapshots, one function per operation."""

from __future__ import annotations

from typing import Any

import apsw

from ._connection import now_iso
from ._encoding import same_json
from .errors import HistoryGap, RunExists, RunNotFound


def write(
    c: apsw.Connection,
    run_id: str,
    entries: list[tuple[int, str]],
    snapshot: str | None,
    create: bool,
) -> int:
    """Add the entries not yet stored and replace the snapshot; return next_seq.

    ``entries`` are (seq, JSON text), consecutive. Runs inside the caller's
    write transaction; the run_entry triggers enforce contiguity as well.
    """
    row = c.execute("SELECT next_seq FROM run WHERE id = ?", (run_id,)).fetchone()
    now = now_iso()
    if create:
        if row is not None:
            raise RunExists(f"run {run_id!r} exists already")
        next_seq = 0
    else:
        if row is None:
            raise RunNotFound(f"no run {run_id!r} (create=True makes a new one)")
        next_seq = row[0]
    old = [e for e in entries if e[0] < next_seq]
    if old:
        _check_resent(c, run_id, old)
    new = [e for e in entries if e[0] >= next_seq]
    for want, (seq, _) in enumerate(new, next_seq):
        if seq != want:
            raise HistoryGap(
                f"run {run_id!r}: expected seq {want} next (stored up to {next_seq - 1}), got {seq}"
            )
    end = next_seq + len(new)
    if create:
        c.execute(
            "INSERT INTO run (id, snapshot, next_seq, created_at, updated_at) VALUES (?, ?, ?, ?, ?)",
            (run_id, snapshot, end, now, now),
        )
    else:  # one statement; next_seq in WHERE restates what the write lock guarantees
        c.execute(
            """UPDATE run SET snapshot = coalesce(?1, snapshot), next_seq = ?2, updated_at = ?3
               WHERE id = ?4 AND next_seq = ?5""",
            (snapshot, end, now, run_id, next_seq),
        )
    if new:
        c.executemany(
            "INSERT INTO run_entry (run_id, seq, entry) VALUES (?, ?, ?)",
            [(run_id, seq, text) for seq, text in new],
        )
    return end


def _check_resent(c: apsw.Connection, run_id: str, old: list[tuple[int, str]]) -> None:
    """Entries re-sent with a stored seq are skipped only if they are the stored ones.

    A retry sends the same entries again; a different entry at a stored seq is
    a racing writer that lost, and it must hear so rather than be dropped.
    """
    stored = dict(c.execute(
        "SELECT seq, entry FROM run_entry WHERE run_id = ? AND seq BETWEEN ? AND ?",
        (run_id, min(s for s, _ in old), max(s for s, _ in old)),
    ).fetchall())
    for seq, text in old:
        have = stored.get(seq)
        if have is None or not same_json(have, text):
            raise HistoryGap(
                f"run {run_id!r}: seq {seq} is already stored with a different entry "
                "(another writer got there first)"
            )


def head(c: apsw.Connection, run_id: str) -> tuple[Any, ...] | None:
    """(snapshot, next_seq, format) of a run, or None."""
    return c.execute(
        "SELECT snapshot, next_seq, format FROM run WHERE id = ?", (run_id,)
    ).fetchone()


def entries(c: apsw.Connection, run_id: str, since: int, limit: int | None) -> list[tuple[int, str]]:
    return c.execute(
        "SELECT seq, entry FROM run_entry WHERE run_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
        (run_id, since, -1 if limit is None else limit),
    ).fetchall()


def tail(c: apsw.Connection, run_id: str, n: int) -> list[tuple[int, str]]:
    rows = c.execute(
        "SELECT seq, entry FROM run_entry WHERE run_id = ? ORDER BY seq DESC LIMIT ?", (run_id, n)
    ).fetchall()
    rows.reverse()
    return rows


def delete(c: apsw.Connection, run_id: str) -> bool:
    return c.execute("DELETE FROM run WHERE id = ? RETURNING id", (run_id,)).fetchone() is not None


def summaries(c: apsw.Connection) -> list[tuple[Any, ...]]:
    """Every run's id, times and snapshot summary fields, newest update first.

    Reads the run rows only, never their histories.
    """
    return c.execute(
        """SELECT id, created_at, updated_at, snapshot -> '$.task', snapshot -> '$.turn',
                  snapshot -> '$.stopped_by', snapshot -> '$.finished'
           FROM run ORDER BY updated_at DESC, rowid DESC"""
    ).fetchall()


def fork(c: apsw.Connection, run_id: str, new_id: str, upto: int | None) -> None:
    src = c.execute("SELECT snapshot FROM run WHERE id = ?", (run_id,)).fetchone()
    if src is None:
        raise RunNotFound(f"no run {run_id!r} to fork")
    if c.execute("SELECT 1 FROM run WHERE id = ?", (new_id,)).fetchone():
        raise RunExists(f"run {new_id!r} exists already")
    now = now_iso()
    c.execute(
        "INSERT INTO run (id, snapshot, created_at, updated_at) VALUES (?, ?, ?, ?)",
        (new_id, src[0], now, now),
    )
    c.execute(
        """INSERT INTO run_entry (run_id, seq, entry)
           SELECT ?1, seq, entry FROM run_entry WHERE run_id = ?2 AND seq <= ?3 ORDER BY seq""",
        (new_id, run_id, (1 << 62) if upto is None else upto),
    )
    c.execute(
        "UPDATE run SET next_seq = (SELECT count(*) FROM run_entry WHERE run_id = ?1) WHERE id = ?1",
        (new_id,),
    )
