"""State as tools: the MCP server (SPEC §18), on the official MCP Python SDK (the ``mcp``
extra: ``pip install 'agentstate-db[mcp]'``).

- ``agentstate mcp`` serves it over stdio, on a local store or a remote one (``_server``).
- ``agentstate serve`` serves it over streamable HTTP at ``/mcp`` (``_http``), when the
  SDK is installed; ``over_http(api)`` is what the app mounts.

The tools are one table (``_tools.TOOLS``); their arguments one strict model each
(``_args``); who calls and what it may touch is ``_caller``; keys as resources and their
subscriptions are ``_resources``. Nothing here imports the SDK until it is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentstate.server._api import API


class _Absent:
    """``/mcp`` when the SDK is not installed: nothing is served there."""

    middleware: list[Any] = []

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        yield


def over_http(api: API) -> Any:
    """The ``/mcp`` endpoint of the State API ``api`` (``_http.OverHTTP``): its
    ``middleware`` and its part of the lifespan, ``running()``."""
    try:
        import mcp  # noqa: F401
    except ImportError:
        return _Absent()
    from ._http import OverHTTP

    return OverHTTP(api)
