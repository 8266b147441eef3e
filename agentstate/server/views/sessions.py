"""Sessions and turns (SPEC §4): a principal sees only its own; the store checks each call."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.responses import Response

import agentstate

from .. import _http as h
from .._api import API, Call, iso, next_after, page
from .._models import (DecideBody, FailBody, FinishBody, HoldBody, LeaseBody, PruneSessionsBody,
                       SessionBody, TurnBody)

ACTIONS: dict[str, type[BaseModel]] = {"start": LeaseBody, "heartbeat": LeaseBody, "hold": HoldBody, "decide": DecideBody,
           "resume": LeaseBody, "finish": FinishBody, "fail": FailBody}


def _session(s: agentstate.SessionInfo) -> dict[str, Any]:
    return {"id": s.id, "owner": s.owner, "created_at": iso(s.created_at), "metadata": s.metadata}


def _turn(t: agentstate.Turn) -> dict[str, Any]:
    return {"id": t.id, "session_id": t.session_id, "n": t.n, "status": t.status, "input": t.input,
            "request": t.request, "decision": t.decision, "result": t.result, "error": t.error,
            "lease": t.lease, "lease_until": t.lease_until, "created_at": iso(t.created_at),
            "updated_at": iso(t.updated_at)}


async def sessions_create(api: API, c: Call) -> Response:
    b = await c.json(SessionBody)
    s = await h.blocking(c.db.sessions.create, c.p, metadata=b.metadata)
    return await c.answer(_session(s), 201)


async def sessions_list(api: API, c: Call) -> Response:
    after, limit = page(c)
    found = await h.blocking(api.db.sessions.list, c.p, after=after, limit=limit)
    return await c.answer({"sessions": [_session(s) for s in found], "next": next_after(found, limit)})


async def session_get(api: API, c: Call) -> Response:
    return await c.answer(_session(await h.blocking(api.db.sessions.get, c.params["session_id"], c.p)))


async def session_delete(api: API, c: Call) -> Response:
    await h.blocking(c.db.sessions.delete, c.params["session_id"], c.p)
    return h.JSON({"deleted": True})


async def sessions_prune(api: API, c: Call) -> Response:
    b = await c.json(PruneSessionsBody)
    return h.JSON({"sessions": await h.blocking(c.db.sessions.prune, c.p, idle_for=b.idle_for)})


async def session_release(api: API, c: Call) -> Response:
    t = await h.blocking(c.db.sessions.release, c.params["session_id"], c.p)
    return await c.answer(_turn(t))


async def turns_list(api: API, c: Call) -> Response:
    after, limit = page(c)
    turns = await h.blocking(api.db.sessions.turns, c.params["session_id"], c.p, after=after,
                             limit=limit)
    return await c.answer({"turns": [_turn(t) for t in turns], "next": next_after(turns, limit)})


async def turns_by_status(api: API, c: Call) -> Response:
    after, limit = page(c)
    given = ",".join(c.request.query_params.getlist("status"))  # ?status=a,b or ?status=a&status=b
    status = given.split(",") if given else agentstate._sessions.FINDABLE
    turns = await h.blocking(api.db.sessions.turns_by_status, c.p, status, after=after, limit=limit)
    return await c.answer({"turns": [_turn(t) for t in turns], "next": next_after(turns, limit)})


async def turn_start(api: API, c: Call) -> Response:
    b = await c.json(TurnBody)
    t = await h.blocking(c.db.sessions.start_turn, c.params["session_id"], c.p, input=b.input,
                         lease=b.lease, queued=b.queued)
    return await c.answer(_turn(t), 201)


async def turn_get(api: API, c: Call) -> Response:
    return await c.answer(_turn(await h.blocking(api.db.sessions.get_turn, c.params["turn_id"], c.p)))


async def turn_action(api: API, c: Call) -> Response:
    turn_id, action, p = c.params["turn_id"], c.params["action"], c.p
    sessions = c.db.sessions
    model = ACTIONS.get(action)
    if model is None:  # no such route: not an unknown turn
        raise HTTPException(404, f"no turn action {action!r} (start, heartbeat, hold, decide, "
                                 "resume, finish, fail)")
    b = await c.json(model)

    def act() -> agentstate.Turn:
        if action == "decide":
            return sessions.decide(turn_id, p, b.decision)
        if action == "resume":
            return sessions.resume(turn_id, p, lease=b.lease if b.lease is not None else 60.0)
        t = sessions.get_turn(turn_id, p)
        if action == "start":
            return t.start(b.lease if b.lease is not None else 60.0)
        if action == "heartbeat":
            return t.heartbeat(b.lease)
        if action == "hold":
            return t.hold(b.request)
        if action == "finish":
            return t.finish(b.result)
        return t.fail(b.error)

    return await c.answer(_turn(await h.blocking(act)))
