"""The ``agentstate`` command, built on the public objects only.

Refused operations print one line ``Error: <code>: <what>`` on stderr and exit
1; bad usage exits 2 with click's usage text; no traceback reaches the user.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, NoReturn

import click

import agentstate

from . import _demo
from ._database import is_server_url
from ._encoding import check_key, check_kind, encode, encode_items

ADMIN = agentstate.Principal("agentstate-cli", admin=True)


def fail(code: str, message: str) -> NoReturn:
    raise click.ClickException(f"{code}: {' '.join(str(message).split())}")


class Group(click.Group):
    """Turns every error of the library (or the file system) into one line and exit 1."""

    def invoke(self, ctx: click.Context) -> Any:
        # A refused command never deletes a file: once created, another process
        # may have opened it and written to it. Commands that create the file
        # check their input first (validate_first), so bad input creates none.
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BrokenPipeError:  # the reader left (| head): not our error, nothing to say
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)
        except agentstate.AgentStateError as e:
            fail(e.code, str(e))
        except json.JSONDecodeError as e:
            fail("invalid_value", f"stored bytes are not JSON: {e}")
        except OSError as e:
            fail("storage_error", f"{e.filename or ''}: {e.strerror or e}")
        except Exception as e:  # never a traceback (SPEC §7): one line, exit 1
            fail("error", f"{type(e).__name__}: {e}")


class Ctx:
    def __init__(self, db_path: str | None, as_json: bool) -> None:
        self.db_path = db_path or os.environ.get("AGENTSTATE_DB") or "agentstate.db"
        self.as_json = as_json
        self.db: agentstate.Database | None = None

    def open(self, create: bool = False) -> agentstate.Database:
        if is_server_url(self.db_path):  # a server: nothing to create or check here
            self.db = agentstate.open(self.db_path)
            click.get_current_context().call_on_close(self.db.close)
            return self.db
        exists = os.path.exists(self.db_path)
        if not create and not exists:
            fail("not_found", f"no database at {self.db_path} (agentstate init creates one)")
        if os.path.isdir(self.db_path):
            fail("storage_error", f"{self.db_path} is a directory, not a database file")
        self.db = agentstate.open(self.db_path)
        click.get_current_context().call_on_close(self.db.close)
        return self.db

    def out(self, data: Any, human: str | None = None) -> None:
        if self.as_json:
            click.echo(json.dumps(data, ensure_ascii=False, default=str))
        elif human is not None:
            click.echo(human)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Rows aligned in columns under their headers."""
    cells = [list(headers)] + [["" if v is None else str(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells
    )


def show(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def parse_scope(text: str) -> tuple[str, str]:
    kind, sep, sid = text.partition(":")
    if not sep:
        fail("invalid_key", f"a scope is written KIND:ID (e.g. session:s-42), got {text!r}")
    return kind, sid


def parse_json(text: str, what: str) -> Any:
    try:
        if text == "-":
            text = sys.stdin.buffer.read().decode("utf-8")
        return json.loads(text)
    except UnicodeDecodeError as e:
        fail("invalid_value", f"{what} is not UTF-8: {e.reason} at byte {e.start}")
    except RecursionError:
        fail("invalid_value", f"{what} is nested too deeply")
    except ValueError as e:
        hint = " (a string needs JSON quotes: '\"hello\"')" if text[:1].isalpha() else ""
        fail("invalid_value", f"{what} is not JSON: {e}{hint}")


def validate_first(kind: str, sid: str, key: str, **what: Any) -> None:
    """Refuse bad input before a command creates the database file."""
    check_kind(kind)
    check_key(sid, "scope id")
    check_key(key)
    if "value" in what:
        v = what["value"]
        encode_items(v) if isinstance(v, list) else encode(v)
    if "items" in what:
        encode_items(what["items"])


pass_obj = click.pass_obj
# Values and keys may start with '-' (-0.5, -5, "-x"): such arguments are not options.
ARGS = {"ignore_unknown_options": True}


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(agentstate.__version__, prog_name="agentstate")
@click.option("--db", "db_path", metavar="PATH",
              help="Database file [default: $AGENTSTATE_DB, else ./agentstate.db].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def cli(ctx: click.Context, db_path: str | None, as_json: bool) -> None:
    """Administer an agentstate database: one SQLite file of agent state."""
    ctx.obj = Ctx(db_path, as_json)


# -- the file ---------------------------------------------------------------

@cli.command()
@pass_obj
def init(obj: Ctx) -> None:
    """Create the database (owner-only) if it does not exist."""
    db = obj.open(create=True)
    obj.out({"path": db.path}, f"database ready: {db.path}")


@cli.command()
@pass_obj
def info(obj: Ctx) -> None:
    """Path, sizes, schema version, durability and counts."""
    i = obj.open().info()
    rows = [("path", i["path"]), ("size", f"{i['size_bytes']:,} bytes"),
            ("wal", f"{i['wal_bytes']:,} bytes"), ("schema version", i["schema_version"]),
            ("durability", i["durability"])]
    rows += [(k.replace("_", " "), f"{v:,}") for k, v in i["counts"].items()]
    obj.out(i, table(("", ""), rows).split("\n", 1)[1])


@cli.command()
@pass_obj
def check(obj: Ctx) -> None:
    """Integrity check plus the store's own invariants; exit 1 on a problem."""
    problems = obj.open().check()
    obj.out({"ok": not problems, "problems": problems},
            "\n".join(problems) if problems else "ok: integrity and invariants hold")
    if problems:
        sys.exit(1)


@cli.command(context_settings=ARGS)
@click.argument("dest", type=click.Path(dir_okay=False))
@pass_obj
def backup(obj: Ctx, dest: str) -> None:
    """Copy the database to DEST (a new owner-only file), online, while others write."""
    db = obj.open()
    if sys.stderr.isatty() and not obj.as_json:
        with click.progressbar(length=1, label="backup", file=sys.stderr) as bar:
            def progress(done: int, total: int) -> None:
                bar.length = max(total, 1)
                bar.update(done - bar.pos)
            out = db.backup(dest, progress)
    else:
        out = db.backup(dest)
    obj.out({"path": out}, f"backed up to {out}")


@cli.command()
@pass_obj
def vacuum(obj: Ctx) -> None:
    """Checkpoint the WAL and rebuild the file to its smallest size."""
    r = obj.open().vacuum()
    obj.out(r, f"vacuumed: {r['size_before']:,} -> {r['size_after']:,} bytes")


# -- keys -------------------------------------------------------------------

@cli.command(context_settings=ARGS)
@click.argument("scope")
@click.argument("key")
@pass_obj
def get(obj: Ctx, scope: str, key: str) -> None:
    """Print the value of KEY in SCOPE (KIND:ID)."""
    s = obj.open().scope(*parse_scope(scope))
    value, version = s.get_versioned(key)
    if version == 0:
        fail("not_found", f"no key {key!r} in {scope}")
    obj.out({"key": key, "value": value, "version": version}, show(value))
    if not obj.as_json:  # stdout stays pure JSON, to pipe into put
        click.echo(f"(version {version})", err=True)


@cli.command(context_settings=ARGS)
@click.argument("scope")
@click.argument("key")
@click.argument("value")
@click.option("--if-version", type=click.IntRange(min=0), help="Write only if the version is this (0: absent).")
@pass_obj
def put(obj: Ctx, scope: str, key: str, value: str, if_version: int | None) -> None:
    """Set KEY in SCOPE to the JSON VALUE (- reads it from stdin)."""
    kind, sid = parse_scope(scope)
    v = parse_json(value, "VALUE")
    validate_first(kind, sid, key, value=v)
    version = obj.open(create=True).scope(kind, sid).put(key, v, if_version=if_version)
    obj.out({"version": version}, f"version {version}")


@cli.command(context_settings=ARGS)
@click.argument("scope")
@click.argument("key")
@click.argument("items")
@pass_obj
def append(obj: Ctx, scope: str, key: str, items: str) -> None:
    """Append the JSON list ITEMS (- reads it from stdin) to the list KEY."""
    kind, sid = parse_scope(scope)
    v = parse_json(items, "ITEMS")
    if not isinstance(v, list):
        fail("invalid_value", "ITEMS must be a JSON list, e.g. '[1, 2]'")
    validate_first(kind, sid, key, items=v)
    r = obj.open(create=True).scope(kind, sid).append(key, v)
    obj.out({"length": r.length, "version": r.version}, f"length {r.length}, version {r.version}")


@cli.command(context_settings=ARGS)
@click.argument("scope")
@click.argument("key")
@click.option("--if-version", type=click.IntRange(min=0), help="Delete only if the version is this.")
@pass_obj
def delete(obj: Ctx, scope: str, key: str, if_version: int | None) -> None:
    """Delete KEY from SCOPE."""
    s = obj.open().scope(*parse_scope(scope))
    deleted = s.delete(key, if_version=if_version)
    obj.out({"deleted": deleted}, "deleted" if deleted else f"no key {key!r} in {scope}")


@cli.command(context_settings=ARGS)
@click.argument("scope")
@click.option("--prefix", default="", help="Only keys starting with this (literally).")
@pass_obj
def keys(obj: Ctx, scope: str, prefix: str) -> None:
    """List the keys of SCOPE."""
    ks = obj.open().scope(*parse_scope(scope)).list(prefix)
    obj.out(ks, "\n".join(ks))


# -- runs -------------------------------------------------------------------

@cli.group()
def runs() -> None:
    """Agent runs: history entries and snapshots."""


def paged(fn: Any) -> Any:
    """--limit and --after for a list command (the library's keyset paging)."""
    fn = click.option("--after", metavar="ID", help="Continue after this id (a page's last).")(fn)
    return click.option("--limit", type=click.IntRange(min=0), help="At most N.")(fn)


@runs.command("list")
@paged
@pass_obj
def runs_list(obj: Ctx, limit: int | None, after: str | None) -> None:
    """Every run, most recently updated first."""
    rs = obj.open().runs.list(after=after, limit=limit)
    data = [{"id": r.id, "task": r.task, "turn": r.turn, "stopped_by": r.stopped_by,
             "finished": r.finished, "created_at": r.created_at.isoformat(),
             "updated_at": r.updated_at.isoformat()} for r in rs]
    obj.out(data, table(("ID", "TASK", "TURN", "FINISHED", "UPDATED"),
                        [(r.id, r.task[:40], r.turn, "yes" if r.finished else "no",
                          r.updated_at.strftime("%Y-%m-%d %H:%M:%S")) for r in rs]))


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
    obj.out({"id": run_id, "snapshot": rec.snapshot, "entries": entries},
            "\n".join([f"run {run_id}: {len(rec.entries)} entries",
                       f"snapshot: {show(rec.snapshot)}"] + [show(e) for e in entries]))


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
    results = obj.open(create=True).runs.import_runs(folder)
    obj.out([r._asdict() for r in results], "\n".join(
        f"{r.run_id}: error: {r.error}" if r.error else f"{r.run_id}: +{r.added} entries"
        for r in results))
    if not results:
        fail("not_found", f"no run folders under {folder} (runs import takes the DIR that "
                          "runs export wrote into: DIR/ID/log.jsonl)")
    failed = [r for r in results if r.error]
    if failed:
        fail("invalid_value", f"{len(failed)} of {len(results)} runs not imported: {failed[0].error}")


# -- sessions ---------------------------------------------------------------

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


# -- the change feed, expiry and settings -------------------------------------

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


_DUR = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(ctx: click.Context, param: click.Parameter, value: str | None) -> float | None:
    """90s, 30m, 12h, 7d -> seconds."""
    if value is None:
        return None
    text = value.strip().lower()
    try:
        n = float(text[:-1])
        unit = _DUR[text[-1:]]
    except (ValueError, KeyError):
        raise click.BadParameter(f"{value!r} is not a duration like 90s, 30m, 12h or 7d") from None
    if not 0 <= n * unit < 1e11:
        raise click.BadParameter(f"{value!r} is out of range")
    return n * unit


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
    if value is not None:
        db.set_setting(name, parse_json(value, "VALUE"))
    current = db.settings()
    if name is None:
        obj.out(current, table(("NAME", "VALUE"), sorted(current.items())))
        return
    if name not in current:
        fail("invalid_value", f"no setting {name!r}; settings are {', '.join(current)}")
    obj.out({name: current[name]}, f"{name} = {show(current[name])}")


# -- the HTTP API ------------------------------------------------------------

@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@pass_obj
def serve(obj: Ctx, host: str, port: int) -> None:
    """Serve the store over HTTP (the State API; needs the server extra)."""
    try:
        import uvicorn

        from .server import create_app
    except ImportError as e:
        fail("usage_error", f"serve needs the server extra: pip install 'agentstate[server]' ({e})")
    db = obj.open(create=True)
    if not db.tokens.list():
        token = db.tokens.create("admin", admin=True)
        click.echo(f"No token existed: made one for the admin principal 'admin', shown only now:\n"
                   f"{token}")
    app = create_app(db)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            try:
                app.state.notifier.stop_waiting()  # else it waits for every open stream to end
            finally:
                super().handle_exit(sig, frame)

    click.echo(f"serving {db.path} on http://{host}:{port} (Ctrl-C stops)", err=True)
    server = Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                   access_log=False, timeout_graceful_shutdown=10))
    try:
        server.run()
    except KeyboardInterrupt:  # uvicorn raises the signal again once it has stopped
        pass
    if not server.started:  # the port taken, say: uvicorn has logged why
        sys.exit(3)


@cli.group()
def tokens() -> None:
    """Bearer tokens for the HTTP API (only their hashes are stored)."""


@tokens.command("create", context_settings=ARGS)
@click.argument("name")
@click.option("--admin", is_flag=True, help="The principal is an admin.")
@pass_obj
def tokens_create(obj: Ctx, name: str, admin: bool) -> None:
    """Make a token for the principal NAME and print it (once: it is not stored)."""
    token = obj.open(create=True).tokens.create(name, admin=admin)
    obj.out({"name": name, "admin": admin, "token": token}, token)


@tokens.command("list")
@pass_obj
def tokens_list(obj: Ctx) -> None:
    """Principals that hold tokens."""
    rows = obj.open().tokens.list()
    obj.out(rows, table(("NAME", "ADMIN", "TOKENS", "SINCE"),
                        [(r["name"], "yes" if r["admin"] else "no", r["tokens"], r["created_at"])
                         for r in rows]))


@tokens.command("revoke", context_settings=ARGS)
@click.argument("name")
@pass_obj
def tokens_revoke(obj: Ctx, name: str) -> None:
    """End every token of the principal NAME."""
    n = obj.open().tokens.revoke(name)
    obj.out({"revoked": n}, f"revoked {n} tokens of {name}")


# -- demo -------------------------------------------------------------------

@cli.command()
@pass_obj
def demo(obj: Ctx) -> None:
    """Run two agent processes that share the database, and show what they did."""
    r = _demo.run(obj.db_path, click.echo)
    ok = r["failed_processes"] == 0 and r["visits"] - r["visits_before"] == r["expected"]
    human = "\n".join([
        f"database: {r['path']}",
        f"2 agent processes each appended {_demo.TURNS} messages to session:{_demo.SESSION} "
        f"'history' and incremented agent:{_demo.AGENT} 'visits' {_demo.TURNS} times.",
        f"history: +{r['appended']} items (now {r['history_length']}); "
        + ", ".join(f"{k}: {v}" for k, v in r["per_agent"].items()),
        f"visits: {r['visits_before']} -> {r['visits']} (version {r['visits_version']}); "
        f"expected +{r['expected']}: {'no update lost' if ok else 'MISMATCH'}",
        "",
        "Look at it with the sqlite3 shell:",
        f"  sqlite3 {r['path']} \"SELECT kind, scope_id, key, version, length FROM state\"",
        f"  sqlite3 {r['path']} \"SELECT json_extract(value, '\\$[#-1].agent') FROM state "
        f"WHERE kind = 'session' AND key = 'history'\"",
    ])
    obj.out(r, human)
    if not ok:
        sys.exit(1)


def main() -> None:
    cli()
