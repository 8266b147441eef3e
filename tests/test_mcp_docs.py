"""The MCP client configurations in docs/mcp.md work as written (SPEC §18): each JSON block
of the page is parsed, and every server it names is started as a client would start it —
``command`` and ``args`` (and ``env``) through the MCP SDK's stdio client, ``url`` and
``headers`` through its streamable HTTP client — then listed and called.

The page's placeholders stand for what a reader fills in: ``/path/agent.db`` (a store made
with ``agentstate init``), ``http://127.0.0.1:8765`` (a running ``agentstate serve``), the
token (``${AGENTSTATE_TOKEN}``, or the text in angle brackets). The command ``agentstate`` is
this checkout's, as in tests/docs_examples.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

import agentstate

from . import docs_examples as dx
from .conftest import REPO
from .mcpclient import call
from .serverproc import serve

PAGE = dx.DOCS / "mcp.md"
SERVED = "http://127.0.0.1:8765"


def configurations() -> list[tuple[str, dict]]:
    """(where, server entry) for every server of every JSON block of the page."""
    out = []
    for block in dx.parse(PAGE).blocks:
        if block.lang != "json":
            continue
        assert block.marker == "skip" and "test_mcp_docs" in block.why, block.where()
        servers = json.loads(block.code)["mcpServers"]
        out += [(f"{block.where()} {name}", entry) for name, entry in servers.items()]
    return out


def test_the_page_shows_a_configuration_of_each_kind():
    """A local store over stdio, one with --as and --grant, a server over HTTP, and a server
    through agentstate mcp --url: the kinds a reader needs."""
    entries = [e for _, e in configurations()]
    args = [" ".join(e.get("args", ())) for e in entries]
    assert {"command": "agentstate", "args": ["mcp", "--db", "/path/agent.db"]} in entries
    assert any("--grant" in a and "--as" in a for a in args)
    assert any(e.get("url", "").endswith("/mcp") for e in entries)
    assert any("--url" in a for a in args)


def _fill(text: str, db: str, url: str, token: str) -> str:
    text = text.replace("/path/agent.db", db).replace(SERVED, url)
    text = text.replace("${AGENTSTATE_TOKEN}", token)
    return re.sub(r"<[^>]*token[^>]*>", token, text)


@pytest.mark.parametrize("where,entry", configurations(), ids=[w for w, _ in configurations()])
def test_each_configuration_starts_a_server_that_answers(where, entry, tmp_path):
    """Started as the configuration says, the server lists its tools and writes and reads a
    key in the store the configuration names."""
    db = str(tmp_path / "agent.db")
    subprocess.run([sys.executable, "-m", "agentstate", "--db", db, "init"], check=True,
                   capture_output=True)
    served = serve(db) if "url" in entry or SERVED in json.dumps(entry) else None
    try:
        token = ""
        if served:
            with agentstate.open(db) as store:
                token = store.tokens.create("support-bot", grants=["agent:support-bot",
                                                                   "user:*=r"])
        filled = json.loads(_fill(json.dumps(entry), db, served.url if served else "", token))
        asyncio.run(_exercise(filled, tmp_path))
    finally:
        if served:
            served.stop()
    with agentstate.open(db) as store:  # the store the configuration named was written
        assert store.scope("agent", "support-bot").get("note") == "seen"


async def _exercise(entry: dict, tmp: Path) -> None:
    if "command" in entry:
        assert entry["command"] == "agentstate"
        bindir = tmp / ".bin"  # this checkout's command, as tests/docs_examples.py makes it
        bindir.mkdir()
        (bindir / "agentstate").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m agentstate "$@"\n')
        (bindir / "agentstate").chmod(0o755)
        env = {**entry.get("env", {}), "PYTHONPATH": str(REPO),
               "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
        params = StdioServerParameters(command="agentstate", args=entry["args"], env=env,
                                       cwd=tmp)
        with open(tmp / "stderr.log", "w") as errlog:
            async with Client(stdio_client(params, errlog=errlog), mode="legacy") as c:
                await _answers(c)
    else:
        assert entry.get("type", "http") == "http"
        async with create_mcp_http_client(headers=entry["headers"]) as h:
            async with Client(streamable_http_client(entry["url"], http_client=h),
                              mode="legacy") as c:
                await _answers(c)


async def _answers(c: Client) -> None:
    assert "state_put" in {t.name for t in (await c.list_tools()).tools}
    await call(c, "state_put", scope="agent:support-bot", key="note", value="seen")
    assert (await call(c, "state_get", scope="agent:support-bot", key="note"))["value"] == "seen"
