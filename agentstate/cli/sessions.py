"""Sessions and turns: list, show, turns, release."""

from __future__ import annotations

from typing import Any

import click

import agentstate

from ._base import ADMIN, ARGS, Ctx, cli, fail, paged, pass_obj, show, table


@cli.group()
def sessions() -> None:
    """Sessions and their turns (as an admin)."""


def _turn_dict(t: agentstate.Turn) -> dict[str, Any]:
    return {"id": t.id, "n": t.n, "status": t.status, "input": t.input, "request": t.request,
            "decision": t.decision, "result": t.result, "error": t.error,
            "created_at": t.created_at.isoformat(), "updated_at": t.updated_at.isoformat()}


@sessions.command("list")
@paged
@pass_obj
def sessions_list(obj: Ctx, limit: int | None, after: str | None) -> None:
    """Every session, newest first."""
    ss = obj.open().sessions.list(ADMIN, after=after, limit=limit)
    obj.out([{"id": s.id, "owner": s.owner, "created_at": s.created_at.isoformat(),
              "metadata": s.metadata} for s in ss],
            table(("ID", "OWNER", "CREATED"),
                  [(s.id, s.owner, s.created_at.strftime("%Y-%m-%d %H:%M:%S")) for s in ss]))


@sessions.command("show", context_settings=ARGS)
@click.argument("session_id")
@pass_obj
def sessions_show(obj: Ctx, session_id: str) -> None:
    """A session and its active turn."""
    db = obj.open()
    s = db.sessions.get(session_id, ADMIN)
    ts = db.sessions.turns(session_id, ADMIN)
    active = [t for t in ts if t.status in ("queued", "running")]
    obj.out({"id": s.id, "owner": s.owner, "created_at": s.created_at.isoformat(),
             "metadata": s.metadata, "turns": len(ts),
             "active_turn": _turn_dict(active[0]) if active else None},
            table(("", ""), [("id", s.id), ("owner", s.owner), ("created", s.created_at.isoformat()),
                             ("metadata", show(s.metadata)), ("turns", len(ts)),
                             ("active turn", f"{active[0].id} ({active[0].status})" if active else "none")]
                  ).split("\n", 1)[1])


@sessions.command("turns", context_settings=ARGS)
@click.argument("session_id")
@paged
@pass_obj
def sessions_turns(obj: Ctx, session_id: str, limit: int | None, after: str | None) -> None:
    """A session's turns, newest first."""
    ts = obj.open().sessions.turns(session_id, ADMIN, after=after, limit=limit)
    obj.out([_turn_dict(t) for t in ts],
            table(("N", "TURN", "STATUS", "UPDATED"),
                  [(t.n, t.id, t.status, t.updated_at.strftime("%Y-%m-%d %H:%M:%S")) for t in ts]))


@sessions.command("release", context_settings=ARGS)
@click.argument("session_id")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_obj
def sessions_release(obj: Ctx, session_id: str, yes: bool) -> None:
    """End the session's active turn as failed (admin action)."""
    db = obj.open()
    db.sessions.get(session_id, ADMIN)
    if not any(t.status in ("queued", "running") for t in db.sessions.turns(session_id, ADMIN)):
        fail("invalid_transition", f"session {session_id!r} has no active turn to release")
    if not yes:
        try:
            confirmed = click.confirm(f"End the active turn of {session_id} as failed?")
        except click.Abort:
            confirmed = False
        if not confirmed:
            fail("aborted", "nothing released (confirm, or pass --yes)")
    t = db.sessions.release(session_id, ADMIN)
    obj.out(_turn_dict(t), f"released turn {t.id} ({t.status})")
