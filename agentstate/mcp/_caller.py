"""Who calls a tool, on which store, and what it may touch.

A ``Host`` is where calls come from; ``Host.caller(ctx)`` says who one is:

- ``LocalHost``: ``agentstate mcp --db`` (stdio, a file or PostgreSQL): one principal
  (``--as``), held to ``--grant`` rules exactly as a token with those grants is.
- ``RemoteHost``: ``agentstate mcp --url`` (stdio, through the Python client): the
  server behind it applies its token's grants and the owner rule to every call.
- ``HttpHost``: ``/mcp`` in ``agentstate serve``: each request's bearer token, through the
  API's one place that authenticates (``API.caller``), checked again at every call.

The rules are the State API's, not copies: grants (``server._access.need``) and the
session rule (``SessionRule.check``: another's session is as absent as an unknown one).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import agentstate
from agentstate._encoding import check_key
from agentstate._grants import RUNS
from agentstate.errors import InvalidKey, Unauthorized
import agentstate.server._access as _access
from agentstate.server._access import Rules, SessionRule
from agentstate.server._api import API, Notifier, Waits, fenced_db


@dataclass
class Caller:
    """One tool call's caller. ``rule`` None: a remote store, whose server decides."""

    db: agentstate.Database
    p: agentstate.Principal | None  # who acts (a remote store: asked of it when needed)
    rules: Rules = None  # the grants it is held to (None: none)
    rule: SessionRule | None = None
    notifier: Notifier | None = None  # wakes waits (a local store's feed)
    waits: Waits | None = None  # bounds them
    recheck: Callable[[], Awaitable[Caller]] | None = None  # its token again (HTTP)

    @property
    def remote(self) -> bool:
        return self.rule is None

    @property
    def limited(self) -> bool:
        """Held to grants here (a local store's caller with rules, not an admin)."""
        return not self.remote and _access.readable(self.principal(), self.rules) is not None

    def principal(self) -> agentstate.Principal:
        if self.p is None:  # a remote store's: its token's principal (asked once per client)
            ops: Any = self.db._ops  # RemoteOps: the token's (name, admin), asked once
            name, admin = ops._whoami()
            self.p = agentstate.Principal(name, admin)
        return self.p

    def need_scope(self, kind: str, scope_id: str, write: bool) -> agentstate.Scope:
        """The scope, if this caller may read it (``write``: and write it): Forbidden beyond
        its grants, NotFound for another's session (SPEC §4, §15). Blocking."""
        s = self.db.scope(kind, scope_id)  # InvalidKey first, whoever asks (as the API)
        if self.rule is not None:
            _access.need(self.principal(), self.rules, s.kind, s.id, write)
            if s.kind == "session":
                self.rule.check(self.principal(), s.kind, s.id)
        return s

    def scope(self, text: str, write: bool) -> agentstate.Scope:
        """``need_scope`` of a scope written ``KIND:ID``."""
        kind, sep, scope_id = text.partition(":")
        if not sep:
            raise InvalidKey(f'a scope is written "KIND:ID" (e.g. "user:u-7"), got {text!r}')
        return self.need_scope(kind, scope_id, write)

    def run(self, run_id: str, write: bool) -> None:
        """Forbidden unless the caller's grants cover the run (SPEC §15)."""
        check_key(run_id, "run id")
        if self.rule is not None:
            _access.need(self.principal(), self.rules, RUNS, run_id, write)

    async def again(self) -> Caller:
        """This caller as it stands now: a revoked or expired token is Unauthorized."""
        return self if self.recheck is None else await self.recheck()


class Host:
    """Where tool calls come from: the store, who calls, what runs while it serves."""

    def __init__(self, db: agentstate.Database, read_only: bool = False) -> None:
        self.db = db
        self.read_only = read_only

    async def caller(self, ctx: Any) -> Caller:
        raise NotImplementedError

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """What serves beside the calls (a feed watcher), for as long as the server runs."""
        yield


class LocalHost(Host):
    """A local store over stdio: every call as ``principal``, held to ``rules``."""

    def __init__(self, db: agentstate.Database, principal: agentstate.Principal, rules: Rules,
                 read_only: bool = False) -> None:
        super().__init__(db, read_only)
        self.notifier = Notifier(db)
        self.me = Caller(db, principal, rules, SessionRule(db), self.notifier, Waits())

    async def caller(self, ctx: Any) -> Caller:
        return self.me

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        import asyncio

        self.notifier.loop = asyncio.get_running_loop()
        self.notifier.task = asyncio.create_task(self.notifier.run())
        try:
            yield
        finally:
            self.notifier.task.cancel()


class RemoteHost(Host):
    """A store behind ``agentstate serve``, through ``agentstate.connect``."""

    async def caller(self, ctx: Any) -> Caller:
        return Caller(self.db, None)


class HttpHost(Host):
    """``/mcp`` of ``agentstate serve``: each call as its request's bearer token says."""

    def __init__(self, api: API) -> None:
        super().__init__(api.db)
        self.api = api

    async def caller(self, ctx: Any) -> Caller:
        request = getattr(ctx, "request", None)
        if request is None:  # every message over HTTP carries its request: never here
            raise Unauthorized("no request to authenticate")
        p, rules = await self.api.caller(request)
        api = self.api
        # X-Agentstate-Fence fences every write of the request's tool calls, as the API's
        me = Caller(fenced_db(api.db, request, p), p, rules, api.rule, api.notifier, api.waits)
        return replace(me, recheck=lambda: self.caller(ctx))
