"""The HTTP API: serve, and its tokens."""

from __future__ import annotations

import sys
from typing import Any

import click

import agentstate

from .. import _grants
from ._base import ARGS, Ctx, cli, duration, fail, pass_obj, table


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@click.option("--cors-origin", "cors_origins", multiple=True, metavar="ORIGIN",
              help="Let pages on this origin (http(s)://host[:port], exact) call the API from a "
                   "browser with a token. Repeat for more; with none, no CORS header is sent.")
@pass_obj
def serve(obj: Ctx, host: str, port: int, cors_origins: tuple[str, ...]) -> None:
    """Serve the store over HTTP (the State API; needs the server extra)."""
    try:
        import uvicorn

        from ..server import create_app
        from ..server._cors import origin
    except ImportError as e:
        fail("usage_error", f"serve needs the server extra: pip install 'agentstate-db[server]' ({e})")
    try:
        cors_origins = tuple(origin(o) for o in cors_origins)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="'--cors-origin'") from None
    db = obj.open(create=True)
    token = db.tokens.create_first_admin("admin")  # one, whatever other servers start now
    if token is not None:
        click.echo(f"No token existed: made one for the admin principal 'admin', shown only now:\n"
                   f"{token}")
    app = create_app(db, cors_origins=cors_origins)

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
@click.option("--admin", is_flag=True, help="The principal is an admin (never limited by grants).")
@click.option("--grant", "grants", multiple=True, metavar="RULE",
              help="KIND:ID[=r|rw]: a scope kind or runs, an id, a prefix ending in * or *; "
                   "r reads only, rw (the default) reads and writes. Repeat for more; with "
                   "none the token may use every scope and run.")
@click.option("--expires", metavar="DUR", callback=duration,
              help="The token ends after DUR (90s, 30m, 12h, 30d); by default never.")
@pass_obj
def tokens_create(obj: Ctx, name: str, admin: bool, grants: tuple[str, ...],
                  expires: float | None) -> None:
    """Make a token for the principal NAME and print it (once: it is not stored)."""
    agentstate.Principal(name, admin)  # bad input refused before the file is created
    rules = _grants.parse(grants or None)
    if rules is not None and admin:  # the library says the same; here before the file exists
        fail("invalid_value", "an admin token is never restricted by grants: drop --admin or "
                              "the --grant rules")
    if expires is not None and expires <= 0:
        fail("invalid_value", "--expires must be a duration over 0")
    token = obj.open().tokens.create(name, admin=admin, grants=grants or None,
                                                 expires=expires)
    obj.out({"name": name, "admin": admin, "grants": None if rules is None else [str(r) for r in rules],
             "expires_in": expires, "token": token}, token)


@tokens.command("list")
@pass_obj
def tokens_list(obj: Ctx) -> None:
    """Every token: its id, principal, admin flag, grants, creation and expiry (never the
    token itself)."""
    rows = obj.open().tokens.list()
    obj.out(rows, table(("ID", "NAME", "ADMIN", "GRANTS", "CREATED", "EXPIRES"),
                        [(r["id"], r["name"], "yes" if r["admin"] else "no",
                          "(all)" if r["grants"] is None else " ".join(r["grants"]),
                          r["created_at"], r["expires_at"] or "never") for r in rows]))


@tokens.command("revoke", context_settings=ARGS)
@click.argument("name")
@click.option("--id", "token_id", metavar="ID", help="Only the token with this id (tokens list).")
@pass_obj
def tokens_revoke(obj: Ctx, name: str, token_id: str | None) -> None:
    """End every token of the principal NAME (or only one, with --id)."""
    n = obj.open().tokens.revoke(name, id=token_id)
    obj.out({"revoked": n}, f"revoked {n} tokens of {name}")
