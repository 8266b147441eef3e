"""Every limit one request meets, in one table: the route table cites it, the OpenAPI
document shows it (``info.x-limits`` and each body's description), the docs list it
(docs/errors.md, "Request limits").

Why these numbers: a body is held whole in memory, decoded, parsed into Python objects
(up to ``json_values`` of them) and re-encoded by the store, so one request holds about
five times its body plus its values; at most ``big_bodies`` bodies over ``big_body`` are
read at once. A batch holds the write lock for each of its ops, so their count is bounded.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

KIB, MIB = 1024, 1024 * 1024


@dataclass(frozen=True)
class Limit:
    name: str
    value: int
    unit: str
    what: str


class Limits:
    """The limits by name: ``LIMITS.run_body`` is a number; ``rows()`` the docs' table."""

    def __init__(self, *limits: Limit) -> None:
        self._all = {limit.name: limit for limit in limits}

    def __getattr__(self, name: str) -> int:
        try:
            return self._all[name].value
        except KeyError:
            raise AttributeError(name) from None

    @contextmanager
    def override(self, **values: int) -> Iterator[None]:
        """Some values changed for a while (a test's smaller ones), wherever they are read at
        call time (the route table reads its body limits once)."""
        saved = dict(self._all)
        self._all.update({n: replace(self._all[n], value=v) for n, v in values.items()})
        try:
            yield
        finally:
            self._all.clear()
            self._all.update(saved)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {n: {"value": x.value, "unit": x.unit, "what": x.what} for n, x in self._all.items()}

    def rows(self) -> list[str]:
        """The docs' table (docs/errors.md), a line per limit."""
        return [f"| `{x.name}` | {x.value:,} {x.unit} | {x.what} |" for x in self._all.values()]


LIMITS = Limits(
    Limit("value_body", 4 * MIB, "bytes", "a JSON body that carries values: PUT of a key, append, "
          "a new session's metadata, a turn's input, request, decision or result (a 1 MiB value, "
          "even \\u-escaped)"),
    Limit("bytes_body", 1 * MIB, "bytes", "PUT of a key as application/octet-stream (the store's "
          "limit for a value)"),
    Limit("small_body", 1 * KIB, "bytes", "every other body: pop, touch, fork, trim, prune, settings"),
    Limit("batch_body", 4 * MIB, "bytes", "POST /v1/batch"),
    Limit("batch_ops", 1000, "ops", "POST /v1/batch: ops in one batch (each holds the write lock)"),
    Limit("run_body", 17 * MIB, "bytes", "POST /v1/runs/{run_id}/write, and a call's claim and "
          "settle: one entry, snapshot, call or result of the store's 16 MiB limit, and 1 MiB more"),
    Limit("json_values", 1_000_000, "values", "JSON values (arrays, objects and scalars) in one "
          "body; more: 413 too_large"),
    Limit("json_containers", 250_000, "values", "arrays and objects in one body (the garbage "
          "collector's pauses grow with them); more: 413 too_large"),
    Limit("big_body", 1 * MIB, "bytes", "a body over this is read, parsed and written while at most "
          "`big_bodies` such bodies are (the others wait their turn)"),
    Limit("big_bodies", 2, "requests", "bodies over `big_body` handled at once"),
    Limit("big_body_seconds", 60, "s", "the rest of a body over `big_body` must arrive within this "
          "once its turn has come (else 400 invalid_value): a slow client cannot hold a turn"),
    Limit("long_poll_wait", 300, "s", "GET /v1/changes?wait=: the longest a long poll holds"),
    Limit("waits_per_principal", 64, "requests", "long polls (with `wait`) and streams (the API's "
          "and the pages') one non-admin principal holds open at once; more: 503 busy"),
    Limit("waits", 512, "requests", "long polls and streams open at once on one server; more: "
          "503 busy"),
    Limit("feed_page", 10_000, "changes", "`limit` of /v1/changes and /v1/changes/stream "
          "(default 1,000)"),
    Limit("list_page", 10_000, "items", "`limit` of the list routes (keys, runs, sessions, turns); "
          "without `limit` a list answers every item"),
    Limit("history_page", 1000, "revisions", "GET .../keys/{key}/history: the most revisions a "
          "page holds (the default; a bigger `limit` gets this many and a `next`)"),
    Limit("history_bytes", 16 * MIB, "bytes", "GET .../keys/{key}/history and GET /v1/diff: a "
          "page ends early once its values pass this (a list's every revision holds its whole "
          "list); `next` goes on"),
    Limit("form_body", 4 * MIB, "bytes", "a form of the pages at /ui (a decision of up to 1 MiB)"),
    Limit("run_page_search", 64 * MIB, "bytes", "of entries a run's page reads after itself, "
          "looking for its open calls' results (then: \"no result in the entries searched\")"),
    Limit("signin_form", 8 * KIB, "bytes", "the sign-in and sign-out forms of the pages (before "
          "a sign-in is checked)"),
    Limit("stream_recheck", 1, "s", "how often an open stream or long poll checks that its "
          "token (or page sign-in) still stands"),
)
