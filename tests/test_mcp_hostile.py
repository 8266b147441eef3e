"""The MCP server never crashes on bad input (SPEC §18): unknown tools, missing, ill-typed
or extra arguments, oversized and hostile values, malformed messages, a call cancelled or
a client gone mid-call; each is refused (or dropped, when it carries no id to answer) and
the next request is answered as usual. Real processes, the SDK's client and raw bytes."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from .conftest import REPO, digest, target
from .mcpclient import Reach, call, refusal, run

pytestmark = [pytest.mark.filterwarnings("ignore::mcp.shared.exceptions.MCPDeprecationWarning"),
              pytest.mark.slow_on_postgres]  # the MCP layer is one on both backends: PostgreSQL's cases in CI's slow run


@pytest.fixture(params=["stdio", "http"])
def reach(request, any_db, tmp_path):
    r = Reach(request.param, any_db, tmp_path)
    yield r
    r.close()


def test_bad_arguments_are_refused_with_the_store_s_error_and_change_nothing(reach):
    """Each bad call is an isError result with a §12 body naming the problem; nothing is
    written; the next call is answered."""
    deep = []
    for _ in range(150):  # within what the SDK's parser reads, beyond nothing the store allows
        deep = [deep]

    async def go():
        async with reach.client(mode="legacy") as c:
            await call(c, "state_put", scope="user:u", key="k", value=1)
            before = digest(reach.db)
            cases = [
                ("no_such_tool", {}, "unknown_tool"),
                ("state_get", {}, "invalid_value"),  # missing arguments
                ("state_get", {"scope": 1, "key": "k"}, "invalid_value"),
                ("state_get", {"scope": "user:u", "key": "k", "extra": 1}, "invalid_value"),
                ("state_put", {"scope": "user:u", "key": "k"}, "invalid_value"),  # no value
                ("state_put", {"scope": "user:u", "key": "k", "value": 1, "if_version": 1.5},
                 "invalid_value"),
                ("state_put", {"scope": "user:u", "key": "k", "value": 1, "if_version": True},
                 "invalid_value"),
                ("state_put", {"scope": "user:u", "key": "k", "value": 1, "ttl": -1},
                 "invalid_value"),
                ("state_put", {"scope": "user:u", "key": "k", "value": 2 ** 64}, "invalid_value"),
                ("state_put", {"scope": "user:u", "key": "k", "value": "a\x00b"}, "invalid_value"),
                ("state_put", {"scope": "user:u", "key": "k", "value": "x" * (2 << 20)},
                 "too_large"),
                ("state_append", {"scope": "user:u", "key": "l", "items": "notalist"},
                 "invalid_value"),
                ("state_slice", {"scope": "user:u", "key": "k", "limit": 0}, "invalid_value"),
                ("state_slice", {"scope": "user:u", "key": "k", "limit": 10 ** 6},
                 "invalid_value"),
                ("state_update", {"scope": "user:u", "key": "k", "patch": {}}, "invalid_value"),
                ("changes_wait", {"since": -1}, "invalid_value"),
                ("changes_wait", {"wait": 10 ** 6}, "invalid_value"),
                ("runs_write", {"run_id": "r", "entries": [{"no": "seq"}], "create": True},
                 "invalid_value"),
                ("runs_write", {"run_id": "r", "snapshot": [1], "create": True}, "invalid_value"),
                ("call_settle", {"run_id": "r", "call_id": "c"}, "invalid_value"),
                ("turn_start", {"session_id": "s-none"}, "not_found"),
                ("turn_fail", {"turn_id": "t"}, "invalid_value"),
                ("session_create", {"metadata": [1]}, "invalid_value"),
            ]
            for name, args, code in cases:
                e = await refusal(c, name, **args)
                assert e["code"] == code, (name, args, e)
            big = await refusal(c, "state_append", scope="user:u", key="l", items=["x" * 600_000] * 2)
            assert (big["code"], big["limit"]) == ("too_large", 1 << 20)
            assert digest(reach.db) == before
            assert (await call(c, "state_put", scope="user:u", key="deep", value=deep))[
                "version"] == 1
            assert (await call(c, "state_get", scope="user:u", key="k"))["value"] == 1

    run(go())


def test_subscriptions_past_the_limit_are_refused(reach):
    """One client may subscribe to at most 1,000 keys (MAX_KEYS): a listen naming more, or
    one subscribe past them, is too_large; the server goes on."""
    from mcp.shared.exceptions import MCPError

    from agentstate.mcp._resources import MAX_KEYS

    uris = [f"agentstate://scopes/user/u/keys/k{i}" for i in range(MAX_KEYS + 1)]

    async def go():
        async with reach.client() as c:
            with pytest.raises(MCPError) as e:
                async with c.listen(resource_subscriptions=uris):
                    pass
            assert e.value.data["error"]["code"] == "too_large"
        async with reach.client(mode="legacy") as c:
            for uri in uris[:MAX_KEYS]:
                await c.subscribe_resource(uri)
            with pytest.raises(MCPError) as e:
                await c.subscribe_resource(uris[-1])
            assert e.value.data["error"]["code"] == "too_large"
            await c.unsubscribe_resource(uris[0])
            await c.subscribe_resource(uris[-1])  # room again
            assert (await call(c, "state_get", scope="user:u", key="k"))["version"] == 0

    run(go())


def test_a_cancelled_call_leaves_the_server_answering(reach):
    """A changes_wait cancelled by its client while it waits (notifications/cancelled, or
    the client gone over HTTP) ends; the server answers the next call at once."""
    async def go():
        async with reach.client(mode="legacy") as c:
            waiting = asyncio.create_task(call(c, "changes_wait", wait=60))
            await asyncio.sleep(1.0)
            waiting.cancel()
            start = time.monotonic()
            assert (await call(c, "state_get", scope="user:u", key="k"))["version"] == 0
            assert time.monotonic() - start < 10

    run(go())


def test_a_client_killed_mid_call_leaves_the_http_server_answering(any_db, tmp_path):
    """A client process killed (SIGKILL) while its changes_wait waits, and one whose body
    stops halfway: the server answers the next client, and still runs."""
    reach = Reach("http", any_db, tmp_path)
    try:
        served = reach.serve()
        token = reach.token("x")
        script = (
            "import asyncio, sys\n"
            "from tests.mcpclient import http, call\n"
            "async def go():\n"
            "    async with http(sys.argv[1], sys.argv[2]) as c:\n"
            "        print('calling', flush=True)\n"
            "        await call(c, 'changes_wait', wait=60)\n"
            "asyncio.run(go())\n")
        proc = subprocess.Popen([sys.executable, "-c", script, served.url + "/mcp", token],
                                cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "calling"
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        host, port = served.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as sock:  # a body that stops halfway
            sock.sendall(b"POST /mcp HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                         b"accept: application/json, text/event-stream\r\n"
                         b"authorization: Bearer " + token.encode() +
                         b"\r\ncontent-length: 100000\r\n\r\n" + b'{"jsonrpc":"2.0","id":1,')
            time.sleep(0.5)

        async def go():
            async with reach.client() as c:
                assert (await call(c, "state_put", scope="user:u", key="k", value=1)) == \
                    {"version": 1}

        run(go())
        assert served.proc.poll() is None
    finally:
        reach.close()


def test_malformed_http_bodies_are_refused_and_the_server_answers(any_db, tmp_path):
    """Not JSON, not JSON-RPC, over the size limit, or a session that does not exist: a 4xx
    answer each time, nothing written, and the next request is served."""
    reach = Reach("http", any_db, tmp_path)
    try:
        served = reach.serve()
        token = reach.token("x")
        url = served.url + "/mcp"
        headers = {"authorization": f"Bearer {token}", "content-type": "application/json",
                   "accept": "application/json, text/event-stream"}
        before = digest(any_db)
        with httpx.Client(timeout=30) as raw:
            for body in (b"not json", b"[]", b'{"jsonrpc":"2.0","id":1}', b"\xff\xfe",
                         b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + b"[" * 100_000,
                         b'{"x":"' + b"y" * (5 << 20) + b'"}'):
                r = raw.post(url, headers=headers, content=body)
                assert 400 <= r.status_code < 500, (body[:40], r.status_code, r.text[:200])
            r = raw.post(url, headers={**headers, "mcp-session-id": "f" * 32},
                         content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}))
            assert r.status_code == 404
        assert digest(any_db) == before

        async def go():
            async with reach.client() as c:
                await call(c, "state_put", scope="user:u", key="k", value=1)

        run(go())
    finally:
        reach.close()


class Raw:
    """``agentstate mcp`` spoken to in raw JSON-RPC lines (as a careless client would)."""

    def __init__(self, target: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "agentstate", "mcp", "--db", target],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})

    def send(self, line: str | bytes) -> None:
        self.p.stdin.write((line.encode() if isinstance(line, str) else line) + b"\n")
        self.p.stdin.flush()

    def answer(self, timeout: float = 30.0) -> dict | None:
        """The next line the server writes (None if there is none within ``timeout``)."""
        if not select.select([self.p.stdout], [], [], timeout)[0]:
            return None
        return json.loads(self.p.stdout.readline())

    def close(self) -> str:
        self.p.stdin.close()
        assert self.p.wait(30) == 0
        return self.p.stderr.read().decode()


def tool_call(id: int, name: str, arguments: str) -> str:
    return ('{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"%s","arguments":%s}}'
            % (id, name, arguments))


def test_malformed_stdio_messages_are_answered_or_dropped_and_the_server_goes_on(any_db):
    """Over stdio: a line that is not JSON, or too deep to find its id in, is dropped; NaN,
    an integer past 64 bits, a lone surrogate, a value nested past what the SDK's parser
    reads (yet within the store's 512 levels), a 3 MB value, an unknown method, arguments
    that are no object: each answered with its id; then a plain call answers as usual."""
    raw = Raw(target(any_db))
    try:
        raw.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"}}}))
        assert raw.answer()["id"] == 1
        raw.send('{"jsonrpc":"2.0","method":"notifications/initialized"}')
        deep = "[" * 300 + "]" * 300
        answered = [
            (2, tool_call(2, "state_put", '{"scope":"user:u","key":"k","value":NaN}')),
            (3, tool_call(3, "state_put", '{"scope":"user:u","key":"k","value":1e999}')),
            (4, tool_call(4, "state_put", '{"scope":"user:u","key":"k","value":%d}' % 2 ** 70)),
            (5, tool_call(5, "state_put", '{"scope":"user:u","key":"k","value":"\\ud800"}')),
            (6, tool_call(6, "state_put", '{"scope":"user:u","key":"k","value":%s}' % deep)),
            (7, tool_call(7, "state_put", '{"scope":"user:u","key":"k","value":"%s"}'
                          % ("x" * 3_000_000))),
            (8, tool_call(8, "state_get", "[1]")),
            (9, '{"jsonrpc":"2.0","id":9,"method":"no/such"}'),
        ]
        for id, line in answered:
            raw.send(line)
            a = raw.answer()
            assert a is not None and a["id"] == id, (id, a)
            if "result" in a:  # a tool call refused: its §12 body, as a tool result
                assert a["result"]["isError"] is True
                assert a["result"]["structuredContent"]["error"]["code"] in (
                    "invalid_value", "too_large"), a
            else:
                assert a["error"]["code"] in (-32602, -32601), a
        for line in (b"not json", b"\xff\xfe{", ("[" * 100_000).encode()):  # nothing to answer
            raw.send(line)
        raw.send(tool_call(10, "state_get", '{"scope":"user:u","key":"k"}'))
        a = raw.answer()
        assert a["id"] == 10 and a["result"]["structuredContent"] == {"value": None,
                                                                        "version": 0}
        assert raw.p.poll() is None
    finally:
        log = raw.close()
    assert "Traceback" not in log, log[-3000:]
