"""Sessions and turns (SPEC §4): owners, admins, one turn at a time, leases."""

from __future__ import annotations

import builtins
import dataclasses
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pydantic.dataclasses import dataclass

from ._encoding import check_int, check_key, decode, encode, is_key, storable_text
from ._runs import parse_time
from ._scope import Scope
from .errors import InvalidTransition, InvalidValue, NotFound

if TYPE_CHECKING:
    from .backends.base import Ops


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who acts: a name (key rules of SPEC §2) and whether it is an admin.

    A plain dataclass: a bad name must raise InvalidKey, not a pydantic error.
    """

    name: str
    admin: bool = False

    def __post_init__(self) -> None:
        check_key(self.name, "principal name")
        if type(self.admin) is not bool:
            raise InvalidValue(f"admin must be True or False, got {self.admin!r}")


@dataclass(frozen=True)
class SessionInfo:
    """A session: ``owner`` is the creating principal's name."""

    id: str
    owner: str
    created_at: datetime
    metadata: dict[str, Any]


LIVE = ("queued", "running", "held", "decided", "resuming")
FINDABLE = (*LIVE, "expired")


def _iterable(v: Any) -> bool:
    return isinstance(v, (list, tuple, set, frozenset))


def _limit(limit: Any) -> None:
    if limit is not None:
        check_int("limit", limit)


def _principal(p: Any) -> Principal:
    if not isinstance(p, Principal):
        raise InvalidValue(f"expected an agentstate.Principal, got {type(p).__name__}")
    return p


def _json_or_none(v: Any) -> str | None:
    return None if v is None else encode(v)[0]


def _lease(lease: Any) -> float:
    if isinstance(lease, bool) or not isinstance(lease, (int, float)) or not 0 < lease < 1e9:
        raise InvalidValue(f"lease must be a positive number of seconds, got {lease!r}")
    return float(lease)


def _info(row: tuple[Any, ...]) -> SessionInfo:
    return SessionInfo(row[0], row[1], parse_time(row[2]), decode(row[3]))


class Turn:
    """One turn of a session. Its methods move it along the diagram of SPEC §4."""

    def __init__(self, sessions: Sessions, principal: Principal, row: tuple[Any, ...]) -> None:
        self._sessions = sessions
        self._principal = principal
        self._load(row)

    def _load(self, row: tuple[Any, ...]) -> None:
        (self.id, self.session_id, self.n, status, input_, request, decision, result,
         self.error, self.lease_until, created, updated, self.lease) = row
        self.status = status  # as it reads by the store's clock: the store computed it
        self.input = None if input_ is None else decode(input_)
        self.request = None if request is None else decode(request)
        self.decision = None if decision is None else decode(decision)
        self.result = None if result is None else decode(result)
        self.created_at, self.updated_at = parse_time(created), parse_time(updated)

    def __repr__(self) -> str:
        return f"<Turn {self.id} of {self.session_id}: {self.status}>"

    def _move(self, from_states: tuple[str, ...], to: str | None, what: str,
              lease: float | None = None, **sets: Any) -> Turn:
        row = self._sessions._move(self.id, self._principal, from_states, to, what, lease, sets)
        self._load(row)
        return self

    def refresh(self) -> Turn:
        """Re-read the turn from the database."""
        self._load(self._sessions._turn_row(self.id, self._principal))
        return self

    def start(self, lease: float = 60.0) -> Turn:
        """queued -> running, with a new lease."""
        return self._move(("queued",), "running", "start", _lease(lease))

    def heartbeat(self, lease: float | None = None) -> Turn:
        """Renew the lease of a running (or resuming) turn; by its last length if None."""
        lease = _lease(self.lease or 60.0 if lease is None else lease)
        return self._move(("running", "resuming"), None, "heartbeat", lease)

    def hold(self, request: Any = None) -> Turn:
        """running -> held: waits for a decision and no longer blocks the session."""
        return self._move(("running",), "held", "hold", None, request=_json_or_none(request))

    def finish(self, result: Any = None) -> Turn:
        """running or resuming -> finished."""
        return self._move(("running", "resuming"), "finished", "finish", None,
                          result=_json_or_none(result))

    def fail(self, error: Any) -> Turn:
        """running or resuming -> failed, with the error's text (stored escaped if need be)."""
        return self._move(("running", "resuming"), "failed", "fail", None, error=storable_text(error))


class Sessions:
    """``db.sessions``: sessions owned by principals, and their turns."""

    def __init__(self, ops: Ops) -> None:
        self._ops = ops

    # -- sessions ------------------------------------------------------------

    def create(self, principal: Principal, *, metadata: dict[str, Any] | None = None) -> SessionInfo:
        """A new session owned by ``principal``."""
        p = _principal(principal)
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidValue("metadata must be a dict")
        meta = encode(metadata or {})[0]
        return _info(self._ops.session_create(p.name, meta))

    def fork(self, session_id: str, principal: Principal, *, at: int | None = None,
             metadata: dict[str, Any] | None = None) -> SessionInfo:
        """A new session owned by ``principal`` whose state is the session's right after
        change ``at`` (default: now), with no turns (SPEC §17); ``metadata`` defaults to the
        original's. Cheap whatever the session holds: its lists are shared until written,
        and a write to either session never changes the other.

        :raises NotFound: unknown, or not this principal's (unless admin).
        :raises CursorExpired: the history kept does not reach back to ``at``.
        :raises InvalidValue: ``at`` is past the newest change.
        """
        p = self._check(session_id, principal)
        if at is not None:
            check_int("at", at)
        if metadata is not None and not isinstance(metadata, dict):
            raise InvalidValue("metadata must be a dict")
        meta = None if metadata is None else encode(metadata)[0]
        return _info(self._ops.session_fork(session_id, p.name, p.admin, at, meta))

    def get(self, session_id: str, principal: Principal) -> SessionInfo:
        """:raises NotFound: unknown, or not this principal's (unless admin)."""
        p = self._check(session_id, principal)
        return _info(self._ops.session_get(session_id, p.name, p.admin))

    def list(self, principal: Principal, *, after: str | None = None,
             limit: int | None = None) -> list[SessionInfo]:
        """The principal's own sessions (all of them for an admin), newest first.

        Paged: ``after`` (the id of a page's last session) returns those listed after
        it, ``limit`` caps the count. :raises NotFound: ``after`` is not a visible session.
        """
        p = _principal(principal)
        if after is not None:
            self._check(after, p)
        _limit(limit)
        return [_info(r) for r in self._ops.session_list(p.name, p.admin, after, limit)]

    def delete(self, session_id: str, principal: Principal) -> None:
        """Remove the session, its turns and its session-scope state, in one transaction."""
        p = self._check(session_id, principal)
        self._ops.session_delete(session_id, p.name, p.admin)

    def state(self, session_id: str, principal: Principal) -> Scope:
        """The scope ``session:{id}``, after the access check."""
        self.get(session_id, principal)
        return Scope(self._ops, "session", session_id)

    def prune(self, principal: Principal, *, idle_for: float) -> builtins.list[str]:
        """Admins only: delete the sessions with no turn started for ``idle_for``
        seconds and none queued or running, with their turns and session-scope
        state; return their ids. :raises Forbidden: not an admin."""
        p = _principal(principal)
        if isinstance(idle_for, bool) or not isinstance(idle_for, (int, float)) \
                or not 0 <= idle_for < 1e11:
            raise InvalidValue(f"idle_for must be a number of seconds >= 0, got {idle_for!r}")
        return self._ops.session_prune(p.name, p.admin, idle_for)

    # -- turns ---------------------------------------------------------------

    def start_turn(self, session_id: str, principal: Principal, *, input: Any = None,
                   lease: float = 60.0, queued: bool = False) -> Turn:
        """A new running (or queued) turn.

        :raises SessionBusy: another turn of the session is queued or running.
        :raises NotFound: no such session for this principal.
        """
        p = self._check(session_id, principal)
        data = _json_or_none(input)
        lease = _lease(lease)
        row = self._ops.turn_start(session_id, p.name, p.admin, "queued" if queued else "running",
                                   data, lease)
        return Turn(self, p, row)

    @contextmanager
    def turn(self, session_id: str, principal: Principal, *, input: Any = None,
             lease: float = 60.0) -> Iterator[Turn]:
        """A running turn: finished on normal exit, failed on an exception (which propagates)."""
        t = self.start_turn(session_id, principal, input=input, lease=lease)
        try:
            yield t
        except BaseException as e:
            # The caller's exception is what propagates, whatever recording it meets
            # (the session deleted meanwhile, the database closed, ...).
            try:
                if t.refresh().status in ("running", "resuming"):
                    t.fail(f"{type(e).__name__}: {e}")
            except Exception as inner:
                e.add_note(f"agentstate: turn {t.id} could not be marked failed: "
                           f"{type(inner).__name__}: {inner}")
            raise
        status = t.refresh().status
        if status in ("running", "resuming"):
            t.finish()
        elif status == "expired":
            # The lease lapsed while the block ran: another turn may have run
            # meanwhile, so this one did not finish as its caller thinks.
            raise InvalidTransition(
                f"turn {t.id} expired before its block ended (its lease of {t.lease:g} s lapsed; "
                "call turn.heartbeat() in long blocks): it is not finished"
            )

    def get_turn(self, turn_id: str, principal: Principal) -> Turn:
        p = _principal(principal)
        return Turn(self, p, self._turn_row(turn_id, p))

    def turns(self, session_id: str, principal: Principal, *, after: str | None = None,
              limit: int | None = None) -> builtins.list[Turn]:
        """The session's turns, newest first.

        Paged: ``after`` (the id of a page's last turn) returns the older ones, ``limit``
        caps the count. :raises NotFound: ``after`` is not a turn of this session.
        """
        p = self._check(session_id, principal)
        if after is not None and (type(after) is not str or not is_key(after)):
            raise NotFound(f"no turn {after!r} in session {session_id!r} to list after")
        _limit(limit)
        return [Turn(self, p, r) for r in self._ops.turn_list(session_id, p.name, p.admin, after, limit)]

    def turns_by_status(self, principal: Principal, status: str | Iterable[str] = FINDABLE, *,
                        after: str | None = None, limit: int | None = None) -> builtins.list[Turn]:
        """Turns that block, may still act or lost their lease, across the principal's
        sessions (an admin's: all), newest first: ``status`` is one or several of
        ``queued``, ``running``, ``held``, ``decided``, ``resuming`` (with a lease that
        holds) and ``expired`` (a lease that lapsed, or a turn marked expired); all of
        them by default. Finished and failed turns are listed per session (``turns``).

        Paged as ``turns``: a turn keeps its place (the order is by creation), though
        one that changes status meanwhile may leave or join the list.
        :raises InvalidValue: an unknown or unlisted status.
        """
        p = _principal(principal)
        wanted = (status,) if isinstance(status, str) else tuple(status) if _iterable(status) else None
        if not wanted or any(type(s) is not str or s not in FINDABLE for s in wanted):
            raise InvalidValue(f"status must be one of {', '.join(FINDABLE)} (or several), got {status!r}")
        if after is not None and (type(after) is not str or not is_key(after)):
            raise NotFound(f"no turn {after!r} to list after")
        _limit(limit)
        live = tuple(s for s in LIVE if s in wanted)
        rows = self._ops.turn_find(p.name, p.admin, live, "expired" in wanted, after, limit)
        return [Turn(self, p, r) for r in rows]

    def decide(self, turn_id: str, principal: Principal, decision: Any) -> Turn:
        """held -> decided, recording the decision."""
        p = _principal(principal)
        row = self._move(turn_id, p, ("held",), "decided", "decide", None,
                         {"decision": _json_or_none(decision)})
        return Turn(self, p, row)

    def resume(self, turn_id: str, principal: Principal, *, lease: float = 60.0) -> Turn:
        """decided -> resuming; allowed while a newer turn runs."""
        p = _principal(principal)
        return Turn(self, p, self._move(turn_id, p, ("decided",), "resuming", "resume",
                                        _lease(lease), {}))

    def release(self, session_id: str, principal: Principal) -> Turn:
        """Admins only: end the session's active (queued or running) turn as failed.

        :raises Forbidden: not an admin. :raises InvalidTransition: no active turn.
        """
        p = self._check(session_id, principal)
        return Turn(self, p, self._ops.session_release(session_id, p.name, p.admin))

    # -- helpers -------------------------------------------------------------

    def _check(self, session_id: Any, principal: Any) -> Principal:
        p = _principal(principal)
        if type(session_id) is not str or not is_key(session_id):
            raise NotFound(f"no session {session_id!r}")  # no such id can exist
        return p

    def _turn_row(self, turn_id: Any, p: Principal) -> tuple[Any, ...]:
        if type(turn_id) is not str or not is_key(turn_id):
            raise NotFound(f"no turn {turn_id!r}")  # no such id can exist
        return self._ops.turn_get(turn_id, p.name, p.admin)

    def _move(self, turn_id: str, p: Principal, from_states: tuple[str, ...], to: str | None,
              what: str, lease: float | None, sets: dict[str, Any]) -> tuple[Any, ...]:
        """One state change in one write transaction; ``to`` None keeps the status (heartbeat)."""
        if type(turn_id) is not str or not is_key(turn_id):
            raise NotFound(f"no turn {turn_id!r}")
        return self._ops.turn_move(turn_id, p.name, p.admin, from_states, to, what, lease, sets)

