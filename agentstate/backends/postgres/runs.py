"""Repository of runs on PostgreSQL: the functions of ``_runs_repo``, same arguments, same rows.

Writes are calls of server functions (``run_write``, ``run_trim``, ...) that
lock the run's row; the statement trigger ``run_entry_contiguous`` refuses a
gap from any writer, psql included.
"""

from __future__ import annotations

from typing import Any

from ..._encoding import same_json
from ..._grants import Rule
from ...errors import HistoryGap, RunNotFound
from . import feed
from .statements import Conn

Row = tuple[Any, ...]


def write(c: Conn, run_id: str, entries: list[tuple[int, str]], snapshot: str | None,
          create: bool) -> int:
    """Add the entries not yet stored and replace the snapshot; return next_seq.

    Entries re-sent with a stored seq are skipped when they are the stored
    ones. The server compares texts; when a text differs it writes nothing and
    names the seqs, and they are compared here as JSON values (key order
    aside): a different entry is a writer that lost a race (HistoryGap), the
    same one is sent again as stored. The server checks again under its lock.
    """
    seqs = [seq for seq, _ in entries]
    texts = [text for _, text in entries]
    for _ in range(3):
        end, differs = c.execute("SELECT o_end, o_differs FROM run_write(%s, %s, %s, %s, %s)",
                                 (run_id, seqs, texts, snapshot, create)).fetchone()
        if differs is None:
            return end
        stored = dict(c.execute(
            "SELECT seq, entry::text FROM run_entry WHERE run_id = %s AND seq = ANY(%s)",
            (run_id, differs)).fetchall())
        for i, seq in enumerate(seqs):
            have = stored.get(seq)
            if have is None:  # trimmed meanwhile: no longer compared
                continue
            if not same_json(have, texts[i]):
                raise HistoryGap(f"run {run_id!r}: seq {seq} is already stored with a different "
                                 "entry (another writer got there first)")
            texts[i] = have
    raise HistoryGap(f"run {run_id!r}: its stored entries kept changing while they were compared")


_HEAD = ("snapshot::text, next_seq, format, first_seq, iso_utc(created_at), iso_utc(updated_at), "
         "pinned")


def head(c: Conn, run_id: str) -> Row | None:
    """(snapshot, next_seq, format, first_seq, created_at, updated_at, pinned) of a run, or
    None."""
    return c.execute(f"SELECT {_HEAD} FROM run WHERE id = %s", (run_id,)).fetchone()


def lock(c: Conn, run_id: str) -> Row | None:
    """``head()`` in the write's transaction, the run's row locked (FOR UPDATE) until it
    commits: appends of other writers of this run wait, as they do for run_write()."""
    c.begin()
    return c.execute(f"SELECT {_HEAD} FROM run WHERE id = %s FOR UPDATE", (run_id,)).fetchone()


def entries(c: Conn, run_id: str, since: int, limit: int | None) -> list[tuple[int, str]]:
    return c.execute(
        "SELECT seq, entry::text FROM run_entry WHERE run_id = %s AND seq >= %s ORDER BY seq LIMIT %s",
        (run_id, since, limit)).fetchall()


def tail(c: Conn, run_id: str, n: int) -> list[tuple[int, str]]:
    rows = c.execute(
        "SELECT seq, entry::text FROM run_entry WHERE run_id = %s ORDER BY seq DESC LIMIT %s",
        (run_id, n)).fetchall()
    rows.reverse()
    return rows


def delete(c: Conn, run_id: str) -> bool:
    return c.execute("SELECT run_delete(%s)", (run_id,)).fetchone()[0]


def trim(c: Conn, run_id: str, before: int) -> int:
    """Remove the entries with seq < before; the history then starts at that seq."""
    return c.execute("SELECT run_trim(%s, %s)", (run_id, before)).fetchone()[0]


def prune(c: Conn, cutoff: str, finished_only: bool) -> list[str]:
    """Delete the runs last written before ``cutoff`` (only finished ones if asked)."""
    return c.execute("SELECT run_prune(%s::timestamptz, %s)", (cutoff, finished_only)).fetchone()[0]


def summaries(c: Conn, after: str | None, limit: int | None,
              grants: tuple[Rule, ...] | None = None) -> list[Row]:
    """Runs' ids, times and snapshot summary fields, newest update first, after the run
    ``after``; with ``grants``, only the runs a ``runs`` rule covers (SPEC §15); the run
    rows only (through run_by_update)."""
    params: dict[str, Any] = {"after": after, "limit": limit}
    where = ["true"]
    if after is not None:
        if c.execute("SELECT 1 FROM run WHERE id = %s", (after,)).fetchone() is None:
            raise RunNotFound(f"no run {after!r} to list after (deleted since?): list from the start")
        where.append("(updated_at, id) < (SELECT updated_at, id FROM run WHERE id = %(after)s)")
    if grants is not None:
        allowed = feed.GRANTS.runs_sql(grants, params)
        if allowed is None:
            return []
        where.append(allowed)
    return c.execute(
        f"""SELECT id, iso_utc(created_at), iso_utc(updated_at), (snapshot -> 'task')::text,
                   (snapshot -> 'turn')::text, (snapshot -> 'stopped_by')::text,
                   (snapshot -> 'finished')::text, pinned
            FROM run WHERE {' AND '.join(where)} ORDER BY updated_at DESC, id DESC LIMIT %(limit)s""",
        params).fetchall()


def fork(c: Conn, run_id: str, new_id: str, upto: int | None) -> None:
    c.execute("SELECT run_fork(%s, %s, %s)", (run_id, new_id, upto))


def last_call(c: Conn, run_id: str, call_id: str, claims: bool = False) -> tuple[int, str] | None:
    """The newest tool_call or tool_result entry of ``call_id`` (``claims``: the newest
    tool_call) as (seq, JSON text), or None: the partial index run_entry_call, one probe
    whatever the run's length; else what a trim kept of it (run_call). The call id is a
    JSON string: ``->>`` alone would take the number 7 for the call "7"."""
    types = "('tool_call')" if claims else "('tool_call', 'tool_result')"
    return c.execute(
        f"""SELECT seq, entry FROM (
               (SELECT seq, entry::text FROM run_entry
                WHERE run_id = %(run)s AND (entry ->> 'call_id') = %(call)s
                  AND (entry ->> 'type') IN ('tool_call', 'tool_result')
                  AND (entry ->> 'type') IN {types}
                  AND json_typeof(entry -> 'call_id') = 'string'
                ORDER BY seq DESC LIMIT 1)
               UNION ALL
               SELECT seq, entry::text FROM run_call
               WHERE run_id = %(run)s AND call_id = %(call)s AND (entry ->> 'type') IN {types}
           ) AS found ORDER BY seq DESC LIMIT 1""", {"run": run_id, "call": call_id}).fetchone()


def pin(c: Conn, run_id: str, pinned: bool) -> bool:
    """Pin (or unpin) a run; whether it is pinned now."""
    now = c.execute("SELECT run_pin(%s, %s)", (run_id, pinned)).fetchone()[0]
    if now is None:
        raise RunNotFound(f"no run {run_id!r}")
    return now
