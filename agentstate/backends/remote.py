"""The remote client: the same operations as ``LocalOps``, over the State API (SPEC §12).

``agentstate.connect(url, token=...)`` gives a ``Database`` whose public objects
are the local ones; only this transport differs. Values are validated and
encoded once, by the public objects, and their JSON text is spliced into the
request body as is. Errors come back as the same classes with the same fields.
A write whose connection failed is a ``StorageError`` with ``outcome_unknown``.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from .. import _turns
from .. import errors as E
from .._encoding import decode
from .._grants import Rule
from .base import Batched, Filters, KEEP, Row, Sets, Stored, Ttl
from .grants import Readable
from . import wire as W
from .wire import check_token, check_url, error as _error, redirected

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
LONG_POLL = 25.0  # seconds one long-poll request may wait

class RemoteOps:
    """The backend operations of a store behind ``agentstate serve``."""

    def __init__(self, url: str, token: str, timeout: float) -> None:
        import httpx  # the server extra

        self.url = url.rstrip("/")
        self._token = token
        self._timeout = timeout
        self._http = httpx.Client(base_url=self.url, timeout=timeout, follow_redirects=False,
                                  headers={"authorization": f"Bearer {token.strip()}"})
        self._turns = _turns.Turns()  # update_turn()
        self._fence: str | None = None  # sent with every write (fenced())
        self._me: tuple[str, bool] | None = None  # the token's principal (name, admin)

    # -- the transport ----------------------------------------------------------------

    def _call(self, method: str, path: str, *, body: str | bytes | None = None,
              params: dict[str, Any] | None = None, who: str | None = None,
              runs: bool = False, bytes_body: bool = False, raw: bool = False,
              timeout: float | None = None) -> Any:
        import httpx

        self.check_open()
        headers = {}
        if body is not None:
            headers["content-type"] = "application/octet-stream" if bytes_body else "application/json"
        if who is not None:
            headers["x-agentstate-principal"] = who
        if self._fence is not None and method != "GET":
            headers["x-agentstate-fence"] = self._fence
        if raw:
            headers["accept"] = "application/octet-stream"
        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            r = self._http.request(method, path, content=body.encode("utf-8", "surrogatepass")
                                   if isinstance(body, str) else body, params=params,
                                   headers=headers,
                                   timeout=self._timeout if timeout is None else timeout)
        except httpx.HTTPError as e:
            err = E.StorageError(f"{method} {self.url}{path}: {type(e).__name__}: {e}")
            if method != "GET":  # it may have reached the server, and been done
                err.outcome_unknown = True
            raise err from None
        if 300 <= r.status_code < 400:
            raise redirected(f"{method} {self.url}{path}", r)
        if r.status_code >= 400:
            try:
                data = r.json()
            except ValueError:
                data = None
            raise _error(r.status_code, data, runs, write=method != "GET")
        if raw:
            return r.content
        return decode(r.content) if r.content else None

    # -- the database -------------------------------------------------------------------

    @property
    def target(self) -> str:
        return self.url

    @property
    def durability(self) -> str:
        return "server"

    @property
    def closed(self) -> bool:
        return self._http.is_closed  # shared with the fenced() copies

    def check_open(self) -> None:
        if self._http.is_closed:
            raise E.Closed(f"the connection to {self.url} is closed")

    def close(self) -> None:
        self._http.close()

    def fenced(self, turn_id: str, owner: str | None = None) -> RemoteOps:
        """These operations with ``X-Agentstate-Fence: turn_id`` on every write request:
        the server checks the lease in each write's own transaction (SPEC §14), and that
        the turn is the token's principal's (``owner`` is the server's to decide)."""
        ops = copy.copy(self)
        ops._fence = turn_id
        return ops

    def transaction(self) -> Any:
        raise E.UsageError("transaction() cannot span HTTP calls: use db.batch(), whose writes "
                           "are applied all or none in one request")

    def snapshot(self) -> Any:
        raise E.UsageError("snapshot() cannot span HTTP calls: get_many() and items() read "
                           "several keys of a scope in one request")

    def in_block(self) -> str | None:
        return None  # neither transaction() nor snapshot() exists over HTTP

    def clock(self) -> float:
        return float(self._call("GET", "/v1/health")["now"])

    def store_id(self) -> str:
        return str(self._call("GET", "/v1/health")["store"])

    def exclusive(self) -> Any:
        return contextlib.nullcontext()

    def update_turn(self, kind: str, sid: str, key: str) -> Any:
        """One update() of a key at a time among this client's threads (``_turns``)."""
        return self._turns.turn((kind, sid, key))

    def apply_batch(self, ops: list[Batched]) -> list[Any]:
        """One POST /v1/batch; each op's value comes validated and encoded (``_batch``) and
        its JSON text is spliced in as is, as for a single write."""
        parts = []
        for op, kind, sid, key, args, kwargs in ops:
            head = f'{{"op":"{op}","scope":{_dumps(f"{kind}:{sid}")},"key":{_dumps(key)}'
            if op == "put":
                _type, stored, _size, items = args
                head += ',"value":' + (stored if items is None else "[" + ",".join(items) + "]")
            elif op == "append":
                head += ',"items":[' + ",".join(args[0]) + "]"
            fields = {k: v for k, v in kwargs.items() if v is not None and v != KEEP}
            parts.append(head + "".join(f',"{k}":{_dumps(v)}' for k, v in fields.items()) + "}")
        results = self._call("POST", "/v1/batch", body='{"ops":[' + ",".join(parts) + "]}")["results"]
        return [(r["length"], r["version"]) if "length" in r
                else r["deleted"] if "deleted" in r else r["version"] for r in results]

    # -- keys ------------------------------------------------------------------------------

    def _key(self, kind: str, sid: str, key: str = "", tail: str = "") -> str:
        path = f"/v1/scopes/{W.segments(kind, sid)}/keys"
        return path + (f"/{W.segments(key)}" if key else "") + tail

    def kv_get(self, kind: str, sid: str, key: str, raw: bool = False,
               as_of: int | None = None) -> Row | None:
        path, past = self._key(kind, sid, key), {"as_of": as_of}
        if raw:
            return self._bytes(path, past)
        for _ in range(3):
            try:
                d = self._call("GET", path, params=past)
            except E.NotFound:
                return None
            except E.InvalidValue as e:
                if as_of is not None and "as_of" in str(e):
                    raise  # the seq, not the value
                # Stored bytes that are not JSON: the server will not parse them (400).
                # Parse them here, so the error is a local get's own json.JSONDecodeError.
                row = self._bytes(path, past)
                if row is None:
                    return None  # deleted meanwhile
                decode(row[1])  # raises json.JSONDecodeError, as Scope.get does
                continue  # they parse now: rewritten meanwhile, so ask again
            return ("json", _dumps(d["value"]), d["version"], None)
        raise E.InvalidValue(f"GET {path}: the server refuses to parse bytes that parse here")

    def _bytes(self, path: str, params: dict[str, Any] | None = None) -> Row | None:
        """A key's stored bytes (a JSON value as its UTF-8 text), or None when absent."""
        try:
            return ("bytes", self._call("GET", path, raw=True, params=params), 0, None)
        except E.NotFound:
            return None

    def kv_put(self, kind: str, sid: str, key: str, type_: str, stored: Stored, size: int,
               items: list[str] | None, if_version: int | None, ttl: Ttl) -> int:
        if type_ == "bytes":
            return self._call("PUT", self._key(kind, sid, key), body=stored, bytes_body=True,
                              params={"if_version": if_version, "ttl": ttl})["version"]
        text = str(stored) if items is None else "[" + ",".join(items) + "]"  # JSON text
        extra: dict[str, Any] = {"if_version": if_version}
        extra.update({"keep_ttl": True} if ttl == KEEP else {"ttl": ttl})
        body = '{"value":' + text + "".join(f',"{k}":{_dumps(v)}' for k, v in extra.items()
                                            if v is not None) + "}"
        return self._call("PUT", self._key(kind, sid, key), body=body)["version"]

    def kv_delete(self, kind: str, sid: str, key: str, if_version: int | None) -> bool:
        return self._call("DELETE", self._key(kind, sid, key),
                          params={"if_version": if_version})["deleted"]

    def kv_append(self, kind: str, sid: str, key: str, texts: list[str], size: int,
                  ttl: Ttl) -> tuple[int, int]:
        body = '{"items":[' + ",".join(texts) + "]" + (
            f',"ttl":{_dumps(ttl)}' if ttl not in (None, KEEP) else "") + "}"
        d = self._call("POST", self._key(kind, sid, key, "/append"), body=body)
        return d["length"], d["version"]

    def kv_pop(self, kind: str, sid: str, key: str, n: int) -> list[str]:
        d = self._call("POST", self._key(kind, sid, key, "/pop"), body=_dumps({"n": n}))
        return [_dumps(i) for i in d["items"]]

    def kv_touch(self, kind: str, sid: str, key: str, ttl: float | None) -> bool:
        return self._call("POST", self._key(kind, sid, key, "/touch"),
                          body=_dumps({"ttl": ttl}))["touched"]

    def kv_expires_at(self, kind: str, sid: str, key: str,
                      as_of: int | None = None) -> float | None:
        return W.ts(self._call("GET", self._key(kind, sid, key, "/expires_at"),
                              params={"as_of": as_of})["expires_at"])

    def kv_slice(self, kind: str, sid: str, key: str, start: int, stop: int | None,
                 as_of: int | None = None) -> list[str] | None:
        d = self._call("GET", self._key(kind, sid, key, "/slice"),
                       params={"start": start, "stop": stop, "as_of": as_of})
        return [_dumps(i) for i in d["items"]]

    def kv_length(self, kind: str, sid: str, key: str, as_of: int | None = None) -> int | None:
        return self._call("GET", self._key(kind, sid, key, "/length"),
                          params={"as_of": as_of})["length"]

    def kv_keys(self, kind: str, sid: str, prefix: str, after: str | None,
                limit: int | None, as_of: int | None = None) -> list[str]:
        return self._call("GET", self._key(kind, sid), params={
            "prefix": prefix or None, "after": after, "limit": limit, "as_of": as_of})["keys"]

    def kv_get_many(self, kind: str, sid: str, keys: list[str],
                    as_of: int | None = None) -> list[Row]:
        body = {"keys": keys} if as_of is None else {"keys": keys, "as_of": as_of}
        d = self._call("POST", f"/v1/scopes/{W.segments(kind, sid)}/get_many", body=_dumps(body))
        return [(k, "json", _dumps(v["value"]), v["version"], None)
                for k, v in d["values"].items() if v["version"]]

    def kv_items(self, kind: str, sid: str, prefix: str, after: str | None,
                 limit: int | None, as_of: int | None = None) -> list[Row]:
        d = self._call("GET", f"/v1/scopes/{W.segments(kind, sid)}/items", params={
            "prefix": prefix or None, "after": after, "limit": limit, "as_of": as_of})
        return [(i["key"], "json", _dumps(i["value"]), i["version"], None) for i in d["items"]]

    # -- the past (SPEC §17) ----------------------------------------------------------------

    def kv_history(self, kind: str, sid: str, key: str, since: int, before: int | None,
                   limit: int | None) -> list[Row]:
        """Every page the server gives, following ``next``, up to ``limit``."""
        out: list[Row] = []
        while limit is None or len(out) < limit:
            d = self._call("GET", self._key(kind, sid, key, "/history"), params={
                "since": since or None, "before": before,
                "limit": None if limit is None else limit - len(out)})
            for r in d["revisions"]:
                gone = r["value"] is None and r["op"] in ("delete", "expire")
                out.append((r["seq"], r["version"], r["op"], r["at"],
                            *((None, None) if gone else W.typed(r)), None))
            before = d["next"]
            if before is None:
                break
        return out

    def diff(self, since: int, until: int | None, flt: Filters, readable: Readable | None = None,
             after: tuple[str, str, str] | None = None, limit: int | None = None) -> list[Row]:
        # (readable: the server applies its caller's own); every page up to the limit (a
        # page may end early, past the server's byte budget: a short page is not the end)
        def row(v: dict[str, Any]) -> Row | None:
            return None if not v["version"] else (*W.typed(v), v["version"], None)

        out: list[Row] = []
        cursor = None if after is None else "/".join(after)
        while True:
            d = self._call("GET", "/v1/diff", params={
                "since": since, "until": until, **flt, "after": cursor,
                "limit": None if limit is None else limit - len(out)})
            out += [(x["kind"], x["scope_id"], x["key"], row(x["before"]), row(x["after"]))
                    for x in d["diffs"]]
            cursor = d.get("next")
            if cursor is None or (limit is not None and len(out) >= limit):
                return out

    def kv_restore(self, kind: str, sid: str, seq: int, keys: list[str] | None) -> int:
        body = {"at": seq} if keys is None else {"at": seq, "keys": keys}
        return self._call("POST", f"/v1/scopes/{W.segments(kind, sid)}/restore",
                          body=_dumps(body))["restored"]

    def kv_clear(self, kind: str, sid: str) -> int:
        return self._call("POST", f"/v1/scopes/{W.segments(kind, sid)}/clear", body="{}")["cleared"]

    # -- vectors: the framework stores' search runs where the store is (SPEC §19) ----------

    def vector_search(self) -> str:
        raise E.UsageError("vector search needs a database opened with agentstate.open() (a "
                           "file or a PostgreSQL server): the State API has none")

    def vector_value(self, values: list[float]) -> tuple[str, Stored, int]:
        self.vector_search()
        raise AssertionError("unreachable")

    def kv_nearest(self, kind: str, sid: str, ranges: list[tuple[str, str]],
                   query: list[float], metric: str, limit: int) -> list[tuple[str, float]]:
        self.vector_search()
        raise AssertionError("unreachable")

    # -- runs --------------------------------------------------------------------------------

    def run_write(self, run_id: str, rows: list[tuple[int, str]], snapshot: str | None,
                  create: bool) -> None:
        body = ('{"entries":[' + ",".join(t for _, t in rows) + '],"snapshot":'
                + (snapshot or "null") + ',"create":' + ("true" if create else "false") + "}")
        self._call("POST", f"/v1/runs/{W.segments(run_id)}/write", body=body, runs=not create)

    def run_read(self, run_id: str) -> tuple[Row, list[tuple[int, str]]] | None:
        try:
            d = self._call("GET", f"/v1/runs/{W.segments(run_id)}", runs=True)
        except E.NotFound:
            return None
        head = (W.text(d["snapshot"]), d["next_seq"], d["format"], d["first_seq"])
        # an entry that is not an object has no seq: -1 fails load()'s check (Damaged)
        return head, [(e.get("seq", -1) if isinstance(e, dict) else -1, _dumps(e))
                      for e in d["entries"]]

    def run_head(self, run_id: str) -> Row | None:
        try:
            d = self._call("GET", f"/v1/runs/{W.segments(run_id)}/head", runs=True)
        except E.NotFound:
            return None
        return (W.text(d["snapshot"]), d["next_seq"], d["format"], d["first_seq"], d["created_at"],
                d["updated_at"], d["pinned"])

    def run_entries(self, run_id: str, since: int, limit: int | None) -> list[tuple[int, str]]:
        d = self._call("GET", f"/v1/runs/{W.segments(run_id)}/entries", params={"since": since, "limit": limit})
        return [(e["seq"], _dumps(e)) for e in d["entries"]]

    def run_tail(self, run_id: str, n: int) -> list[tuple[int, str]]:
        d = self._call("GET", f"/v1/runs/{W.segments(run_id)}/tail", params={"n": n})
        return [(e["seq"], _dumps(e)) for e in d["entries"]]

    def run_delete(self, run_id: str) -> bool:
        return self._call("DELETE", f"/v1/runs/{W.segments(run_id)}")["deleted"]

    def run_list(self, after: str | None, limit: int | None,
                 grants: tuple[Rule, ...] | None = None) -> list[Row]:
        if grants is not None:  # the server applies its caller's own
            raise E.UsageError("a remote store lists what its token may read: no grants here")
        return [(r["id"], r["created_at"], r["updated_at"], _dumps(r["task"]), _dumps(r["turn"]),
                 _dumps(r["stopped_by"]), _dumps(r["finished"]), r["pinned"])
                for r in self._page("/v1/runs", "runs", after, limit)]

    def run_pin(self, run_id: str, pinned: bool) -> bool:
        return self._call("POST", f"/v1/runs/{W.segments(run_id)}/pin", body=_dumps({"pinned": pinned}),
                          runs=True)["pinned"]

    def run_fork(self, run_id: str, new_id: str, upto: int | None) -> None:
        self._call("POST", f"/v1/runs/{W.segments(run_id)}/fork", body=_dumps({"new_id": new_id, "upto": upto}),
                   runs=True)

    def run_trim(self, run_id: str, before: int) -> int:
        return self._call("POST", f"/v1/runs/{W.segments(run_id)}/trim", body=_dumps({"before": before}),
                          runs=True)["removed"]

    def run_prune(self, older_than: float, finished_only: bool) -> list[str]:
        return self._call("POST", "/v1/runs/prune", body=_dumps(
            {"older_than": older_than, "finished_only": finished_only}))["runs"]

    def run_claim(self, run_id: str, call_id: str, call: str | None, lease: float,
                  retry: bool) -> tuple[str, str]:
        body = (("{" if call is None else '{"call":' + call + ",")
                + f'"lease":{_dumps(lease)},"retry":{"true" if retry else "false"}}}')
        d = self._call("POST", f"/v1/runs/{W.segments(run_id)}/calls/{W.segments(call_id)}/claim", body=body,
                       runs=True)
        return d["status"], _dumps(d["entry"])

    def run_settle(self, run_id: str, call_id: str, outcome: str, retry: int | None) -> str:
        # outcome is {"status":"ok","result":...} or {"status":"error","error":...}: the
        # route takes {"result"} or {"error"}, and the claim settled
        body = "{" + ("" if retry is None else f'"retry":{retry},') + outcome[outcome.index(",") + 1:]
        d = self._call("POST", f"/v1/runs/{W.segments(run_id)}/calls/{W.segments(call_id)}/settle", body=body,
                       runs=True)
        return _dumps(d["entry"])

    # -- sessions and turns ----------------------------------------------------------------------

    def _as(self, name: str, admin: bool) -> str | None:
        """The X-Agentstate-Principal that makes a call act for ``Principal(name, admin)``.

        None when that is the token's own principal. The header names a principal
        without admin rights, which an admin token may do for anyone (its own name
        too) and any other token for itself only (else the server answers 403). An
        admin principal other than the token's own cannot be named: Forbidden here,
        rather than acting for someone else.
        """
        me = self._whoami()
        if (name, admin) == me:
            return None
        if admin:
            raise E.Forbidden(f"Principal({name!r}, admin=True) needs {name}'s own admin token: "
                              f"this connection's token acts as {me[0]!r}"
                              + (" (an admin)" if me[1] else " (not an admin)"))
        return name

    def _whoami(self) -> tuple[str, bool]:
        """(name, admin) of the token's principal, asked once: a token's never changes."""
        if self._me is None:
            d = self._call("GET", "/v1/whoami")
            self._me = (d["name"], d["admin"])
        return self._me

    def session_create(self, owner: str, metadata: str) -> Row:
        who = None if owner == self._whoami()[0] else owner  # creating needs no admin rights
        return W.session_row(self._call("POST", "/v1/sessions", body='{"metadata":' + metadata + "}",
                                       who=who))

    def session_get(self, session_id: str, name: str, admin: bool) -> Row:
        return W.session_row(self._call("GET", f"/v1/sessions/{W.segments(session_id)}",
                                       who=self._as(name, admin)))

    def session_list(self, name: str, admin: bool, after: str | None, limit: int | None) -> list[Row]:
        return [W.session_row(d) for d in self._page("/v1/sessions", "sessions", after, limit,
                                                    who=self._as(name, admin))]

    def session_delete(self, session_id: str, name: str, admin: bool) -> None:
        self._call("DELETE", f"/v1/sessions/{W.segments(session_id)}", who=self._as(name, admin))

    def session_fork(self, session_id: str, name: str, admin: bool, seq: int | None,
                     metadata: str | None) -> Row:
        body = '{"at":' + _dumps(seq) + ',"metadata":' + (metadata or "null") + "}"
        return W.session_row(self._call("POST", f"/v1/sessions/{W.segments(session_id)}/fork", body=body,
                                       who=self._as(name, admin)))

    def session_prune(self, name: str, admin: bool, idle_for: float) -> list[str]:
        return self._call("POST", "/v1/sessions/prune", body=_dumps({"idle_for": idle_for}),
                          who=self._as(name, admin))["sessions"]

    def session_release(self, session_id: str, name: str, admin: bool) -> Row:
        return W.turn_row(self._call("POST", f"/v1/sessions/{W.segments(session_id)}/release",
                                    who=self._as(name, admin)))

    def turn_start(self, session_id: str, name: str, admin: bool, status: str,
                   input_: str | None, lease: float) -> Row:
        body = ('{"input":' + (input_ or "null") + f',"lease":{_dumps(lease)},"queued":'
                + ("true" if status == "queued" else "false") + "}")
        return W.turn_row(self._call("POST", f"/v1/sessions/{W.segments(session_id)}/turns", body=body,
                                    who=self._as(name, admin)))

    def turn_get(self, turn_id: str, name: str, admin: bool) -> Row:
        return W.turn_row(self._call("GET", f"/v1/turns/{W.segments(turn_id)}", who=self._as(name, admin)))

    def turn_list(self, session_id: str, name: str, admin: bool, after: str | None,
                  limit: int | None) -> list[Row]:
        return [W.turn_row(d) for d in self._page(f"/v1/sessions/{W.segments(session_id)}/turns", "turns",
                                                 after, limit, who=self._as(name, admin))]

    def turn_find(self, name: str, admin: bool, live: tuple[str, ...], expired: bool,
                  after: str | None, limit: int | None) -> list[Row]:
        wanted = (*live, "expired") if expired else live
        return [W.turn_row(d) for d in self._page("/v1/turns", "turns", after, limit,
                                                 who=self._as(name, admin),
                                                 status=",".join(wanted))]

    def _page(self, path: str, field: str, after: str | None, limit: int | None,
              who: str | None = None, **params: Any) -> list[dict[str, Any]]:
        """A list route's items. The server takes limits from 1: limit 0 asks for 1 and
        answers [], so an unknown ``after`` or session is still refused, as locally."""
        asked = 1 if limit == 0 else limit
        items = self._call("GET", path, params={**params, "after": after, "limit": asked},
                           who=who, runs=field == "runs")[field]
        return [] if limit == 0 else items

    def turn_move(self, turn_id: str, name: str, admin: bool, from_states: tuple[str, ...],
                  to: str | None, what: str, lease: float | None, sets: Sets) -> Row:
        field = {"hold": "request", "finish": "result", "decide": "decision"}.get(what)
        if field is not None:
            body = '{"' + field + '":' + (sets.get(field) or "null") + "}"
        elif what == "fail":
            body = _dumps({"error": sets["error"]})
        else:  # start, heartbeat, resume
            body = _dumps({"lease": lease})
        return W.turn_row(self._call("POST", f"/v1/turns/{W.segments(turn_id)}/{what}", body=body,
                                    who=self._as(name, admin)))

    # -- the change feed and settings ---------------------------------------------------------------

    def feed_scan(self, since: int, limit: int, flt: Filters, readable: Any = None,
                  upto: int | None = None) -> tuple[list[Row], int]:
        """As the local scan: the first changes after ``since`` this token may see. The
        server leaves out what the caller may not see and says how far it read (``last``):
        an empty page with ``last`` past the cursor means only that, so ask on from there."""
        if readable is not None or upto is not None:  # the server applies its caller's own
            raise E.UsageError("a remote store's feed shows what its token may read: no filter here")
        cursor = since
        while True:
            d = self._call("GET", "/v1/changes", params={"since": cursor, "limit": limit, **flt})
            rows = [W.change_row(c) for c in d["changes"]]
            if rows or d["last"] <= cursor:
                return rows, d["last"]
            cursor = d["last"]

    def feed_head(self) -> int:
        return self._call("GET", "/v1/changes/head")["head"]

    def watch(self, since: int, timeout: float | None, limit: int,
              flt: Filters) -> list[Row]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = LONG_POLL if deadline is None else max(0.0, min(LONG_POLL, deadline - time.monotonic()))
            d = self._call("GET", "/v1/changes", timeout=wait + self._timeout,
                           params={"since": since, "limit": limit, "wait": wait, **flt})
            if d["changes"] or (deadline is not None and time.monotonic() >= deadline):
                return [W.change_row(c) for c in d["changes"]]
            # Nothing this principal may see up to where the server read: on from there,
            # as a local watch goes on from the head (``since`` may be purged meanwhile).
            since = max(since, d["last"])

    async def awatch(self, since: int, limit: int, flt: Filters) -> AsyncIterator[Row]:
        import httpx

        self.check_open()
        # A client of this event loop's own: nothing loop-bound outlives the iteration.
        async with httpx.AsyncClient(base_url=self.url, timeout=LONG_POLL + self._timeout,
                                     follow_redirects=False,
                                     headers={"authorization": f"Bearer {self._token.strip()}"}) as http:
            cursor = since
            while True:
                d = await self._apoll(http, {"since": cursor, "limit": limit, "wait": LONG_POLL,
                                             **flt})
                for c in d["changes"]:
                    yield W.change_row(c)
                    cursor = c["seq"]
                cursor = max(cursor, d["last"])  # past what the server read, shown or not
                await asyncio.sleep(0)

    async def _apoll(self, http: Any, params: dict[str, Any]) -> dict[str, Any]:
        """One long poll of awatch()."""
        import httpx

        self.check_open()
        try:
            r = await http.get("/v1/changes", params=params)
        except httpx.HTTPError as e:
            raise E.StorageError(f"GET {self.url}/v1/changes: {type(e).__name__}: {e}") from None
        if 300 <= r.status_code < 400:
            raise redirected(f"GET {self.url}/v1/changes", r)
        if r.status_code >= 400:
            try:
                data = r.json()
            except ValueError:
                data = None
            raise _error(r.status_code, data, False)
        return r.json()

    def settings(self) -> dict[str, Any]:
        return self._call("GET", "/v1/settings")

    def set_setting(self, name: str, value: int) -> None:
        self._call("PUT", f"/v1/settings/{W.segments(name)}", body=_dumps({"value": value}))

    # -- what only the server's own command does ----------------------------------------------------

    def _local_only(self, what: str) -> Any:
        raise E.UsageError(f"{what} runs where the store is: `agentstate {what}` on the server's "
                           "machine")

    def check(self) -> list[str]:
        return self._call("GET", "/v1/admin/check")["problems"]

    def info(self) -> dict[str, Any]:
        return self._call("GET", "/v1/admin/info")

    def backup(self, dest: Any, progress: Any) -> str:
        return self._local_only("backup")

    def vacuum(self) -> dict[str, int]:
        return self._local_only("vacuum")

    def sql(self, query: str, params: Any) -> list[dict[str, Any]]:
        raise E.UsageError("db.sql() is for local stores (a file, or a postgresql:// URL opened "
                           "with agentstate.open()): the HTTP API runs no SQL")

    def token_create(self, name: str, admin: bool, grants: str | None,
                     expires_in: float | None, first: bool = False) -> str | None:
        return self._local_only("tokens create")

    def token_find(self, token: str) -> Any:
        return self._local_only("tokens")

    def token_list(self) -> list[Row]:
        return self._local_only("tokens list")

    def token_revoke(self, name: str, token_id: str) -> int:
        return self._local_only("tokens revoke")

    # the pages' sign-ins are kept by the server, in its store
    def signin_create(self, token: str, lifetime: float) -> Any: return self._local_only("serve")
    def signin_find(self, signin: str) -> Any: return self._local_only("serve")
    def signin_extend(self, signin: str, lifetime: float) -> None: self._local_only("serve")
    def signin_end(self, signin: str) -> None: self._local_only("serve")


def connect(url: str, token: str | None = None, *, timeout: float = 30.0) -> Any:
    """A ``Database`` served by ``agentstate serve`` at ``url`` (``http://host:8765``).

    ``token`` defaults to ``$AGENTSTATE_TOKEN``. The same objects and methods
    as a local Database, raising the same errors; ``transaction()`` cannot
    span HTTP calls (use ``batch()``). Needs the ``server`` extra (httpx).
    """
    import os

    from .._database import Database

    token = token if token is not None else os.environ.get("AGENTSTATE_TOKEN")
    if not token:
        raise E.Unauthorized("connect() needs a token (or $AGENTSTATE_TOKEN): "
                             "agentstate tokens create NAME")
    check_token(token)
    check_url(url)
    try:
        ops = RemoteOps(url, token, timeout)
    except ImportError as e:
        raise E.UsageError(f"connect() needs the server extra: pip install 'agentstate-db[server]' ({e})") from None
    return Database(ops)
