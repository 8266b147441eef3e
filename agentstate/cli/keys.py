"""Keys of a scope: get, put, append, delete, keys (get and keys also as of a change)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click

import agentstate

from ._base import ARGS, Ctx, cli, fail, parse_json, parse_scope, pass_obj, show, validate_first


AS_OF = click.option("--as-of", "as_of", type=click.IntRange(min=0), metavar="SEQ",
                     help="As it was right after change SEQ.")


@contextmanager
def reading(obj: Ctx, scope: str, as_of: int | None) -> Iterator[agentstate.Scope]:
    """SCOPE as it is, or as it was right after change ``as_of`` (SPEC §17)."""
    db, kind_id = obj.open(), parse_scope(scope)
    if as_of is None:
        yield db.scope(*kind_id)
        return
    with db.as_of(as_of) as past:
        yield past.scope(*kind_id)


@cli.command(context_settings=ARGS)
@click.argument("scope")
@click.argument("key")
@AS_OF
@pass_obj
def get(obj: Ctx, scope: str, key: str, as_of: int | None) -> None:
    """Print the value of KEY in SCOPE (KIND:ID)."""
    with reading(obj, scope, as_of) as s:
        value, version = s.get_versioned(key)
    if version == 0:
        fail("not_found", f"no key {key!r} in {scope}"
             + ("" if as_of is None else f" as of change {as_of}"))
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
    version = obj.open().scope(kind, sid).put(key, v, if_version=if_version)
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
    r = obj.open().scope(kind, sid).append(key, v)
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
@AS_OF
@pass_obj
def keys(obj: Ctx, scope: str, prefix: str, as_of: int | None) -> None:
    """List the keys of SCOPE."""
    with reading(obj, scope, as_of) as s:
        ks = s.list(prefix)
    obj.out(ks, "\n".join(ks))
