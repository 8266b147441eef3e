"""The file (or server) as a whole: init, info, check, backup, vacuum, demo."""

from __future__ import annotations

import sys

import click

from .. import _demo
from ._base import ARGS, Ctx, cli, pass_obj, table


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
