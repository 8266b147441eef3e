"""The ``agentstate`` command, built on the public objects only."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

import agentstate

from . import _demo


class Ctx:
    def __init__(self, db_path: str | None, as_json: bool) -> None:
        self.db_path = db_path or os.environ.get("AGENTSTATE_DB") or "agentstate.db"
        self.as_json = as_json

    def out(self, data: Any, human: str) -> None:
        click.echo(json.dumps(data, ensure_ascii=False, default=str) if self.as_json else human)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(agentstate.__version__, prog_name="agentstate")
@click.option("--db", "db_path", metavar="PATH", help="Database file [default: $AGENTSTATE_DB or ./agentstate.db].")
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.pass_context
def cli(ctx: click.Context, db_path: str | None, as_json: bool) -> None:
    """Administer an agentstate database: one SQLite file of agent state."""
    ctx.obj = Ctx(db_path, as_json)


@cli.command()
@click.pass_obj
def demo(obj: Ctx) -> None:
    """Run two agent processes that share the database, and show what they did."""
    try:
        r = _demo.run(obj.db_path, click.echo)
    except agentstate.AgentStateError as e:
        raise click.ClickException(f"{e.code}: {e}") from None
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
        f"  sqlite3 {r['path']} \"SELECT json_extract(value, '$[#-1].agent') FROM state "
        f"WHERE kind = 'session' AND key = 'history'\"",
    ])
    obj.out(r, human)
    if not ok:
        sys.exit(1)


def main() -> None:
    cli()
