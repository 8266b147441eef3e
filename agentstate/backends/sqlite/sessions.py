"""Repository of sessions and turns: one function per operation.

"One turn at a time" is the partial unique index turn_one_active; every state
change is one UPDATE whose WHERE clause names the states it may leave, so a
move outside the diagram changes nothing, whoever races.
"""

from __future__ import annotations

import time
from typing import Any

import apsw

from ...errors import InvalidTransition, LeaseLost, NotFound, SessionBusy
from ..base import Conn, now_iso
from ..leases import LEASED, effective_status, turn_live
from . import feed, kv

OPEN = ('queued', 'running', 'held', 'decided', 'resuming', 'expired')  # what turn_by_status indexes
# A turn's columns; its status as it reads by the store's clock (a leased state whose
# lease lapsed reads 'expired'), computed here, where the store is, for every reader.
_COLUMNS = ("{t}id, {t}session_id, {t}n, CASE WHEN {t}status IN ('queued', 'running', 'resuming') "
            "AND {t}lease_until < (julianday('now') - 2440587.5) * 86400.0 THEN 'expired' "
            "ELSE {t}status END, {t}input, {t}request, {t}decision, {t}result, {t}error, "
            "{t}lease_until, {t}created_at, {t}updated_at, {t}lease")
TURN_COLUMNS = _COLUMNS.format(t="")


def session_row(c: Conn, session_id: str, name: str, admin: bool) -> tuple[Any, ...]:
    """The session as this principal may see it; NotFound for others' sessions too."""
    row = c.execute(
        "SELECT id, owner, created_at, metadata FROM session WHERE id = ?", (session_id,)
    ).fetchone()
    if row is None or (not admin and row[1] != name):
        raise NotFound(f"no session {session_id!r}")
    return row


def create(c: Conn, session_id: str, owner: str, metadata: str) -> tuple[Any, ...]:
    now = now_iso()
    c.execute(
        "INSERT INTO session (id, owner, created_at, metadata) VALUES (?, ?, ?, ?)",
        (session_id, owner, now, metadata),
    )
    feed.record(c, "session", "create", None, session_id)
    return (session_id, owner, now, metadata)


def sessions(c: Conn, name: str, admin: bool, after: str | None,
             limit: int | None) -> list[tuple[Any, ...]]:
    """The principal's sessions (an admin's: all), newest first: those listed after the
    session ``after`` (a page's last; NotFound if gone or not visible), at most ``limit``."""
    where = [] if admin else ["owner = :name"]
    if after is not None:
        session_row(c, after, name, admin)
        where.append("(created_at, id) < (SELECT created_at, id FROM session WHERE id = :after)")
    return c.execute(
        f"""SELECT id, owner, created_at, metadata FROM session
            {"WHERE " + " AND ".join(where) if where else ""}
            ORDER BY created_at DESC, id DESC LIMIT :limit""",
        {"name": name, "after": after, "limit": -1 if limit is None else limit},
    ).fetchall()


def delete(c: Conn, session_id: str) -> None:
    """The session, its turns (cascade) and its session-scope keys, remembering versions."""
    kv.drop_scope(c, "session", session_id)
    c.execute("DELETE FROM session WHERE id = ?", (session_id,))
    feed.record(c, "session", "delete", None, session_id)


def idle(c: Conn, cutoff: str, now: float) -> list[str]:
    """Sessions with no turn started since ``cutoff`` and none queued, running or resuming
    (with a live lease), oldest first."""
    return [r[0] for r in c.execute(
        """SELECT s.id FROM session s
           WHERE coalesce((SELECT max(created_at) FROM turn WHERE session_id = s.id), s.created_at) < ?1
             AND NOT EXISTS (SELECT 1 FROM turn WHERE session_id = s.id
                             AND status IN ('queued', 'running', 'resuming') AND lease_until >= ?2)
           ORDER BY s.created_at, s.id""", (cutoff, now)).fetchall()]


def expire_lapsed(c: Conn, session_id: str, now: float) -> None:
    for (turn_id,) in c.execute(
        f"""UPDATE turn SET status = 'expired', updated_at = ?
            WHERE session_id = ? AND status IN {LEASED} AND lease_until < ? RETURNING id""",
        (now_iso(), session_id, now),
    ).fetchall():
        feed.record(c, "session", "expired", None, session_id, turn_id)


def start(
    c: Conn, turn_id: str, session_id: str, status: str, input_: str | None, lease: float
) -> tuple[Any, ...]:
    """Insert a queued or running turn; SessionBusy while another one is active."""
    now = time.time()
    expire_lapsed(c, session_id, now)
    stamp = now_iso()
    try:
        row = c.execute(
            f"""INSERT INTO turn (id, session_id, n, status, input, lease, lease_until,
                                  created_at, updated_at)
                VALUES (?1, ?2, 1 + coalesce((SELECT max(n) FROM turn WHERE session_id = ?2), 0),
                        ?3, ?4, ?5, ?6, ?7, ?7)
                RETURNING {TURN_COLUMNS}""",
            (turn_id, session_id, status, input_, lease, now + lease, stamp),
        ).fetchone()
        feed.record(c, "session", status, None, session_id, turn_id)
        return row
    except apsw.ConstraintError:
        active = c.execute(
            "SELECT id FROM turn WHERE session_id = ? AND status IN ('queued', 'running')",
            (session_id,),
        ).fetchone()
        if active is None:  # pragma: no cover - the index and this query agree
            raise
        raise SessionBusy(
            f"session {session_id!r} has an active turn {active[0]!r}", active[0]
        ) from None


def turn_row(c: Conn, turn_id: str) -> tuple[Any, ...] | None:
    return c.execute(f"SELECT {TURN_COLUMNS} FROM turn WHERE id = ?", (turn_id,)).fetchone()


def turns(c: Conn, session_id: str, after: str | None,
          limit: int | None) -> list[tuple[Any, ...]]:
    """The session's turns, newest first: those after the turn ``after`` (of this
    session; NotFound if not), at most ``limit``."""
    where = ""
    if after is not None:
        if c.execute("SELECT 1 FROM turn WHERE id = ? AND session_id = ?",
                     (after, session_id)).fetchone() is None:
            raise NotFound(f"no turn {after!r} in session {session_id!r} to list after")
        where = "AND n < (SELECT n FROM turn WHERE id = :after)"
    return c.execute(
        f"SELECT {TURN_COLUMNS} FROM turn WHERE session_id = :sid {where} ORDER BY n DESC LIMIT :limit",
        {"sid": session_id, "after": after, "limit": -1 if limit is None else limit},
    ).fetchall()


def turns_by_status(c: Conn, name: str, admin: bool, live: tuple[str, ...],
                    expired: bool, now: float, after: str | None,
                    limit: int | None) -> list[tuple[Any, ...]]:
    """Turns in the ``live`` statuses whose lease holds, and (``expired``) those whose
    lease lapsed or that were marked expired, of the principal's sessions (an admin's:
    all), newest turn first: one query, one clock reading. After the turn ``after``
    (NotFound, as for an unknown id, if it is not the principal's)."""
    lapsed = f"(t.status IN {LEASED} AND t.lease_until IS NOT NULL AND t.lease_until < :now)"
    wanted = []  # statuses are checked names (never the caller's text)
    if live:
        wanted.append(f"(t.status IN ({', '.join(repr(s) for s in live)}) AND NOT {lapsed})")
    if expired:
        wanted.append(f"(t.status = 'expired' OR {lapsed})")
    # the index's own term, verbatim, lets SQLite use it
    where = [f"t.status IN {OPEN}", "(" + " OR ".join(wanted) + ")"]
    if not admin:
        where.append("s.owner = :name")
    at = None
    if after is not None:
        row = turn_row(c, after)
        try:
            if row is None:
                raise NotFound(after)
            session_row(c, row[1], name, admin)
        except NotFound:
            raise NotFound(f"no turn {after!r} to list after") from None
        at = row[10]
        where.append("(t.created_at, t.id) < (:at, :after)")
    return c.execute(
        f"""SELECT {_COLUMNS.format(t="t.")}
            FROM turn t JOIN session s ON s.id = t.session_id
            WHERE {' AND '.join(where)}
            ORDER BY t.created_at DESC, t.id DESC LIMIT :limit""",
        {"now": now, "name": name, "after": after, "at": at, "limit": -1 if limit is None else limit},
    ).fetchall()


def move(
    c: Conn,
    turn_id: str,
    from_states: tuple[str, ...],
    to: str,
    sets: dict[str, Any],
    lease: float | None,
    what: str,
) -> tuple[Any, ...]:
    """Change a turn's state if it is in ``from_states`` (and its lease holds)."""
    now = time.time()
    assignments = ", ".join(f"{k} = :{k}" for k in sets)
    params = {**sets, "id": turn_id, "to": to, "now": now, "stamp": now_iso(), "lease": lease,
              "lease_until": None if lease is None else now + lease}
    placeholders = ", ".join(f"'{s}'" for s in from_states)
    row = c.execute(
        f"""UPDATE turn SET status = :to, updated_at = :stamp, lease_until = :lease_until,
                lease = coalesce(:lease, lease)
                {', ' + assignments if assignments else ''}
            WHERE id = :id AND status IN ({placeholders})
              AND NOT (status IN {LEASED} AND lease_until < :now)
            RETURNING {TURN_COLUMNS}""",
        params,
    ).fetchone()
    if row is not None:
        feed.record(c, "session", to, None, row[1], turn_id)
        return row
    cur = turn_row(c, turn_id)
    if cur is None:  # pragma: no cover - the caller checked access first
        raise NotFound(f"no turn {turn_id!r}")
    status = effective_status(cur[3], cur[9], now)
    raise InvalidTransition(f"cannot {what} turn {turn_id!r}: it is {status}")



def active_turn(c: Conn, session_id: str) -> tuple[Any, ...] | None:
    return c.execute(
        f"SELECT {TURN_COLUMNS} FROM turn WHERE session_id = ? AND status IN ('queued', 'running')",
        (session_id,),
    ).fetchone()


def check_fence(c: Conn, turn_id: str, owner: str | None = None) -> None:
    """LeaseLost unless the turn runs (or resumes) with its lease held (and, given an
    ``owner``, is of that principal's session: another's turn is as unknown). Inside a write
    transaction, which holds the file's write lock: no turn can start before its COMMIT."""
    now = time.time()
    row = turn_row(c, turn_id) if owner is None else c.execute(
        f"SELECT {_COLUMNS.format(t='t.')} FROM turn t JOIN session s ON s.id = t.session_id "
        "WHERE t.id = ? AND s.owner = ?", (turn_id, owner)).fetchone()
    if not turn_live(row, now):
        status = "unknown" if row is None else effective_status(row[3], row[9], now)
        raise LeaseLost(f"turn {turn_id!r} no longer holds its lease ({status}): "
                        "another worker may have taken its session over; nothing was written",
                        turn_id)
