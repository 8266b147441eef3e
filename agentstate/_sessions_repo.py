"""Repository of sessions and turns: one function per operation.

"One turn at a time" is the partial unique index turn_one_active; every state
change is one UPDATE whose WHERE clause names the states it may leave, so a
move outside the diagram changes nothing, whoever races.
"""

from __future__ import annotations

import time
from typing import Any

import apsw

from . import _feed, _kv
from ._connection import now_iso
from ._turnstate import LEASED, effective_status
from .errors import InvalidTransition, NotFound, SessionBusy

TURN_COLUMNS = ("id, session_id, n, status, input, request, decision, result, error, "
                "lease_until, created_at, updated_at, lease")


def session_row(c: apsw.Connection, session_id: str, name: str, admin: bool) -> tuple[Any, ...]:
    """The session as this principal may see it; NotFound for others' sessions too."""
    row = c.execute(
        "SELECT id, owner, created_at, metadata FROM session WHERE id = ?", (session_id,)
    ).fetchone()
    if row is None or (not admin and row[1] != name):
        raise NotFound(f"no session {session_id!r}")
    return row


def create(c: apsw.Connection, session_id: str, owner: str, metadata: str) -> tuple[Any, ...]:
    now = now_iso()
    c.execute(
        "INSERT INTO session (id, owner, created_at, metadata) VALUES (?, ?, ?, ?)",
        (session_id, owner, now, metadata),
    )
    _feed.record(c, "session", "create", None, session_id)
    return (session_id, owner, now, metadata)


def sessions(c: apsw.Connection, name: str, admin: bool) -> list[tuple[Any, ...]]:
    if admin:
        return c.execute(
            "SELECT id, owner, created_at, metadata FROM session ORDER BY created_at DESC, id"
        ).fetchall()
    return c.execute(
        "SELECT id, owner, created_at, metadata FROM session WHERE owner = ? "
        "ORDER BY created_at DESC, id",
        (name,),
    ).fetchall()


def delete(c: apsw.Connection, session_id: str) -> None:
    """The session, its turns (cascade) and its session-scope keys, remembering versions."""
    _kv.drop_scope(c, "session", session_id)
    c.execute("DELETE FROM session WHERE id = ?", (session_id,))
    _feed.record(c, "session", "delete", None, session_id)


def idle(c: apsw.Connection, cutoff: str, now: float) -> list[str]:
    """Sessions with no turn started since ``cutoff`` and none queued, running or resuming
    (with a live lease), oldest first."""
    return [r[0] for r in c.execute(
        """SELECT s.id FROM session s
           WHERE coalesce((SELECT max(created_at) FROM turn WHERE session_id = s.id), s.created_at) < ?1
             AND NOT EXISTS (SELECT 1 FROM turn WHERE session_id = s.id
                             AND status IN ('queued', 'running', 'resuming') AND lease_until >= ?2)
           ORDER BY s.created_at, s.id""", (cutoff, now)).fetchall()]


def expire_lapsed(c: apsw.Connection, session_id: str, now: float) -> None:
    for (turn_id,) in c.execute(
        f"""UPDATE turn SET status = 'expired', updated_at = ?
            WHERE session_id = ? AND status IN {LEASED} AND lease_until < ? RETURNING id""",
        (now_iso(), session_id, now),
    ).fetchall():
        _feed.record(c, "session", "expired", None, session_id, turn_id)


def start(
    c: apsw.Connection, turn_id: str, session_id: str, status: str, input_: str | None, lease: float
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
        _feed.record(c, "session", status, None, session_id, turn_id)
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


def turn_row(c: apsw.Connection, turn_id: str) -> tuple[Any, ...] | None:
    return c.execute(f"SELECT {TURN_COLUMNS} FROM turn WHERE id = ?", (turn_id,)).fetchone()


def turns(c: apsw.Connection, session_id: str) -> list[tuple[Any, ...]]:
    return c.execute(
        f"SELECT {TURN_COLUMNS} FROM turn WHERE session_id = ? ORDER BY n DESC", (session_id,)
    ).fetchall()


def move(
    c: apsw.Connection,
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
        _feed.record(c, "session", to, None, row[1], turn_id)
        return row
    cur = turn_row(c, turn_id)
    if cur is None:  # pragma: no cover - the caller checked access first
        raise NotFound(f"no turn {turn_id!r}")
    status = effective_status(cur[3], cur[9], now)
    raise InvalidTransition(f"cannot {what} turn {turn_id!r}: it is {status}")



def active_turn(c: apsw.Connection, session_id: str) -> tuple[Any, ...] | None:
    return c.execute(
        f"SELECT {TURN_COLUMNS} FROM turn WHERE session_id = ? AND status IN ('queued', 'running')",
        (session_id,),
    ).fetchone()
