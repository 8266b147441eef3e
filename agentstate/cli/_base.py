"""The command's group, its context and the helpers every subcommand shares.

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

from .._database import is_server_url
from .._encoding import check_key, check_kind, encode, encode_items

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


def paged(fn: Any) -> Any:
    """--limit and --after for a list command (the library's keyset paging)."""
    fn = click.option("--after", metavar="ID", help="Continue after this id (a page's last).")(fn)
    return click.option("--limit", type=click.IntRange(min=0), help="At most N.")(fn)


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
