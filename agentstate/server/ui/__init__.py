"""The pages at ``/ui`` (issue 16): sign in with a token, look at sessions, turns, runs,
scopes and the change feed, watch them move, decide a held turn.

Server-rendered HTML from Jinja2 templates with autoescaping on (everything from
the store is user data: a value holding ``<script>`` is shown as text), one
small plain script for the live parts (no build step, nothing from the
network), and every page works without it. Reads go through the public
objects with the signed-in principal, so a page shows exactly what the API
would answer that principal. ``middleware(api)`` serves them beside the API:
they are not routes of the API, nor in its OpenAPI document.
"""

from __future__ import annotations

from ._views import middleware, routes

__all__ = ["middleware", "routes"]
