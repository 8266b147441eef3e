"""The HTTP API: serve, and its tokens."""

from __future__ import annotations

import sys
from typing import Any

import click

from ._base import ARGS, Ctx, cli, fail, pass_obj, table


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(0, 65535))
@pass_obj
def serve(obj: Ctx, host: str, port: int) -> None:
    """Serve the store over HTTP (the State API; needs the server extra)."""
    try:
        import uvicorn

        from ..server import create_app
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
