"""Settings (SPEC §10), the admin's checks, liveness and the OpenAPI document."""

from __future__ import annotations

from starlette.responses import Response

import agentstate

from .. import _http as h
from .._api import API, Call
from .._models import SettingBody


async def settings(api: API, c: Call) -> Response:
    return h.JSON(await h.blocking(api.db.settings))


async def set_setting(api: API, c: Call) -> Response:
    b = await c.json(SettingBody)
    await h.blocking(c.db.set_setting, c.params["name"], b.value)
    return h.JSON(await h.blocking(api.db.settings))


async def check(api: API, c: Call) -> Response:
    return h.JSON({"problems": await h.blocking(api.db.check)})


async def info(api: API, c: Call) -> Response:
    return h.JSON(await h.blocking(api.db.info))


async def whoami(api: API, c: Call) -> Response:
    """The principal the request acts as (the remote client asks once), and its token's
    grants (SPEC §15; null: none)."""
    return h.JSON({"name": c.p.name, "admin": c.p.admin,
                   "grants": None if c.rules is None else [str(r) for r in c.rules]})


async def health(api: API, c: Call) -> Response:
    """Liveness, the version, the store's id and its clock (SPEC §16: leases are judged by
    it; the remote client's ``clock()`` reads it here)."""
    return h.JSON({"ok": True, "version": agentstate.__version__, "store": api.store_id,
                   "now": await h.blocking(api.db._ops.clock)})


async def openapi(api: API, c: Call) -> Response:
    if api.document is None:  # the same for every caller: made once
        from ..openapi import document

        api.document = h.dumps(document(api.routes))
    return Response(api.document, media_type="application/json")
