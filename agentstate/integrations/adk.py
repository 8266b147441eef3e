"""Google ADK sessions in agentstate: ``pip install 'agentstate-db[adk]'``.

    from agentstate.integrations.adk import AgentStateSessionService
    runner = Runner(agent=agent, app_name="app",
                    session_service=AgentStateSessionService("sessions.db"))

``AgentStateSessionService`` is an ADK ``BaseSessionService``: it stands where
``SqliteSessionService("sessions.db")`` or ``DatabaseSessionService(url)`` stood,
and many processes may share the file. ADK's memory service beside it, in the same
store, is ``agentstate.integrations.adk_memory.AgentStateMemoryService``.

Where ADK's things are kept (all plain rows, readable with ``sqlite3``):

- a session: the key ``head`` of the scope ``session:adk:APP:USER:SESSION``
  holds its own state, its times, how many events it has and which run holds
  them. Its events are the entries of that run (``adk-<uuid>``), one entry per
  event (``{"seq", "ts", "id", "event": <the event's JSON text>}``), so
  appending an event costs the same at 10 and at 10,000 events. The run is
  pinned (``runs.pin``): ``runs.prune`` leaves it; ``delete_session`` removes it.
- ``app:`` state: the key ``state`` of ``app:adk:APP``; ``user:`` state: the
  key ``state`` of ``user:adk:APP:USER``; ``temp:`` state is never stored.
- for ``list_sessions``: a key ``u:USER`` per user in the app scope and
  ``s:SESSION`` per session in the user scope.

Ids are escaped into scope ids and keys (every character outside
``A-Za-z0-9.-`` becomes ``_hh`` per UTF-8 byte); one that would pass 200
characters is named by a SHA-256 instead (``adk.h:...``, ``uh:...``, ``sh:...``);
the real ids are in the values.

Every write is one transaction (all of it or nothing, whatever interrupts it),
and writers to one file queue for its write lock, across processes. So an
event and its state delta are stored together, ``app:`` and ``user:`` deltas
from many sessions and processes are all kept, and ``append_event`` refuses a
session object that is no longer the stored one (``StaleSessionError``), as
ADK's own services do: the revision is the version of ``head``, carried in the
session's ``_storage_update_marker``. A read (``get_session``) runs in one
``db.snapshot()``: the head, its events and the app's and user's state are
of one moment, and its events are parsed in one pydantic call.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import time
import uuid
from typing import Any, NamedTuple

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.sessions.base_session_service import (BaseSessionService, GetSessionConfig,
                                                          ListSessionsResponse)
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "agentstate.integrations.adk needs Google ADK: pip install 'agentstate-db[adk]'") from e

from pydantic import BaseModel, ConfigDict, Json, TypeAdapter
from pydantic_core import PydanticSerializationError, to_jsonable_python

import agentstate

__all__ = ["AgentStateSessionService"]

logger = logging.getLogger(__name__)

# The words of ADK's own services, so callers matching on them keep working.
STALE_MESSAGE = ("The session has been modified in storage since it was loaded. "
                 "Please reload the session before appending more events.")
MARKER = "agentstate:"  # + the head's version: the session's storage revision
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]")
_MAX_NAME = 200  # SPEC §2: keys and scope ids


def _escape(text: str) -> str:
    """Reversible and prefix-free: ``_`` only ever starts a ``_hh`` escape."""
    return _UNSAFE.sub(
        lambda m: "".join(f"_{b:02x}" for b in m.group().encode("utf-8", "surrogatepass")), text)


def _name(readable: str, hashed: str, *parts: str) -> str:
    """``readable`` + the escaped parts joined by ``:``; past 200 characters,
    ``hashed`` + a SHA-256 of the parts (the two prefixes never start alike)."""
    name = readable + ":".join(_escape(p) for p in parts)
    if len(name) <= _MAX_NAME:
        return name
    return hashed + hashlib.sha256(json.dumps(parts).encode()).hexdigest()


class _Ref(NamedTuple):
    """What append_event needs of the caller's session, read on the event loop."""

    app_name: str
    user_id: str
    id: str
    revision: int | None  # our marker, None for a session that carries none
    last_update_time: float
    last_event_id: str | None


def _revision(session: Session) -> int | None:
    marker = session._storage_update_marker
    if isinstance(marker, str) and marker.startswith(MARKER):
        try:
            return int(marker[len(MARKER):])
        except ValueError:
            return None
    return None  # none, or another service's: judged by time, as ADK does


def _split(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A state or a delta as JSON-safe app / user / session parts; temp: dropped."""
    parts: dict[str, dict[str, Any]] = {"app": {}, "user": {}, "session": {}}
    for key, value in state.items():
        if key.startswith(State.APP_PREFIX):
            parts["app"][key[len(State.APP_PREFIX):]] = value
        elif key.startswith(State.USER_PREFIX):
            parts["user"][key[len(State.USER_PREFIX):]] = value
        elif not key.startswith(State.TEMP_PREFIX):
            parts["session"][key] = value
    # NaN and infinities become null, as in the event's own JSON; what has no
    # JSON form is kept as its text, with a warning, as ADK's services do.
    try:
        return to_jsonable_python(parts, inf_nan_mode="null")
    except PydanticSerializationError:
        logger.warning("state values that are not JSON-serializable are stored as their text",
                       exc_info=True)
        return to_jsonable_python(parts, inf_nan_mode="null", serialize_unknown=True)


def _to_session(head: dict[str, Any], version: int, app_state: dict[str, Any],
                user_state: dict[str, Any], events: list[Event]) -> Session:
    """The ADK session: its own state with the app's and user's merged in (by prefix)."""
    state = dict(head["state"])
    state.update((State.APP_PREFIX + k, v) for k, v in app_state.items())
    state.update((State.USER_PREFIX + k, v) for k, v in user_state.items())
    s = Session(id=head["id"], app_name=head["app_name"], user_id=head["user_id"], state=state,
                events=events, last_update_time=head["update_time"])
    s._storage_update_marker = MARKER + str(version)
    return s


class _Entry(BaseModel):
    """One stored entry of a session's run, parsed by pydantic alone: its time and its
    event (kept as the event's JSON text, which pydantic parses in the same pass)."""

    model_config = ConfigDict(extra="ignore")
    ts: float
    event: Json[Event]


_ENTRIES = TypeAdapter(list[_Entry])


def _parse(raw: list[str]) -> list[_Entry]:
    """Entries as their stored JSON texts (``runs.entries(raw=True)``), parsed in one
    call: no json.loads of each entry, no call into pydantic per event. Parsing the
    events (ADK's validators) is most of a long session's read time, and costs the
    same either way (benchmarks/ADAPTER-ADK.md, the pieces)."""
    return _ENTRIES.validate_json("[" + ",".join(raw) + "]") if raw else []


def _stale(ref: _Ref, head: dict[str, Any], version: int) -> bool:
    if ref.revision is not None:
        return ref.revision != version
    # A session without our marker (built by hand, or from another service):
    # stale if storage moved past it, unless it holds the last stored event
    # (the fallback of ADK's DatabaseSessionService).
    return head["update_time"] > ref.last_update_time and ref.last_event_id != head["last_event_id"]


class AgentStateSessionService(BaseSessionService):
    """ADK sessions, their events and app/user/session state in one agentstate file.

    ``db``: an open ``agentstate.Database`` (left open by ``close()``), or a
    path, which is opened here and closed by ``close()``. Every method runs
    its SQLite work in a worker thread: the event loop never waits on a lock
    or an fsync, and nothing here is bound to an event loop.

    Errors of every method: ``agentstate.Busy`` when the write lock stays
    taken longer than the database's ``busy_timeout``; ``agentstate.Closed``
    after ``db.close()``; ``agentstate.StorageError`` on an I/O failure.
    """

    def __init__(self, db: agentstate.Database | str | os.PathLike[str]) -> None:
        self._owns_db = not isinstance(db, agentstate.Database)
        self._db = db if isinstance(db, agentstate.Database) else agentstate.open(db)

    @property
    def db(self) -> agentstate.Database:
        return self._db

    # Where things are: see the module docstring.
    def _app(self, app_name: str) -> agentstate.Scope:
        return self._db.scope("app", _name("adk:", "adk.h:", app_name))

    def _user(self, app_name: str, user_id: str) -> agentstate.Scope:
        return self._db.scope("user", _name("adk:", "adk.h:", app_name, user_id))

    def _session(self, app_name: str, user_id: str, session_id: str) -> agentstate.Scope:
        return self._db.scope("session", _name("adk:", "adk.h:", app_name, user_id, session_id))

    # -- the ADK interface: each call is one hop to a worker thread --------------

    async def create_session(self, *, app_name: str, user_id: str,
                             state: dict[str, Any] | None = None,
                             session_id: str | None = None) -> Session:
        """A new session; ``app:`` and ``user:`` keys of ``state`` go to the app and user.

        The id is stripped of surrounding blanks; none (or a blank one) gets a uuid4.

        :raises AlreadyExistsError: this app and user already have a session with that id.
        :raises agentstate.InvalidValue, agentstate.TooLarge: a state the store refuses
            (a string with NUL, an integer past 64 bits, over 1 MiB); nothing is written.
        """
        return await asyncio.to_thread(self._create, app_name, user_id, state or {}, session_id)

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> Session | None:
        """The session with its events (oldest first) and merged state; None if absent.

        ``config.num_recent_events``: only the last N events; ``after_timestamp``:
        only events at or after that time. Events read back in timestamp order,
        ties in the order they were appended. Reading the last N costs N, not
        the length of the history.
        """
        return await asyncio.to_thread(self._get, app_name, user_id, session_id, config)

    async def list_sessions(self, *, app_name: str,
                            user_id: str | None = None) -> ListSessionsResponse:
        """The sessions of a user (all users: ``user_id=None``), without their events,
        least recently updated first."""
        return await asyncio.to_thread(self._list, app_name, user_id)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Removes the session, its events and its state; nothing if it is absent.
        ``app:`` and ``user:`` state stay."""
        await asyncio.to_thread(self._delete, app_name, user_id, session_id)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state without the ``user:`` prefix; ``{}`` when there is none."""
        return await asyncio.to_thread(self._user(app_name, user_id).get, "state", {})

    async def append_event(self, session: Session, event: Event) -> Event:
        """Stores the event with its state delta in one transaction, then adds both
        to ``session``. A partial event is returned untouched; ``temp:`` keys reach
        ``session.state`` but are not stored.

        The same event appended again (a retry after a cancellation or a timeout)
        is stored once: if it is the last stored event and ``session`` was current
        just before or just after it, it is not written again.

        :raises StaleSessionError: another writer appended to this session since
            ``session`` was read: reload it with ``get_session``. Nothing is written.
        :raises SessionNotFoundError: the session does not exist (any more).
        :raises agentstate.InvalidValue, agentstate.TooLarge: a delta the store
            refuses (see ``create_session``; an event is at most 16 MiB of JSON).
        """
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        ref = _Ref(session.app_name, session.user_id, session.id, _revision(session),
                   session.last_update_time, session.events[-1].id if session.events else None)
        outcome, version, update_time = await asyncio.to_thread(self._append, ref, event)
        if outcome == "held":  # the session has it already
            return event
        session.last_update_time = update_time
        session._storage_update_marker = MARKER + str(version)
        return self._commit_event_to_session(session, event)

    async def close(self) -> None:
        """Closes the database if this service opened it (given a path)."""
        if self._owns_db:
            self._db.close()

    async def __aenter__(self) -> AgentStateSessionService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the work, in a worker thread ---------------------------------------------

    def _create(self, app_name: str, user_id: str, state: dict[str, Any],
                session_id: str | None) -> Session:
        session_id = (session_id.strip() if session_id else "") or str(uuid.uuid4())
        parts = _split(state)
        app, user = self._app(app_name), self._user(app_name, user_id)
        now = time.time()
        run_id = "adk-" + uuid.uuid4().hex  # a new run per session, never reused
        head: dict[str, Any] = {
            "app_name": app_name, "user_id": user_id, "id": session_id,
            "run": run_id,
            "state": parts["session"],
            "create_time": now, "update_time": now,
            "events": 0, "last_event_id": None,
            "prev": 0,  # the head's version before the last append
            "max_ts": None, "in_time_order": True,  # no event went back in time
            "pinned": True,  # its run is kept out of runs.prune(): only delete_session ends it
        }
        with self._db.transaction():
            try:
                version = self._session(app_name, user_id, session_id).put(
                    "head", head, if_version=0)
            except agentstate.VersionConflict:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.") from None
            if app.get(_user_key(user_id)) is None:
                app.put(_user_key(user_id), user_id)
            user.put(_session_key(session_id), session_id)
            app_state, user_state = _merge(app, parts["app"]), _merge(user, parts["user"])
            self._db.runs.write(run_id, [], {
                "task": f"ADK session {app_name}/{user_id}/{session_id}",
                "adk": {"app_name": app_name, "user_id": user_id, "session_id": session_id},
            }, create=True)
            self._db.runs.pin(run_id)
        return _to_session(head, version, app_state, user_state, [])

    def _head(self, app_name: str, user_id: str,
              session_id: str) -> tuple[dict[str, Any] | None, int]:
        """The session's head and its version (the revision); (None, 0) if absent."""
        head, version = self._session(app_name, user_id, session_id).get_versioned("head")
        if head is None or (head["app_name"], head["user_id"], head["id"]) != (
                app_name, user_id, session_id):  # absent, or another behind one hashed name
            return None, 0
        return head, version

    def _get(self, app_name: str, user_id: str, session_id: str,
             config: GetSessionConfig | None) -> Session | None:
        session_id = session_id.strip() if session_id else session_id
        with self._db.snapshot():  # the head, its events and the app's and user's state agree
            head, version = self._head(app_name, user_id, session_id)
            if head is None:
                return None
            entries = self._entries(head, config)
            app_state = self._app(app_name).get("state", {})
            user_state = self._user(app_name, user_id).get("state", {})
        return _to_session(head, version, app_state, user_state, [e.event for e in entries])

    def _entries(self, head: dict[str, Any], config: GetSessionConfig | None) -> list[_Entry]:
        """The stored entries ``config`` asks for (inside the read's snapshot, so they
        are the head's: its count bounds what is read)."""
        recent = config.num_recent_events if config else None
        after = config.after_timestamp if config else None
        n, run = head["events"], head["run"]

        def read(since: int, count: int) -> list[_Entry]:
            return _parse(self._db.runs.entries(run, since, count, raw=True))

        if n == 0 or recent == 0:
            return []
        if not head["in_time_order"]:  # rare: read all and order them as ADK does
            entries = sorted(read(0, n), key=lambda e: e.ts)  # stable: ties in append order
            if after is not None:
                entries = [e for e in entries if e.ts >= after]
            return entries if recent is None else entries[-recent:]
        low = 0 if recent is None else max(0, n - recent)
        if after is None:
            return read(low, n - low)
        # Walk back from the end in growing chunks until an event is too old.
        chunks, high, size = [], n, 32
        while high > low:
            start = max(low, high - size)
            chunk = read(start, high - start)
            chunks.append(chunk)
            if not chunk or chunk[0].ts < after:
                break
            high, size = start, size * 2
        return [e for chunk in reversed(chunks) for e in chunk if e.ts >= after]

    def _list(self, app_name: str, user_id: str | None) -> ListSessionsResponse:
        app = self._app(app_name)
        if user_id is None:
            users = [u for u in map(app.get, app.list("u:") + app.list("uh:")) if u is not None]
        else:
            users = [user_id]
        app_state = app.get("state", {})
        sessions = []
        for uid in users:
            user = self._user(app_name, uid)
            user_state = user.get("state", {})
            for session_id in map(user.get, user.list("s:") + user.list("sh:")):
                head, version = (None, 0) if session_id is None else self._head(
                    app_name, uid, session_id)  # None: deleted meanwhile
                if head is not None:
                    sessions.append(_to_session(head, version, app_state, user_state, []))
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    def _delete(self, app_name: str, user_id: str, session_id: str) -> None:
        session_id = session_id.strip() if session_id else session_id
        with self._db.transaction():
            head, _ = self._head(app_name, user_id, session_id)
            if head is None:
                return
            self._session(app_name, user_id, session_id).delete("head")
            self._user(app_name, user_id).delete(_session_key(session_id))
            self._db.runs.delete(head["run"])

    def _append(self, ref: _Ref, event: Event) -> tuple[str, int, float]:
        """("stored" | "redelivered" | "held", the head's version, its update time)."""
        text = event.model_dump_json(exclude_none=True)
        delta = event.actions.state_delta if event.actions else None
        parts = _split(delta) if delta else None
        with self._db.transaction():
            head, version = self._head(ref.app_name, ref.user_id, ref.id)
            if head is None:
                raise SessionNotFoundError(f"Session {ref.id} not found.")
            if (head["last_event_id"] == event.id and ref.revision in (version, head["prev"])
                    and self._last_event(head) == event):
                # Stored already, by an append whose caller never heard back, or
                # by this very call made twice.
                return ("held" if ref.revision == version else "redelivered",
                        version, head["update_time"])
            if _stale(ref, head, version):
                raise StaleSessionError(STALE_MESSAGE)
            n, ts = head["events"], event.timestamp
            if parts:
                head["state"].update(parts["session"])
                _merge(self._app(ref.app_name), parts["app"])
                _merge(self._user(ref.app_name, ref.user_id), parts["user"])
            head.update(
                update_time=ts, events=n + 1, last_event_id=event.id, prev=version,
                in_time_order=head["in_time_order"] and (head["max_ts"] is None
                                                         or ts >= head["max_ts"]),
                max_ts=ts if head["max_ts"] is None else max(ts, head["max_ts"]),
            )
            if not head.get("pinned"):  # a session made before runs were pinned
                self._db.runs.pin(head["run"])
                head["pinned"] = True
            version = self._session(ref.app_name, ref.user_id, ref.id).put(
                "head", head, if_version=version)
            self._db.runs.write(head["run"], [{"seq": n, "ts": ts, "id": event.id, "event": text}],
                                None)
        return "stored", version, ts

    def _last_event(self, head: dict[str, Any]) -> Event | None:
        last = _parse(self._db.runs.entries(head["run"], head["events"] - 1, 1, raw=True))
        return last[0].event if last else None


def _user_key(user_id: str) -> str:
    """In the app scope: this user has (or had) sessions here."""
    return _name("u:", "uh:", user_id)


def _session_key(session_id: str) -> str:
    """In the user scope: this session exists."""
    return _name("s:", "sh:", session_id)


def _merge(scope: agentstate.Scope, delta: dict[str, Any]) -> dict[str, Any]:
    """The scope's ``state`` with ``delta`` laid over it (dict.update: a value
    replaces, None is stored). Inside the caller's transaction, so no
    concurrent delta is lost."""
    state = scope.get("state", {})
    if delta:
        state.update(delta)
        scope.put("state", state)
    return state
