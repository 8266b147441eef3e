"""Agent runs: list, show, delete, trim, export, import."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

import agentstate

from ..backends.leases import CALL_TYPES, SETTLED, call_state, claim_live
from ._base import ADMIN, ARGS, Ctx, cli, fail, paged, pass_obj, show, table


@cli.group()
def runs() -> None:
    """Agent runs: history entries and snapshots."""


@runs.command("list")
@paged
@pass_obj
def runs_list(obj: Ctx, limit: int | None, after: str | None) -> None:
    """Every run, most recently updated first."""
    rs = obj.open().runs.list(after=after, limit=limit)
    data = [{"id": r.id, "task": r.task, "turn": r.turn, "stopped_by": r.stopped_by,
             "finished": r.finished, "created_at": _iso(r.created_at),
             "updated_at": _iso(r.updated_at)} for r in rs]
    obj.out(data, table(("ID", "TASK", "TURN", "FINISHED", "UPDATED"),
                        [(r.id, r.task[:40], r.turn, "yes" if r.finished else "no",
                          r.updated_at and r.updated_at.strftime("%Y-%m-%d %H:%M:%S"))
                         for r in rs]))


def _iso(dt: datetime | None) -> str | None:
    return None if dt is None else dt.isoformat()


@runs.command("show", context_settings=ARGS)
@click.argument("run_id")
@click.option("--tail", "n", type=click.IntRange(min=0), help="Only the last N entries.")
@pass_obj
def runs_show(obj: Ctx, run_id: str, n: int | None) -> None:
    """A run's snapshot and entries."""
    db = obj.open()
    rec = db.runs.read(run_id)
    if rec is None:
        fail("not_found", f"no run {run_id!r}")
    entries = rec.entries if n is None else db.runs.tail(run_id, n)
    calls = open_calls(db, rec.entries)
    marks = {id(e): f"  <- {state.replace('_', ' ')}: no result recorded"
             + (" (it may have run: reconcile it)" if state == "in_doubt" else "")
             for e, state in calls.values()}
    obj.out({"id": run_id, "snapshot": rec.snapshot, "entries": entries,
             "open_calls": {cid: state for cid, (_e, state) in calls.items()}},
            "\n".join([f"run {run_id}: {len(rec.entries)} entries",
                       f"snapshot: {show(rec.snapshot)}"]
                      + [show(e) + marks.get(id(e), "") for e in entries]))


def open_calls(db: agentstate.Database, entries: list[dict[str, Any]]
               ) -> dict[str, tuple[dict[str, Any], str]]:
    """The tool calls with a claim and no result yet (SPEC §14), by call id: the claim
    entry and whether it is in_progress or in_doubt, by the rule once() applies."""
    last: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e.get("type") in CALL_TYPES and isinstance(e.get("call_id"), str):
            last[e["call_id"]] = e
    out = {}
    now = db._ops.clock()  # the store's clock, as once() judges leases (SPEC §16)
    for call_id, e in last.items():
        if e["type"] == "tool_result" and e.get("status") in SETTLED:
            continue
        fence, live = e.get("fence"), None
        if isinstance(fence, str):
            try:
                live = claim_live(db.sessions.get_turn(fence, ADMIN).status)
            except agentstate.NotFound:
                live = False
        out[call_id] = (e, call_state(e, live, now))
    return out


@runs.command("delete", context_settings=ARGS)
@click.argument("run_id")
@pass_obj
def runs_delete(obj: Ctx, run_id: str) -> None:
    """Remove a run."""
    deleted = obj.open().runs.delete(run_id)
    obj.out({"deleted": deleted}, f"deleted run {run_id}" if deleted else f"no run {run_id!r}")


@runs.command("trim", context_settings=ARGS)
@click.argument("run_id")
@click.option("--before", type=click.IntRange(min=0), required=True,
              help="Remove the entries with seq below this.")
@pass_obj
def runs_trim(obj: Ctx, run_id: str, before: int) -> None:
    """Remove a run's entries with seq < SEQ; the rest stays contiguous."""
    n = obj.open().runs.trim(run_id, before=before)
    obj.out({"removed": n}, f"removed {n} entries of run {run_id}")


@runs.command("export", context_settings=ARGS)
@click.argument("run_id")
@click.argument("folder", type=click.Path(file_okay=False))
@pass_obj
def runs_export(obj: Ctx, run_id: str, folder: str) -> None:
    """Write FOLDER/RUN_ID/log.jsonl and snapshot.json."""
    out = obj.open().runs.export(run_id, folder)
    obj.out({"path": str(out)}, f"exported to {out}")


@runs.command("import", context_settings=ARGS)
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@pass_obj
def runs_import(obj: Ctx, folder: str) -> None:
    """Import every FOLDER/ID/ (log.jsonl, snapshot.json); entries already stored are skipped."""
    results = obj.open().runs.import_runs(folder)
    obj.out([r._asdict() for r in results], "\n".join(
        f"{r.run_id}: error: {r.error}" if r.error else f"{r.run_id}: +{r.added} entries"
        for r in results))
    if not results:
        fail("not_found", f"no run folders under {folder} (runs import takes the DIR that "
                          "runs export wrote into: DIR/ID/log.jsonl)")
    failed = [r for r in results if r.error]
    if failed:
        fail("invalid_value", f"{len(failed)} of {len(results)} runs not imported: {failed[0].error}")
