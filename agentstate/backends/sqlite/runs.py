"""Repository of runs: history entries and snapshots, one function per operation."""

from __future__ import annotations

from typing import Any


from ..._encoding import same_json
from ..._grants import Rule
from ...errors import HistoryGap, RunExists, RunNotFound
from ..base import Conn, now_iso
from . import feed


def write(
    c: Conn,
    run_id: str,
    entries: list[tuple[int, str]],
    snapshot: str | None,
    create: bool,
) -> int:
    """Add the entries not yet stored and replace the snapshot; return next_seq.

    ``entries`` are (seq, JSON text), consecutive. Runs inside the caller's
    write transaction; the run_entry triggers enforce contiguity as well.
    """
    row = c.execute("SELECT next_seq, first_seq FROM run WHERE id = ?", (run_id,)).fetchone()
    now = now_iso()
    if create:
        if row is not None:
            raise RunExists(f"run {run_id!r} exists already")
        next_seq = first = 0
    else:
        if row is None:
            raise RunNotFound(f"no run {run_id!r} (create=True makes a new one)")
        next_seq, first = row
    # Re-sent entries below first_seq were trimmed away: nothing to compare them with.
    old = [e for e in entries if first <= e[0] < next_seq]
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
    feed.record(c, "run", "create" if create else "write", None, run_id, None, None,
                 next_seq, len(new), at=now)
    return end


def _check_resent(c: Conn, run_id: str, old: list[tuple[int, str]]) -> None:
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


def head(c: Conn, run_id: str) -> tuple[Any, ...] | None:
    """(snapshot, next_seq, format, first_seq, created_at, updated_at, pinned) of a run, or
    None."""
    return c.execute(
        "SELECT snapshot, next_seq, format, first_seq, created_at, updated_at, pinned "
        "FROM run WHERE id = ?", (run_id,)).fetchone()


def lock(c: Conn, run_id: str) -> tuple[Any, ...] | None:
    """``head()``: the write transaction holds the file's write lock already."""
    return head(c, run_id)


def entries(c: Conn, run_id: str, since: int, limit: int | None) -> list[tuple[int, str]]:
    return c.execute(
        "SELECT seq, entry FROM run_entry WHERE run_id = ? AND seq >= ? ORDER BY seq LIMIT ?",
        (run_id, since, -1 if limit is None else limit),
    ).fetchall()


def tail(c: Conn, run_id: str, n: int) -> list[tuple[int, str]]:
    rows = c.execute(
        "SELECT seq, entry FROM run_entry WHERE run_id = ? ORDER BY seq DESC LIMIT ?", (run_id, n)
    ).fetchall()
    rows.reverse()
    return rows


def delete(c: Conn, run_id: str) -> bool:
    if c.execute("DELETE FROM run WHERE id = ? RETURNING id", (run_id,)).fetchone() is None:
        return False
    feed.record(c, "run", "delete", None, run_id)
    return True


def trim(c: Conn, run_id: str, before: int) -> int:
    """Remove the entries with seq < before; the history then starts at that seq."""
    row = c.execute("SELECT next_seq, first_seq FROM run WHERE id = ?", (run_id,)).fetchone()
    if row is None:
        raise RunNotFound(f"no run {run_id!r}")
    next_seq, first = row
    new_first = min(max(before, first), next_seq)  # never past the last entry: no gap
    removed = new_first - first
    if removed == 0:
        return 0
    c.execute("UPDATE run SET first_seq = ? WHERE id = ?", (new_first, run_id))
    c.execute(_KEEP_CALLS, (run_id, new_first))
    c.execute("DELETE FROM run_entry WHERE run_id = ? AND seq < ?", (run_id, new_first))
    feed.record(c, "run", "trim", None, run_id, None, None, new_first, removed)
    return removed


def prune(c: Conn, cutoff: str, finished_only: bool) -> list[str]:
    """Delete the runs last written before ``cutoff`` (only finished ones if asked), but
    never a pinned one."""
    ids = [r[0] for r in c.execute(
        """SELECT id FROM run WHERE updated_at < ?1 AND NOT pinned
             AND (NOT ?2 OR (snapshot IS NOT NULL AND json_type(snapshot, '$.finished') = 'true'))
           ORDER BY updated_at, id""", (cutoff, finished_only)).fetchall()]
    for run_id in ids:
        delete(c, run_id)
    return ids


def summaries(c: Conn, after: str | None, limit: int | None,
              grants: tuple[Rule, ...] | None = None) -> list[tuple[Any, ...]]:
    """Runs' ids, times and snapshot summary fields, newest update first: those listed
    after the run ``after`` (a page's last), at most ``limit``; with ``grants``, only the
    runs a ``runs`` rule covers (SPEC §15).

    Reads the run rows only (through run_by_update), never their histories.
    """
    params: dict[str, Any] = {"after": after, "limit": -1 if limit is None else limit}
    where = ["1"]
    if after is not None:
        if c.execute("SELECT 1 FROM run WHERE id = ?", (after,)).fetchone() is None:
            raise RunNotFound(f"no run {after!r} to list after (deleted since?): list from the start")
        where.append("(updated_at, rowid) < (SELECT updated_at, rowid FROM run WHERE id = :after)")
    if grants is not None:
        allowed = feed.GRANTS.runs_sql(grants, params)
        if allowed is None:
            return []
        where.append(allowed)
    return c.execute(
        f"""SELECT id, created_at, updated_at, snapshot -> '$.task', snapshot -> '$.turn',
                   snapshot -> '$.stopped_by', snapshot -> '$.finished', pinned
            FROM run WHERE {' AND '.join(where)} ORDER BY updated_at DESC, rowid DESC LIMIT :limit""",
        params).fetchall()


def pin(c: Conn, run_id: str, pinned: bool) -> bool:
    """Pin (or unpin) a run: prune() leaves a pinned run; a ``pin`` change when it changed.
    Whether the run is pinned now."""
    row = c.execute("UPDATE run SET pinned = ?2 WHERE id = ?1 AND pinned <> ?2 RETURNING pinned",
                    (run_id, int(pinned))).fetchone()
    if row is None:
        if c.execute("SELECT 1 FROM run WHERE id = ?", (run_id,)).fetchone() is None:
            raise RunNotFound(f"no run {run_id!r}")
        return pinned
    feed.record(c, "run", "pin", None, run_id)
    return pinned


def fork(c: Conn, run_id: str, new_id: str, upto: int | None) -> None:
    src = c.execute("SELECT snapshot, first_seq, next_seq FROM run WHERE id = ?", (run_id,)).fetchone()
    if src is None:
        raise RunNotFound(f"no run {run_id!r} to fork")
    if c.execute("SELECT 1 FROM run WHERE id = ?", (new_id,)).fetchone():
        raise RunExists(f"run {new_id!r} exists already")
    snapshot, first, next_seq = src
    if upto is not None and upto < first:
        raise HistoryGap(f"run {run_id!r} was trimmed: its history starts at seq {first}, "
                         f"after upto={upto}")
    end = next_seq if upto is None else min(upto + 1, next_seq)
    now = now_iso()
    c.execute(
        """INSERT INTO run (id, snapshot, next_seq, first_seq, created_at, updated_at)
           VALUES (?, ?, ?, ?, ?, ?)""",
        (new_id, snapshot, end, first, now, now),
    )
    c.execute(
        """INSERT INTO run_entry (run_id, seq, entry)
           SELECT ?1, seq, entry FROM run_entry WHERE run_id = ?2 AND seq < ?3 ORDER BY seq""",
        (new_id, run_id, end),
    )
    # the calls a trim took out of the source's history are the fork's too (all below first)
    c.execute("INSERT INTO run_call (run_id, call_id, seq, entry) "
              "SELECT ?1, call_id, seq, entry FROM run_call WHERE run_id = ?2", (new_id, run_id))
    feed.record(c, "run", "fork", None, new_id, None, None, first, end - first)


# A call's entries are those tool_call / tool_result entries whose call_id is the JSON string
# of the call id (json_extract keeps the number 7 and the string "7" apart).
_IS_CALL = ("CASE WHEN json_valid(entry) THEN json_extract(entry, '$.type') END "
            "IN ('tool_call', 'tool_result')")
_CALL_ID = "CASE WHEN json_valid(entry) THEN json_extract(entry, '$.call_id') END"

# The newest entry of one call id: the partial index run_entry_call (schema.sql), so one
# probe whatever the run's length (INDEXED BY: with no statistics the planner would scan
# the run's entries by the primary key instead); else what a trim kept of it (run_call).
_LAST_CALL = f"""
SELECT seq, entry FROM (
    SELECT * FROM (SELECT seq, entry FROM run_entry INDEXED BY run_entry_call
                   WHERE run_id = ?1 AND {_CALL_ID} = ?2 AND {_IS_CALL} AND {{claims}}
                   ORDER BY seq DESC LIMIT 1)
    UNION ALL
    SELECT seq, entry FROM run_call WHERE run_id = ?1 AND call_id = ?2 AND {{claims}})
ORDER BY seq DESC LIMIT 1"""
_LAST = {False: _LAST_CALL.format(claims="1"),
         True: _LAST_CALL.format(claims="json_extract(entry, '$.type') = 'tool_call'")}

# What a trim to ?2 keeps of the calls it removes: the newest entry of each call id (a
# string: what once() looks up), unless run_call has a newer one.
_KEEP_CALLS = f"""
INSERT INTO run_call (run_id, call_id, seq, entry)
SELECT ?1, cid, seq, entry FROM (
    SELECT {_CALL_ID} AS cid, seq, entry,
           row_number() OVER (PARTITION BY {_CALL_ID} ORDER BY seq DESC) AS newest
    FROM run_entry INDEXED BY run_entry_call
    WHERE run_id = ?1 AND seq < ?2 AND {_IS_CALL}
      AND CASE WHEN json_valid(entry) THEN json_type(entry, '$.call_id') END = 'text')
WHERE newest = 1
ON CONFLICT (run_id, call_id) DO UPDATE SET seq = excluded.seq, entry = excluded.entry
WHERE excluded.seq > run_call.seq"""


def last_call(c: Conn, run_id: str, call_id: str, claims: bool = False) -> tuple[int, str] | None:
    """The newest tool_call or tool_result entry of ``call_id`` (``claims``: the newest
    tool_call) as (seq, JSON text), or None."""
    return c.execute(_LAST[claims], (run_id, call_id)).fetchone()
