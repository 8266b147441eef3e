"""The official MCP SDK's own client against real agentstate processes (SPEC §18):
``agentstate mcp`` over stdio, and ``/mcp`` of ``agentstate serve`` over streamable HTTP.

``Reach`` opens clients on one store either way, as a principal with grants: over stdio
an ``agentstate mcp --as NAME --grant RULE ...`` process; over HTTP a token made for NAME
with those grants, on one ``agentstate serve`` of the store started for the test.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import agentstate

from .conftest import REPO, target
from .serverproc import Served, serve

ENV = {"PYTHONPATH": str(REPO)}  # merged over the SDK's default environment (no AGENTSTATE_*)
MODES = ("legacy", "auto")  # the 2025 handshake (today's clients), and 2026-07-28 (the SDK's own)


class Refused(AssertionError):
    """A tool answered isError where success was expected."""


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def call(c: Client, name: str, **args: Any) -> Any:
    """A tool's structured answer; Refused (with the error body) if it was refused."""
    r = await c.call_tool(name, args)
    if r.is_error:
        raise Refused(f"{name} refused: {r.structured_content}")
    return r.structured_content


async def refusal(c: Client, name: str, **args: Any) -> dict[str, Any]:
    """The error of a call that must be refused: ``{"code", "message", ...}``."""
    r = await c.call_tool(name, args)
    assert r.is_error, f"{name}({args}) was not refused: {r.structured_content}"
    body = r.structured_content
    assert set(body) == {"error"} and {"code", "message"} <= set(body["error"]), body
    assert r.content[0].text.startswith('{"error":'), r.content  # the same body, as text
    return body["error"]  # type: ignore[no-any-return]


def stdio_params(*args: str, env: dict[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=["-m", "agentstate", "mcp", *args],
                                 env={**ENV, **(env or {})})


@asynccontextmanager
async def stdio(*args: str, mode: str = "auto", log: Path | None = None,
                env: dict[str, str] | None = None, **kw: Any) -> AsyncIterator[Client]:
    """A client of a new ``agentstate mcp ARGS...`` process (stderr into ``log``)."""
    from mcp.client.stdio import stdio_client

    async with AsyncExitStack() as stack:
        errlog = stack.enter_context(open(log, "a")) if log else sys.stderr
        c = await stack.enter_async_context(
            Client(stdio_client(stdio_params(*args, env=env), errlog=errlog), mode=mode, **kw))
        yield c


@asynccontextmanager
async def http(url: str, token: str | None, mode: str = "auto",
               **kw: Any) -> AsyncIterator[Client]:
    """A client of ``url`` (``.../mcp``) with ``Authorization: Bearer token``."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with create_mcp_http_client(headers=headers) as http_client:
        async with Client(streamable_http_client(url, http_client=http_client), mode=mode,
                          **kw) as c:
            yield c


class Reach:
    """Clients of one store, over ``how`` (stdio or http)."""

    def __init__(self, how: str, db: agentstate.Database, tmp: Path) -> None:
        self.how, self.db, self.tmp = how, db, tmp
        self.target = target(db)
        self.log = tmp / "mcp-stderr.log"
        self.served: Served | None = None

    def serve(self) -> Served:
        if self.served is None:
            self.served = serve(self.target)
        return self.served

    def token(self, name: str = "mcp", grants: list[str] | None = None) -> str:
        self.serve()
        return self.db.tokens.create(name, grants=grants)

    def client(self, name: str = "mcp", grants: list[str] | None = None, read_only: bool = False,
               mode: str = "auto", **kw: Any) -> Any:
        if self.how == "stdio":
            args = ["--db", self.target, "--as", name]
            args += [a for g in grants or () for a in ("--grant", g)]
            return stdio(*args, *(["--read-only"] if read_only else []), mode=mode, log=self.log,
                         **kw)
        assert not read_only, "read-only is agentstate mcp's (stdio)"
        return http(self.serve().url + "/mcp", self.token(name, grants), mode=mode, **kw)

    def close(self) -> None:
        if self.served is not None:
            self.served.stop()


async def until(check: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``check()`` held; AssertionError past ``timeout``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not check():
        if loop.time() - start > timeout:
            raise AssertionError(f"not within {timeout} s")
        await asyncio.sleep(0.01)
    return loop.time() - start


