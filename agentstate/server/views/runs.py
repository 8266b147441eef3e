"""Runs (SPEC §3): history entries and snapshots. Runs have no owner: any token reads and
writes them (a token with grants: those its ``runs`` rules cover, SPEC §15); pruning (which
may delete every run) is for admins, as for sessions."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

import agentstate
from agentstate import _calls
from agentstate._runs import parse_time

from .. import _http as h
from .._api import API, Call, iso, json_response, next_after, page, raw_object, stored
from .._models import (ClaimBody, ForkBody, PinBody, PruneRunsBody, SettleBody, TrimBody,
                       WriteBody)


def _run_id(run_id: str) -> str:
    from agentstate._encoding import check_key

    return check_key(run_id, "run id")


def _summary(r: agentstate.SavedState) -> dict[str, Any]:
    return {"id": r.id, "task": r.task, "turn": r.turn, "stopped_by": r.stopped_by,
            "finished": r.finished, "created_at": iso(r.created_at), "updated_at": iso(r.updated_at),
            "pinned": r.pinned}


async def runs_list(api: API, c: Call) -> Response:
    """The runs the caller may read: with grants, those a ``runs`` rule covers (the store's
    query leaves out the others, so a page is full when more follow)."""
    after, limit = page(c)
    rules = None if c.readable is None else c.rules
    if after is not None:  # even whether it exists is not for a token that may not read it
        c.need("runs", _run_id(after), False)
    runs = await h.blocking(api.db.runs._list, after, limit, rules)
    return await c.answer({"runs": [_summary(r) for r in runs], "next": next_after(runs, limit)})


async def run_get(api: API, c: Call) -> Response:
    run_id = _run_id(c.params["run_id"])

    def read() -> bytes:
        # The backend's own read (the seam's run_read): a remote load() checks the history
        # against its recorded bounds and format as a local one does. Entries and snapshot
        # go out as stored (see _api.stored).
        got = api.db._ops.run_read(run_id)
        if got is None:
            raise agentstate.RunNotFound(f"no run {run_id!r}")
        (snapshot, next_seq, fmt, first, *_), rows = got
        return raw_object(id=h.dumps(run_id), snapshot=stored(snapshot, "a run's snapshot"),
                          entries=_entries(rows), first_seq=h.dumps(first),
                          next_seq=h.dumps(next_seq), format=h.dumps(fmt))

    return json_response(await h.blocking(read))


async def run_head(api: API, c: Call) -> Response:
    run_id = _run_id(c.params["run_id"])

    def read() -> bytes:
        got = api.db._ops.run_head(run_id)
        if got is None:
            raise agentstate.RunNotFound(f"no run {run_id!r}")
        snapshot, next_seq, fmt, first, created, updated, pinned = got
        return raw_object(id=h.dumps(run_id), snapshot=stored(snapshot, "a run's snapshot"),
                          first_seq=h.dumps(first),
                          next_seq=h.dumps(next_seq), format=h.dumps(fmt),
                          created_at=h.dumps(iso(parse_time(created))),
                          updated_at=h.dumps(iso(parse_time(updated))),
                          pinned=h.dumps(bool(pinned)))

    return json_response(await h.blocking(read))


async def run_delete(api: API, c: Call) -> Response:
    return h.JSON({"deleted": await h.blocking(c.db.runs.delete, c.params["run_id"])})


async def run_write(api: API, c: Call) -> Response:
    b = await c.json(WriteBody)
    await h.blocking(c.db.runs.write, c.params["run_id"], b.entries, b.snapshot, create=b.create)
    return h.JSON({"written": True})


def _entries(rows: list[tuple[int, str]]) -> bytes:
    return b"[" + b",".join(stored(text, "a stored run entry") for _, text in rows) + b"]"


async def run_entries(api: API, c: Call) -> Response:
    run_id = _run_id(c.params["run_id"])
    since, limit = h.query_int(c.request, "since", 0), h.query_int(c.request, "limit")
    rows = await h.blocking(api.db._ops.run_entries, run_id, since, limit)
    return json_response(raw_object(entries=await h.blocking(_entries, rows)))


async def run_tail(api: API, c: Call) -> Response:
    run_id, n = _run_id(c.params["run_id"]), h.query_int(c.request, "n", 20)
    rows = await h.blocking(api.db._ops.run_tail, run_id, n)
    return json_response(raw_object(entries=await h.blocking(_entries, rows)))


async def run_load(api: API, c: Call) -> Response:
    rec = await h.blocking(api.db.runs.load, c.params["run_id"])
    return await c.answer({"entries": rec.entries, "snapshot": rec.snapshot})


async def run_fork(api: API, c: Call) -> Response:
    b = await c.json(ForkBody)
    c.need("runs", _run_id(b.new_id), True)  # the route's entry checked the run forked
    await h.blocking(c.db.runs.fork, c.params["run_id"], b.new_id, upto=b.upto)
    return h.JSON({"id": b.new_id})


async def run_trim(api: API, c: Call) -> Response:
    b = await c.json(TrimBody)
    return h.JSON({"removed": await h.blocking(c.db.runs.trim, c.params["run_id"], before=b.before)})


async def runs_prune(api: API, c: Call) -> Response:
    b = await c.json(PruneRunsBody)
    ids = await h.blocking(c.db.runs.prune, older_than=b.older_than, finished_only=b.finished_only)
    return h.JSON({"runs": ids})


async def run_pin(api: API, c: Call) -> Response:
    b = await c.json(PinBody)
    return h.JSON({"pinned": await h.blocking(c.db.runs.pin, c.params["run_id"], b.pinned)})


async def call_claim(api: API, c: Call) -> Response:
    """A claim's every status is an answer (SPEC §14); a bad request, a missing run or a
    lapsed fence are errors."""
    b = await c.json(ClaimBody)
    got = await h.blocking(c.db.runs.claim, c.params["run_id"], c.params["call_id"], call=b.call,
                           lease=b.lease, retry=b.retry)
    out: dict[str, Any] = {"status": got.status, "entry": got.entry}
    if got.status == "done":
        out["result"] = got.result
    elif got.status == "failed":
        out["error"] = got.error
    return await c.answer(out)


async def call_settle(api: API, c: Call) -> Response:
    b = await c.json(SettleBody)
    text = await h.blocking(_calls.settle, c.db._ops, c.params["run_id"], c.params["call_id"],
                            b.result, b.error, None, b.retry)
    return json_response(raw_object(entry=stored(text, "a run entry")))
