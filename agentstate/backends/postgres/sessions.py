"""Repository of sessions and turns on PostgreSQL: the functions of ``_sessions_repo``.

"One turn at a time" is the partial unique index turn_one_active; a turn
starts in ``turn_start`` under the session's row lock, and every state change
is one UPDATE (``turn_move``) whose WHERE clause names the states it may leave.
Reads that come first in a write (the access checks) begin its transaction.
"""

from __future__ import annotations

from typing import Any

from ...errors import NotFound
from .statements import Conn

Row = tuple[Any, ...]
# Turn rows carry the status as it reads now on the server's clock (the store's clock,
# SPEC §11): a leased status whose lease lapsed is 'expired', as on SQLite.
TURN_COLUMNS = ("t.id, t.session_id, t.n, "
                "CASE WHEN t.status IN ('queued', 'running', 'resuming') AND t.lease_until < clock_timestamp() "
                "THEN 'expired' ELSE t.status END, t.input::text, t.request::text, "
                "t.decision::text, t.result::text, t.error, "
                "extract(epoch FROM t.lease_until)::float8, iso_utc(t.created_at), "
                "iso_utc(t.updated_at), t.lease")
_SESSION = "id, owner, iso_utc(created_at), metadata::text"


def session_row(c: Conn, session_id: str, name: str, admin: bool) -> Row:
    """The session as this principal may see it; NotFound for others' sessions too."""
    c.begin()
    row = c.execute(f"SELECT {_SESSION} FROM session WHERE id = %s", (session_id,)).fetchone()
    if row is None or (not admin and row[1] != name):
        raise NotFound(f"no session {session_id!r}")
    return row


def create(c: Conn, session_id: str, owner: str, metadata: str) -> Row:
    created = c.execute("SELECT session_create(%s, %s, %s)",
                        (session_id, owner, metadata)).fetchone()[0]
    return (session_id, owner, created, metadata)


def sessions(c: Conn, name: str, admin: bool, after: str | None, limit: int | None) -> list[Row]:
    """The principal's sessions (an admin's: all), newest first, after the session ``after``."""
    where = [] if admin else ["owner = %(name)s"]
    if after is not None:
        session_row(c, after, name, admin)
        where.append("(created_at, id) < (SELECT created_at, id FROM session WHERE id = %(after)s)")
    return c.execute(
        f"""SELECT {_SESSION} FROM session {"WHERE " + " AND ".join(where) if where else ""}
            ORDER BY created_at DESC, id DESC LIMIT %(limit)s""",
        {"name": name, "after": after, "limit": limit}).fetchall()


def delete(c: Conn, session_id: str) -> None:
    """The session, its turns (cascade) and its session-scope keys, remembering versions."""
    c.execute("SELECT session_delete(%s)", (session_id,))


_IDLE = """SELECT s.id FROM session s
           WHERE coalesce((SELECT max(created_at) FROM turn WHERE session_id = s.id), s.created_at)
                 < %(cutoff)s::timestamptz
             AND NOT EXISTS (SELECT 1 FROM turn WHERE session_id = s.id
                             AND status IN ('queued', 'running', 'resuming')
                             AND lease_until >= clock_timestamp()){only}
           ORDER BY s.created_at, s.id"""


def idle(c: Conn, cutoff: str, now: float) -> list[str]:
    """Sessions with no turn started since ``cutoff`` and none queued, running or resuming
    (with a live lease), oldest first; locked, so they stay so until the caller deletes them.

    The first look locks nothing; the sessions it finds are then locked (a turn
    starts under its session's lock: turn_start) with their turns (a resume
    holds its turn's), and looked at again in a new snapshot, which sees any
    turn that started or resumed meanwhile. (``now``: the server's clock is read
    in SQL instead.)
    """
    c.begin()
    found = [r[0] for r in c.execute(_IDLE.format(only=""), {"cutoff": cutoff}).fetchall()]
    if not found:
        return []
    c.execute("SELECT 1 FROM session WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (found,))
    c.execute("SELECT 1 FROM turn WHERE session_id = ANY(%s) ORDER BY id FOR UPDATE", (found,))
    return [r[0] for r in c.execute(_IDLE.format(only=" AND s.id = ANY(%(found)s)"),
                                    {"cutoff": cutoff, "found": found}).fetchall()]


def start(c: Conn, turn_id: str, session_id: str, status: str, input_: str | None,
          lease: float) -> Row:
    """Insert a queued or running turn; SessionBusy while another one is active."""
    return c.execute(f"SELECT {TURN_COLUMNS} FROM turn_start(%s, %s, %s, %s, %s) t",
                     (turn_id, session_id, status, input_, lease)).fetchone()


def turn_row(c: Conn, turn_id: str) -> Row | None:
    c.begin()
    return c.execute(f"SELECT {TURN_COLUMNS} FROM turn t WHERE id = %s", (turn_id,)).fetchone()


def turns(c: Conn, session_id: str, after: str | None, limit: int | None) -> list[Row]:
    """The session's turns, newest first, after the turn ``after`` (of this session)."""
    where = ""
    if after is not None:
        if c.execute("SELECT 1 FROM turn WHERE id = %s AND session_id = %s",
                     (after, session_id)).fetchone() is None:
            raise NotFound(f"no turn {after!r} in session {session_id!r} to list after")
        where = "AND n < (SELECT n FROM turn WHERE id = %(after)s)"
    return c.execute(
        f"SELECT {TURN_COLUMNS} FROM turn t WHERE session_id = %(sid)s {where} "
        "ORDER BY n DESC LIMIT %(limit)s",
        {"sid": session_id, "after": after, "limit": limit}).fetchall()


def turns_by_status(c: Conn, name: str, admin: bool, live: tuple[str, ...], expired: bool,
                    now: float, after: str | None, limit: int | None) -> list[Row]:
    """As ``_sessions_repo.turns_by_status``: open turns by status, newest turn first."""
    lapsed = ("(t.status IN ('queued', 'running', 'resuming') AND t.lease_until IS NOT NULL "
              "AND t.lease_until < to_timestamp(%(now)s))")
    wanted = []
    if live:
        wanted.append(f"(t.status = ANY(%(live)s) AND NOT {lapsed})")
    if expired:
        wanted.append(f"(t.status = 'expired' OR {lapsed})")
    # the index's own predicate, verbatim, lets the planner use turn_by_status
    where = ["t.status IN ('queued', 'running', 'held', 'decided', 'resuming', 'expired')",
             "(" + " OR ".join(wanted) + ")"]
    if not admin:
        where.append("s.owner = %(name)s")
    at = None
    if after is not None:
        row = c.execute("SELECT session_id, created_at FROM turn WHERE id = %s", (after,)).fetchone()
        try:
            if row is None:
                raise NotFound(after)
            session_row(c, row[0], name, admin)
        except NotFound:
            raise NotFound(f"no turn {after!r} to list after") from None
        at = row[1]
        where.append("(t.created_at, t.id) < (%(at)s, %(after)s)")
    return c.execute(
        f"""SELECT {TURN_COLUMNS} FROM turn t JOIN session s ON s.id = t.session_id
            WHERE {' AND '.join(where)} ORDER BY t.created_at DESC, t.id DESC LIMIT %(limit)s""",
        {"live": list(live), "now": now, "name": name, "after": after, "at": at,
         "limit": limit}).fetchall()


def move(c: Conn, turn_id: str, from_states: tuple[str, ...], to: str, sets: dict[str, Any],
         lease: float | None, what: str) -> Row:
    """Change a turn's state if it is in ``from_states`` (and its lease holds)."""
    return c.execute(
        f"SELECT {TURN_COLUMNS} FROM turn_move(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) t",
        (turn_id, list(from_states), to, lease, what, list(sets), sets.get("request"),
         sets.get("decision"), sets.get("result"), sets.get("error"))).fetchone()


def active_turn(c: Conn, session_id: str) -> Row | None:
    return c.execute(
        f"SELECT {TURN_COLUMNS} FROM turn t WHERE session_id = %s AND status IN ('queued', 'running')",
        (session_id,)).fetchone()


def check_fence(c: Conn, turn_id: str, owner: str | None = None) -> None:
    """LeaseLost unless the turn runs (or resumes) with its lease held, by the server's clock
    (``turn_fence`` in the schema). The turn's row stays locked (FOR SHARE) until the write
    commits: starting another turn of the session first expires this one, which waits for
    that lock. A lone write sends the check with itself, in its one round trip."""
    c.fence_first(turn_id, owner)
