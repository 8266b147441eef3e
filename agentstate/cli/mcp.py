"""``agentstate mcp``: the store as MCP tools over stdio (SPEC §18; the mcp extra)."""

from __future__ import annotations

import click

import agentstate

from .. import _grants
from ._base import Ctx, cli, fail, pass_obj


@cli.command("mcp")
@click.option("--db", "target", metavar="TARGET",
              help="The store: a file or a postgresql:// URL [default: the command's --db, "
                   "$AGENTSTATE_DB, else ./agentstate.db]. It must exist (agentstate init).")
@click.option("--url", metavar="URL", help="Or a store served by agentstate serve, reached with "
                                           "--token (its grants and owner rule apply).")
@click.option("--token", metavar="T", help="The --url server's bearer token [default: "
                                           "$AGENTSTATE_TOKEN].")
@click.option("--read-only", is_flag=True, help="Serve only the tools that write nothing.")
@click.option("--as", "as_name", metavar="NAME", help="The principal the tools act as on a local "
                                                      "store (its sessions are its own) [default: mcp].")
@click.option("--grant", "grants", multiple=True, metavar="RULE",
              help="KIND:ID[=r|rw]: hold the tools to these rules, as a token with these grants "
                   "is (repeat for more; without any, every scope and run).")
@pass_obj
def mcp(obj: Ctx, target: str | None, url: str | None, token: str | None, read_only: bool,
        as_name: str | None, grants: tuple[str, ...]) -> None:
    """Serve the store to MCP clients over stdin and stdout (needs the mcp extra)."""
    try:
        import anyio

        from ..mcp._caller import Host, LocalHost, RemoteHost
        from ..mcp._server import serve_stdio
    except ImportError as e:
        fail("usage_error", f"mcp needs the mcp extra: pip install 'agentstate-db[mcp]' ({e})")
    host: Host
    if url is not None:
        if target is not None:
            raise click.UsageError("--db and --url name two stores: give one")
        if as_name is not None or grants:
            raise click.UsageError("with --url the token decides who acts and what it may use: "
                                   "--as and --grant are for a local store")
        db = agentstate.connect(url, token)
        click.get_current_context().call_on_close(db.close)
        db.last_change()  # a wrong URL or token fails here, in one line, not at every call
        host = RemoteHost(db, read_only)
    else:
        if token is not None:
            raise click.UsageError("--token goes with --url")
        principal = agentstate.Principal(as_name if as_name is not None else "mcp")
        rules = _grants.parse(grants or None)
        if target is not None:
            obj.db_path = target
        host = LocalHost(obj.open(), principal, rules, read_only)
    try:
        anyio.run(serve_stdio, host)
    except KeyboardInterrupt:  # Ctrl-C in a terminal: the client is the person, and left
        pass
