"""The past (SPEC §17): history, diff, restore (and ``--as-of`` on get and keys: ``keys``).

Values print as JSON; a value written as bytes as ``bytes:`` and its base64 (``--json``:
``"type": "bytes"`` with the base64 text as ``value``, as over HTTP).
"""

from __future__ import annotations

import base64
from typing import Any

import click

import agentstate

from ._base import ARGS, Ctx, cli, parse_scope, pass_obj, show, table

KINDS = ("thread", "session", "agent", "user", "app")


def typed(value: Any, version: int) -> dict[str, Any]:
    """``{"value", "version", "type"}`` as the API's past routes answer."""
    if isinstance(value, bytes):
        return {"value": base64.b64encode(value).decode("ascii"), "version": version,
                "type": "bytes"}
    return {"value": value, "version": version, "type": "json"}


def human(value: Any, version: int = 1) -> str:
    if not version:
        return "(absent)"
    if isinstance(value, bytes):
        return "bytes:" + base64.b64encode(value).decode("ascii")
    return show(value)


@cli.command(context_settings=ARGS)
@click.argument("scope")
@click.argument("key")
@click.option("--since", type=click.IntRange(min=0), help="Only changes after this seq.")
@click.option("--limit", type=click.IntRange(min=1), help="At most N, the newest.")
@pass_obj
def history(obj: Ctx, scope: str, key: str, since: int | None, limit: int | None) -> None:
    """Print the kept revisions of KEY in SCOPE (KIND:ID), newest first."""
    revs = obj.open().scope(*parse_scope(scope)).history(key, since=since, limit=limit)
    data = [{"seq": r.seq, "version": r.version, "op": r.op,
             "at": r.at.isoformat().replace("+00:00", "Z"),
             **{k: v for k, v in typed(r.value, r.version).items() if k != "version"}}
            for r in revs]
    rows = [(r.seq, r.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3], r.op, r.version,
             "" if r.op in ("delete", "expire") else human(r.value)) for r in revs]
    obj.out(data, table(("SEQ", "AT", "OP", "VERSION", "VALUE"), rows) if revs
            else f"no history of {key!r} in {scope}")


@cli.command(context_settings=ARGS)
@click.argument("since", type=click.IntRange(min=0))
@click.argument("until", type=click.IntRange(min=0), required=False)
@click.option("--scope", metavar="KIND:ID", help="Only this scope (KIND:ID), or kind (KIND).")
@click.option("--key", help="Only this key.")
@pass_obj
def diff(obj: Ctx, since: int, until: int | None, scope: str | None, key: str | None) -> None:
    """Print every key changed after change SINCE up to UNTIL (default: the newest)."""
    flt: dict[str, Any] = {"key": key}
    if scope is not None:
        if scope in KINDS:
            flt["kind"] = scope
        else:
            flt["kind"], flt["scope_id"] = parse_scope(scope)
    found = obj.open().diff(since, until, **{k: v for k, v in flt.items() if v is not None})
    data = [{"kind": d.kind, "scope_id": d.scope_id, "key": d.key,
             "before": typed(*d.before), "after": typed(*d.after)} for d in found]
    lines = []
    for d in found:
        lines += [f"{d.kind}:{d.scope_id} {d.key}  v{d.before.version} -> v{d.after.version}",
                  f"  - {human(*d.before)}", f"  + {human(*d.after)}"]
    obj.out(data, "\n".join(lines) if found else "no key changed")


@cli.command(context_settings=ARGS)
@click.argument("scope")
@click.option("--at", "at", type=click.IntRange(min=0), required=True,
              help="The change to go back to: the scope as it was right after it.")
@click.option("--key", "keys", multiple=True, help="Only this key (repeatable).")
@pass_obj
def restore(obj: Ctx, scope: str, at: int, keys: tuple[str, ...]) -> None:
    """Put SCOPE's keys (or only --key's) back as they were right after change --at."""
    s: agentstate.Scope = obj.open().scope(*parse_scope(scope))
    n = s.restore(at, keys=list(keys) or None)
    obj.out({"restored": n}, f"restored {n} key{'' if n == 1 else 's'} of {scope} to change {at}")
