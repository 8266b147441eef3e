"""``agentstate serve``: the State API over HTTP (SPEC §12). Needs the ``server`` extra."""

from .app import create_app

__all__ = ["create_app"]
