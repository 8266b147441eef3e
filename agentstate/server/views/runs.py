"""Runs (SPEC §3): history entries and snapshots. Runs have no owner: any token reads and
writes them; pruning (which may delete every run) is for admins, as for sessions."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response

import agentstate

from .. import _http as h
from .._api import API, Call, iso, next_after, page
from .._models import ForkBody, PruneRunsBody, TrimBody, WriteBody


def _run_id(run_id: str) -> str:
    from agentstate._encoding import check_key

    return check_key(run_id, "run id")


def _summary(r: agentstate.SavedState) -> dict[str, Any]:
    return {"id": r.id, "task": r.task, "turn": r.turn, "stopped_by": r.stopped_by,
            "finished": r.finished, "created_at": iso(r.created_at), "updated_at": iso(r.updated_at)}


async def runs_list(api: API, c: Call) -> Response:
    after, limit = page(c)
    runs = await h.blocking(api.db.runs.list, after=after, limit=limit)
    return await c.answer({"runs": [_summary(r) for r in runs], "next": next_after(runs, limit)})


async def run_get(api: API, c: Call) -> Response:
    run_id = c.params["run_id"]

    def read() -> bytes:
        # The backend's own read (the seam's run_read): a remote load() checks the
        # history against its recorded bounds and format as a local one does.
        got = api.db._ops.run_read(_run_id(run_id))
        if got is None:
            raise agentstate.RunNotFound(f"no run {run_id!r}")
        (snapshot, next_seq, fmt, first, *_), rows = got
        try:
            entries = [json.loads(text) for _, text in rows]
            snap = None if snapshot is None else json.loads(snapshot)
        except ValueError as e:
            raise agentstate.Damaged(f"run {run_id!r}: a stored entry or the snapshot is not "
                                     f"JSON: {e}") from None
        return h.dumps({"id": run_id, "snapshot": snap, "entries": entries, "first_seq": first,
                        "next_seq": next_seq, "format": fmt})

    return Response(await h.blocking(read), media_type="application/json")


async def run_head(api: API, c: Call) -> Response:
    head = await h.blocking(api.db.runs.head, c.params["run_id"])
    if head is None:
        raise agentstate.RunNotFound(f"no run {c.params['run_id']!r}")
    return await c.answer({"id": head.id, "snapshot": head.snapshot, "first_seq": head.first_seq,
                           "next_seq": head.next_seq, "format": head.format,
                           "created_at": iso(head.created_at), "updated_at": iso(head.updated_at)})


async def run_delete(api: API, c: Call) -> Response:
    return h.JSON({"deleted": await h.blocking(api.db.runs.delete, c.params["run_id"])})


async def run_write(api: API, c: Call) -> Response:
    b = await c.json(WriteBody)
    await h.blocking(api.db.runs.write, c.params["run_id"], b.entries, b.snapshot, create=b.create)
    return h.JSON({"written": True})


async def run_entries(api: API, c: Call) -> Response:
    entries = await h.blocking(api.db.runs.entries, c.params["run_id"],
                               h.query_int(c.request, "since", 0), h.query_int(c.request, "limit"))
    return await c.answer({"entries": entries})


async def run_tail(api: API, c: Call) -> Response:
    n = h.query_int(c.request, "n", 20)
    return await c.answer({"entries": await h.blocking(api.db.runs.tail, c.params["run_id"], n)})


async def run_load(api: API, c: Call) -> Response:
    rec = await h.blocking(api.db.runs.load, c.params["run_id"])
    return await c.answer({"entries": rec.entries, "snapshot": rec.snapshot})


async def run_fork(api: API, c: Call) -> Response:
    b = await c.json(ForkBody)
    await h.blocking(api.db.runs.fork, c.params["run_id"], b.new_id, upto=b.upto)
    return h.JSON({"id": b.new_id})


async def run_trim(api: API, c: Call) -> Response:
    b = await c.json(TrimBody)
    return h.JSON({"removed": await h.blocking(api.db.runs.trim, c.params["run_id"], before=b.before)})


async def runs_prune(api: API, c: Call) -> Response:
    b = await c.json(PruneRunsBody)
    ids = await h.blocking(api.db.runs.prune, older_than=b.older_than, finished_only=b.finished_only)
    return h.JSON({"runs": ids})
