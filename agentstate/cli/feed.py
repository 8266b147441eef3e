"""The change feed, pruning and settings: changes, prune, settings."""

from __future__ import annotations

import json
from typing import Any

import click

import agentstate

from ._base import ADMIN, ARGS, Ctx, cli, duration, fail, parse_json, pass_obj, show, table


def _change_dict(ch: agentstate.Change) -> dict[str, Any]:
    return {**ch._asdict(), "at": ch.at.isoformat().replace("+00:00", "Z")}


def _change_line(ch: agentstate.Change) -> str:
    where = (f"{ch.kind}:{ch.scope_id} {ch.key}" if ch.topic == "kv"
             else f"{ch.scope_id}" + (f" {ch.key}" if ch.key else ""))
    extra = "" if ch.version is None else f" v{ch.version}"
    extra += "" if ch.start is None else f" [{ch.start}+{ch.count}]"
    return f"{ch.seq}  {ch.at.strftime('%Y-%m-%d %H:%M:%S.%f')[:-3]}  {ch.topic} {ch.op}  {where}{extra}"


@cli.command(context_settings=ARGS)
@click.option("--since", type=click.IntRange(min=0),
              help="Changes after this seq [default: all kept; with --follow: only new ones].")
@click.option("--limit", type=click.IntRange(1, 10_000), default=1000, show_default=True,
              help="At most this many (without --follow).")
@click.option("--topic", type=click.Choice(["kv", "run", "session"]), help="Only this topic.")
@click.option("--scope", "scope", metavar="KIND:ID", help="Only this scope (kv), or run or session id (ID).")
@click.option("--key", help="Only this key (kv) or turn id (session).")
@click.option("--follow", is_flag=True, help="Keep printing new changes until interrupted.")
@pass_obj
def changes(obj: Ctx, since: int | None, limit: int, topic: str | None, scope: str | None,
            key: str | None, follow: bool) -> None:
    """Print the change feed, one line per change (JSON lines with --json)."""
    db = obj.open()
    flt: dict[str, Any] = {"topic": topic, "key": key}
    if scope is not None:
        kind, sep, sid = scope.rpartition(":") if ":" in scope else ("", "", scope)
        if sep and kind in ("thread", "session", "agent", "user", "app"):
            flt.update(kind=kind, scope_id=sid)
        else:
            flt["scope_id"] = scope
    flt = {k: v for k, v in flt.items() if v is not None}

    def emit(chs: list[agentstate.Change]) -> None:
        for ch in chs:
            click.echo(json.dumps(_change_dict(ch), ensure_ascii=False) if obj.as_json
                       else _change_line(ch))

    if since is None:
        since = db.last_change() if follow else max(0, _oldest_kept(db) - 1)
    if not follow:
        emit(db.changes(since, limit=limit, **flt))
        return
    try:
        while True:
            found = db.watch(since, timeout=1.0, **flt)
            emit(found)
            if found:
                since = found[-1].seq
    except KeyboardInterrupt:
        return


def _oldest_kept(db: agentstate.Database) -> int:
    head = db.last_change()
    first = db.changes(0, limit=1) if head else []
    return first[0].seq if first else head + 1


class _DryRun(Exception):
    """Raised to roll back a prune that only shows what it would remove."""


@cli.command()
@click.option("--runs-older-than", "runs_older", metavar="DUR", callback=duration,
              help="Delete runs not written for DUR (only finished ones, unless --all-runs).")
@click.option("--all-runs", is_flag=True, help="With --runs-older-than: unfinished runs too.")
@click.option("--sessions-idle", "sessions_idle", metavar="DUR", callback=duration,
              help="Delete sessions with no turn started for DUR and none active.")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@pass_obj
def prune(obj: Ctx, runs_older: float | None, all_runs: bool, sessions_idle: float | None,
          dry_run: bool) -> None:
    """Delete old runs and idle sessions (DUR like 90s, 30m, 12h, 7d)."""
    if runs_older is None and sessions_idle is None:
        raise click.UsageError("say what to prune: --runs-older-than DUR and/or --sessions-idle DUR")
    db = obj.open()
    out: dict[str, list[str]] = {"runs": [], "sessions": []}
    try:
        with db.transaction():  # one transaction: a dry run rolls it back
            if runs_older is not None:
                out["runs"] = db.runs.prune(older_than=runs_older, finished_only=not all_runs)
            if sessions_idle is not None:
                out["sessions"] = db.sessions.prune(ADMIN, idle_for=sessions_idle)
            if dry_run:
                raise _DryRun
    except _DryRun:
        pass
    verb = "would remove" if dry_run else "removed"
    lines = [f"{verb} run {r}" for r in out["runs"]] + [f"{verb} session {x}" for x in out["sessions"]]
    lines.append(f"{verb} {len(out['runs'])} runs and {len(out['sessions'])} sessions")
    obj.out({**out, "dry_run": dry_run}, "\n".join(lines))


@cli.command(context_settings=ARGS)
@click.argument("name", required=False)
@click.argument("value", required=False)
@pass_obj
def settings(obj: Ctx, name: str | None, value: str | None) -> None:
    """Show the settings, one setting, or set NAME to the JSON VALUE."""
    db = obj.open()
    if name is not None and value is not None:
        db.set_setting(name, parse_json(value, "VALUE"))
    current = db.settings()
    if name is None:
        obj.out(current, table(("NAME", "VALUE"), sorted(current.items())))
        return
    if name not in current:
        fail("invalid_value", f"no setting {name!r}; settings are {', '.join(current)}")
    obj.out({name: current[name]}, f"{name} = {show(current[name])}")
