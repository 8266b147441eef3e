"""The ``agentstate`` command, built on the public objects only (SPEC §7).

One click group (``_base``); each module adds the subcommands of one subject.
"""

from __future__ import annotations

from . import feed, keys, mcp, past, runs, server, sessions, store
from ._base import cli

__all__ = ["cli", "main"]
_SUBCOMMANDS = (feed, keys, mcp, past, runs, server, sessions, store)  # imported for their commands


def main() -> None:
    cli()
