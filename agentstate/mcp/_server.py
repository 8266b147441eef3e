"""The MCP server (SPEC §18) on the official SDK's low-level ``Server``: the tools of
``_tools.TOOLS``, the key resources of ``_resources``, for any ``Host`` (stdio on a local or
remote store, or ``/mcp`` of ``agentstate serve``).

A call never crashes the server: arguments are checked by the tool's strict model, a
refusal is a tool result with ``isError`` and the State API's error body (SPEC §12, the
server's own ``error_body``), and anything unexpected is logged and answered as an
internal error, after which the next request is served as usual.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
from mcp.server.lowlevel.server import Server
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ValidationError

import agentstate
from agentstate.errors import AgentStateError, Forbidden, InvalidValue
import agentstate.server._http as h

from ._caller import Host
from ._resources import Resources, Subscriptions
from ._tools import BY_NAME, TOOLS, Tool

log = logging.getLogger("agentstate.mcp")

INSTRUCTIONS = (
    "agentstate: a transactional store of state shared by agents and processes. Keys live in "
    'scopes written "KIND:ID" (thread, session, agent, user, app). Every key has a version: '
    "to change a value based on what you read, pass the version you read as if_version, and "
    "on version_conflict read again and retry. Append to lists (state_append) rather than "
    "rewriting them. A refused call answers {\"error\": {\"code\", \"message\", ...}}.")


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema a model is shown, without pydantic's generated titles."""
    def clean(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (dict((n, clean(v)) for n, v in node[k].items()) if k in ("properties", "$defs")
                        else clean(node[k])) for k in node if k != "title"}
        if isinstance(node, list):
            return [clean(x) for x in node]
        return node
    return clean(model.model_json_schema())


def _tool(t: Tool) -> types.Tool:
    return types.Tool(name=t.name, description=t.description, input_schema=_schema(t.args),
                      annotations=types.ToolAnnotations(read_only_hint=t.reads,
                                                        destructive_hint=t.destructive,
                                                        open_world_hint=False))


def _text(data: Any) -> str:
    return h.dumps(data).decode("utf-8", "surrogatepass")


def _answer(data: Any, error: bool = False, text: str | None = None) -> types.CallToolResult:
    """A tool's answer: its JSON as text (what a model reads) and as structured content."""
    return types.CallToolResult(content=[types.TextContent(text=text or _text(data))],
                                structured_content=data, is_error=error)


def refused(e: BaseException) -> types.CallToolResult:
    """A refused call as a tool result a model can act on: the State API's error body."""
    if isinstance(e, json.JSONDecodeError):  # stored bytes read as JSON (SPEC §2)
        e = InvalidValue(f"stored bytes are not JSON: {e}")
    if isinstance(e, AgentStateError):
        return _answer(h.error_body(e), error=True)
    log.exception("unexpected error in a tool call", exc_info=e)
    return _answer({"error": {"code": "error", "message": "internal error (see the server's log)"}},
                   error=True)


def arguments(model: type[BaseModel], args: dict[str, Any] | None) -> Any:
    """The arguments as the tool's model; InvalidValue naming every problem."""
    try:
        return model.model_validate(args or {})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'arguments'}: {err['msg']}"
                             for err in e.errors(include_url=False))
        raise InvalidValue(f"bad arguments: {problems}") from None


class Tools:
    """The tool handlers of one server."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.served = [t for t in TOOLS if t.reads or not host.read_only]
        self.listed = [_tool(t) for t in self.served]

    async def list(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.listed)

    async def call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        tool = BY_NAME.get(params.name)
        if tool is None or tool not in self.served:
            if tool is not None:
                return refused(Forbidden(f"{tool.name} writes, and this server is read-only "
                                         "(agentstate mcp --read-only)"))
            return _answer({"error": {"code": "unknown_tool", "message": (
                f"no tool {params.name[:100]!r}; the tools are "
                + ", ".join(t.name for t in self.served))}}, error=True)
        try:
            c = await self.host.caller(ctx)  # who, first: a bad token is told nothing else
            a = arguments(tool.args, params.arguments)
            if inspect.iscoroutinefunction(tool.run):
                return _answer(await tool.run(c, a))

            def run() -> tuple[Any, str]:  # an answer may be big: encoded off the event loop
                out = tool.run(c, a)
                return out, _text(out)

            out, text = await h.blocking(run)
            return _answer(out, text=text)
        except Exception as e:
            return refused(e)


def build(host: Host) -> Server[Any]:
    """An MCP server of the store ``host`` serves."""
    tools, resources = Tools(host), Resources(host)

    @contextlib.asynccontextmanager
    async def lifespan(server: Server[Any]) -> AsyncIterator[dict[str, Any]]:
        resources.subs = Subscriptions(host.db)  # one per run: its task and lock on this loop
        async with host.running():
            try:
                yield {}
            finally:
                resources.subs.close()

    return Server(
        "agentstate", version=agentstate.__version__, title="agentstate",
        description="State shared by agents: versioned keys, atomic appends, a change feed, "
                    "runs, sessions with one turn at a time, tool calls made at most once.",
        instructions=INSTRUCTIONS, lifespan=lifespan,
        on_list_tools=tools.list, on_call_tool=tools.call,
        on_list_resources=resources.list, on_list_resource_templates=resources.templates,
        on_read_resource=resources.read, on_subscribe_resource=resources.subscribe,
        on_unsubscribe_resource=resources.unsubscribe, on_subscriptions_listen=resources.listen,
    )


# -- stdio ------------------------------------------------------------------------------

UNREADABLE = "agentstate/unreadable"


class Unreadable(types.RequestParams):
    method: str
    reason: str


async def _unreadable(ctx: Any, params: Unreadable) -> types.CallToolResult:
    """The answer to a request the SDK could not read (``Stdin``): for a tool call, a refused
    call as any other; else a JSON-RPC error. Either way, with its id: the client waits no more."""
    e = InvalidValue(f"the MCP SDK cannot read this {params.method} request ({params.reason}): "
                     "values nested more than about 190 levels deep, and lone surrogates in "
                     "strings, do not pass its JSON parser")
    if params.method == "tools/call":
        return refused(e)
    raise MCPError(types.INVALID_PARAMS, str(e), h.error_body(e))


class Stdin:
    """This process's stdin for the SDK's stdio transport, with one change: a request its
    JSON parser cannot read, but whose id the State API's own parser finds (it reads any
    depth up to the store's, without recursion), reaches the server as an
    ``agentstate/unreadable`` request with that id, and is answered. The SDK drops such a
    line, and its client would wait for an answer until it gave up."""

    def __init__(self) -> None:
        import io
        import sys

        import anyio

        self.lines = anyio.wrap_file(io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8",
                                                      errors="replace"))

    async def __aiter__(self) -> AsyncIterator[str]:
        import pydantic_core

        async for line in self.lines:
            try:
                pydantic_core.from_json(line)
            except ValueError as e:
                line = self.answerable(line, e) or line
            yield line

    @staticmethod
    def answerable(line: str, e: ValueError) -> str | None:
        import agentstate.server._json as _json
        from agentstate.server._limits import LIMITS

        try:
            msg = _json.parse(line.encode("utf-8", "surrogatepass"), LIMITS.json_values)
        except (AgentStateError, ValueError):
            return None
        if not isinstance(msg, dict) or type(msg.get("id")) not in (int, str) \
                or type(msg.get("method")) is not str:
            return None
        params = msg.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        return json.dumps({"jsonrpc": "2.0", "id": msg["id"], "method": UNREADABLE, "params": {
            "method": msg["method"][:100], "reason": str(e).splitlines()[0][:200],
            **({"_meta": meta} if isinstance(meta, dict) else {})}})


async def serve_stdio(host: Host) -> None:
    """Serve MCP on this process's stdin and stdout until the client closes them."""
    from mcp.server.stdio import stdio_server

    server = build(host)
    server.add_request_handler(UNREADABLE, Unreadable, _unreadable)
    async with stdio_server(stdin=Stdin()) as (read, write):  # type: ignore[arg-type]
        await server.run(read, write, server.create_initialization_options())
