"""Keys as MCP resources (SPEC §18): ``agentstate://scopes/{kind}/{id}/keys/{key}``, a
key's JSON value, and subscriptions that tell a client within a second of any write to a
key it subscribed to, by any process (``Subscriptions``: one follower of the change feed).

Both eras of the protocol are served: ``resources/subscribe`` (2025: updates on the
connection's own stream) and ``subscriptions/listen`` (2026: the listen request's response
is the stream). Reading and subscribing need read access to the key's scope (grants, the
session rule); a subscriber whose token is revoked is dropped at the next update.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, unquote

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY, ResourceUpdated, event_to_notification

import agentstate
from agentstate.errors import AgentStateError, CursorExpired, InvalidKey, NotFound, TooLarge
import agentstate.server._http as h
from agentstate.server._api import DOTS

from ._caller import Caller, Host

log = logging.getLogger("agentstate.mcp")

TEMPLATE = "agentstate://scopes/{kind}/{id}/keys/{key}"
_URI = re.compile(r"agentstate://scopes/([^/?#]+)/([^/?#]+)/keys/([^/?#]+)")
LIST_PAGE = 100  # resources one resources/list answer holds
SEND_WITHIN = 1.0  # seconds an update may take to hand to one subscriber before it is dropped
MAX_KEYS = 1000  # keys one connection or listen stream may be subscribed to
Target = tuple[str, str, str]  # kind, scope id, key


def _segment(text: str) -> str:
    """A path segment: keys are URI-safe, but "." and ".." would be dropped by a client's URL
    parser, so they are written as the State API's paths write them (``~.`` and ``~..``)."""
    return {v: k for k, v in DOTS.items()}.get(text, quote(text, safe=":"))


def key_uri(kind: str, scope_id: str, key: str) -> str:
    return f"agentstate://scopes/{kind}/{_segment(scope_id)}/keys/{_segment(key)}"


def parse_uri(uri: str) -> Target:
    """(kind, scope id, key) of a key's URI; InvalidKey for anything else."""
    m = _URI.fullmatch(uri)
    if m is None:
        raise InvalidKey(f"not a key's URI ({TEMPLATE}): {uri[:300]!r}")
    kind, scope_id, key = (DOTS.get(unquote(s), unquote(s)) for s in m.groups())
    return kind, scope_id, key


def as_mcp_error(e: Exception) -> MCPError:
    """A refusal as a JSON-RPC error (a resource read or a subscription is not a tool call):
    the §12 error body as its data, so a client reads the same code and fields."""
    if isinstance(e, MCPError):
        return e
    if not isinstance(e, AgentStateError):
        log.exception("unexpected error in a resource request", exc_info=e)
        return MCPError(types.INTERNAL_ERROR, "internal error (see the server's log)")
    code = types.INVALID_PARAMS if e.status < 500 else types.INTERNAL_ERROR
    return MCPError(code, f"{e.code}: {e}", h.error_body(e))


async def _readable(c: Caller, uri: str) -> tuple[Target, agentstate.Scope]:
    target = parse_uri(uri)
    return target, await h.blocking(c.need_scope, target[0], target[1], False)


class Subscriber:
    """A connection (2025) or a listen stream (2026) told of updates: ``send(uri)``, after
    ``still()`` says its caller may still read (a revoked token: it raises)."""

    def __init__(self, send: Callable[[str], Awaitable[None]],
                 still: Callable[[], Awaitable[Any]]) -> None:
        self.send = send
        self.still = still
        self.gone = anyio.Event()  # set when it is dropped (its token revoked, say)
        self.keys: set[Target] = set()


class Subscriptions:
    """Who is subscribed to which key, and one follower of the feed's kv changes (started
    at the first subscription, before it is answered, so no later write is missed)."""

    def __init__(self, db: agentstate.Database) -> None:
        self.db = db
        self.by_key: dict[Target, dict[Subscriber, set[str]]] = {}
        self.task: asyncio.Task[None] | None = None
        self._starting = asyncio.Lock()

    async def add(self, sub: Subscriber, target: Target, uri: str) -> None:
        sub.keys.add(target)
        if len(sub.keys) > MAX_KEYS:
            sub.keys.discard(target)
            raise TooLarge(f"subscribed to {MAX_KEYS} keys already, the limit for one client: "
                           "unsubscribe from some first", MAX_KEYS + 1, MAX_KEYS)
        async with self._starting:
            if self.task is None:
                head = await h.blocking(self.db.last_change)
                self.task = asyncio.create_task(self._follow(head))
        self.by_key.setdefault(target, {}).setdefault(sub, set()).add(uri)

    def remove(self, sub: Subscriber, target: Target | None = None, uri: str | None = None) -> None:
        for t in [target] if target is not None else list(self.by_key):
            subs = self.by_key.get(t, {})
            uris = subs.get(sub)
            if uris is not None:
                uris.discard(uri) if uri is not None else uris.clear()
                if not uris:
                    del subs[sub]
            if not subs:
                self.by_key.pop(t, None)
            if sub not in subs:
                sub.keys.discard(t)
        if target is None:
            sub.gone.set()

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _follow(self, cursor: int) -> None:
        while True:
            try:
                async for ch in self.db.awatch(cursor, topic="kv"):
                    cursor = ch.seq
                    await self._updated((str(ch.kind), str(ch.scope_id), str(ch.key)))
            except asyncio.CancelledError:
                raise
            except CursorExpired:  # fell behind the feed's retention: go on from now
                cursor = await h.blocking(self.db.last_change)
            except Exception:  # the store hiccuped (busy, restarted): look again shortly
                log.warning("following the change feed failed; retrying", exc_info=True)
                await asyncio.sleep(1.0)

    async def _updated(self, target: Target) -> None:
        for sub, uris in list(self.by_key.get(target, {}).items()):
            try:
                await sub.still()
            except AgentStateError:
                self.remove(sub)  # its token was revoked or expired: told nothing more
                continue
            for uri in list(uris):
                with anyio.move_on_after(SEND_WITHIN):
                    await sub.send(uri)


class Resources:
    """The resource handlers of one server (``_server.build``)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.subs = Subscriptions(host.db)

    async def templates(self, ctx: Any, params: Any) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=[types.ResourceTemplate(
            name="key", uri_template=TEMPLATE, mime_type="application/json",
            description=("A key of a scope, as JSON: kind is thread, session, agent, user or "
                         "app. Subscribe to be told when any agent writes it."))])

    async def list(self, ctx: Any, params: types.PaginatedRequestParams | None
                   ) -> types.ListResourcesResult:
        """The keys of the scopes a caller's grants name one by one (``user:u-7``, not
        ``user:*``), a page at a time; any other key is reached through the template."""
        try:
            c = await self.host.caller(ctx)
            scopes = [r for r in c.rules or () if not r.prefix and r.kind != "runs"]
            i, after = 0, None
            if params is not None and params.cursor:
                n, _, rest = params.cursor.partition(":")
                if not re.fullmatch(r"[0-9]{1,9}", n):
                    raise InvalidKey(f"not a cursor of this list: {params.cursor[:100]!r}")
                i, after = int(n), rest or None
            out: list[types.Resource] = []
            while i < len(scopes) and len(out) < LIST_PAGE:
                rule = scopes[i]
                try:
                    s = await h.blocking(c.need_scope, rule.kind, rule.id, False)
                    keys = await h.blocking(s.list, after=after, limit=LIST_PAGE - len(out))
                except NotFound:  # a grant naming another's session: none of its keys
                    i, after = i + 1, None
                    continue
                out += [types.Resource(name=k, uri=key_uri(s.kind, s.id, k),
                                       mime_type="application/json",
                                       description=f"{k} in {s.kind}:{s.id}") for k in keys]
                if len(out) < LIST_PAGE:
                    i, after = i + 1, None
                elif keys:
                    after = keys[-1]
            more = i < len(scopes)
            return types.ListResourcesResult(resources=out,
                                             next_cursor=f"{i}:{after or ''}" if more else None)
        except Exception as e:
            raise as_mcp_error(e) from None

    async def read(self, ctx: Any, params: types.ReadResourceRequestParams
                   ) -> types.ReadResourceResult:
        try:
            c = await self.host.caller(ctx)
            (kind, scope_id, key), s = await _readable(c, params.uri)
            v = await h.blocking(s.get_versioned, key)
            if v.version == 0:
                raise NotFound(f"no key {key!r} in {kind}:{scope_id}")
            text = (await h.blocking(h.dumps, v.value)).decode("utf-8", "surrogatepass")
        except Exception as e:
            raise as_mcp_error(e) from None
        return types.ReadResourceResult(contents=[types.TextResourceContents(
            uri=params.uri, mime_type="application/json", text=text,
            _meta={"version": v.version})])

    # -- 2025: resources/subscribe, updates on the connection's own stream ---------------

    async def subscribe(self, ctx: Any, params: types.SubscribeRequestParams) -> types.EmptyResult:
        try:
            c = await self.host.caller(ctx)
            target, _ = await _readable(c, params.uri)
            await self.subs.add(self._connection_subscriber(ctx, c), target, params.uri)
        except Exception as e:
            raise as_mcp_error(e) from None
        return types.EmptyResult()

    async def unsubscribe(self, ctx: Any, params: types.UnsubscribeRequestParams
                          ) -> types.EmptyResult:
        try:
            target = parse_uri(params.uri)
        except Exception as e:
            raise as_mcp_error(e) from None
        sub = self._connection_state(ctx).get("agentstate.subscriber")
        if sub is not None:
            self.subs.remove(sub, target, params.uri)
        return types.EmptyResult()

    @staticmethod
    def _connection_state(ctx: Any) -> dict[str, Any]:
        # The SDK hands handlers the per-request ServerSession; its connection (state that
        # lasts across requests, and the teardown when the client leaves) is not public yet.
        conn = ctx.session._connection
        return conn.state

    def _connection_subscriber(self, ctx: Any, c: Caller) -> Subscriber:
        """The connection's one subscriber, made at its first subscription and dropped when
        the client leaves (its teardown)."""
        conn = ctx.session._connection
        sub = conn.state.get("agentstate.subscriber")
        if sub is None or sub.gone.is_set():
            async def send(uri: str) -> None:
                await conn.notify("notifications/resources/updated", {"uri": uri})

            sub = conn.state["agentstate.subscriber"] = Subscriber(send, c.again)
            conn.exit_stack.callback(self.subs.remove, sub)
        return sub

    # -- 2026: subscriptions/listen, the request's response is the stream ---------------

    async def listen(self, ctx: Any, params: types.SubscriptionsListenRequestParams
                     ) -> types.SubscriptionsListenResult:
        """As the SDK's ``ListenHandler``: acknowledged first, then an update per write of a
        subscribed key, until the client leaves (or its token is revoked: an error). An open
        stream counts as one of the API's long polls (``Waits``: bounded per principal)."""
        wanted = params.notifications
        uris = list(wanted.resource_subscriptions or ())
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: ctx.request_id}
        updates = anyio.create_memory_object_stream[str](1024)

        async def send(uri: str) -> None:
            try:
                updates[0].send_nowait(uri)
            except anyio.WouldBlock:  # a client that stopped reading: drop this update
                pass

        with contextlib.ExitStack() as stack:
            try:
                c = await self.host.caller(ctx)
                if len(uris) > MAX_KEYS:
                    raise TooLarge(f"{len(uris)} keys in one subscription, over the limit of "
                                   f"{MAX_KEYS}", len(uris), MAX_KEYS)
                targets = [(await _readable(c, uri))[0] for uri in uris]
                if c.waits is not None:  # Busy past its limit
                    stack.enter_context(c.waits.hold(c.principal()))
                sub = Subscriber(send, c.again)
                stack.callback(self.subs.remove, sub)
                for target, uri in zip(targets, uris):
                    await self.subs.add(sub, target, uri)
            except Exception as e:
                raise as_mcp_error(e) from None
            stack.callback(updates[0].close)
            stack.callback(updates[1].close)
            honored = types.SubscriptionFilter(
                tools_list_changed=wanted.tools_list_changed or None,  # never sent: lists stay
                prompts_list_changed=wanted.prompts_list_changed or None,
                resources_list_changed=wanted.resources_list_changed or None,
                resource_subscriptions=uris or None)
            await ctx.session.send_notification(
                types.SubscriptionsAcknowledgedNotification(
                    params=types.SubscriptionsAcknowledgedNotificationParams(
                        notifications=honored, _meta=meta)),
                related_request_id=ctx.request_id)
            async with anyio.create_task_group() as tg:
                async def end_when_dropped() -> None:
                    await sub.gone.wait()
                    tg.cancel_scope.cancel()

                tg.start_soon(end_when_dropped)
                async for uri in updates[1]:
                    await ctx.session.send_notification(
                        event_to_notification(ResourceUpdated(uri), meta),
                        related_request_id=ctx.request_id)
        raise as_mcp_error(await _denied(c))


async def _denied(c: Caller) -> Exception:
    """Why a listen stream was dropped: its caller may no longer read."""
    try:
        await c.again()
    except AgentStateError as e:
        return e
    return MCPError(types.INTERNAL_ERROR, "the subscription ended")
