"""The OpenAPI 3.1 document of the State API, made from the one route table (_routes.ROUTES).

Request bodies come from the pydantic models the server parses with; answers
from SCHEMAS below. tests/test_server_openapi.py fuzzes the app against it.
"""

from __future__ import annotations

from typing import Any

import agentstate
from agentstate.backends.base import SETTINGS

from . import _models
from ._limits import LIMITS

KEY = {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,200}$"}
KIND = {"type": "string", "enum": ["thread", "session", "agent", "user", "app"]}
NULLABLE_STR = {"type": ["string", "null"]}
INT = {"type": "integer"}
JSON_VALUE: dict[str, Any] = {}  # any JSON value


def _obj(required: list[str] | None = None, **props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": required or list(props)}


CHANGE = _obj(seq=INT, at={"type": "string"}, topic={"type": "string", "enum": ["kv", "run", "session"]},
              op={"type": "string"}, kind=NULLABLE_STR, scope_id=NULLABLE_STR, key=NULLABLE_STR,
              version={"type": ["integer", "null"]}, start={"type": ["integer", "null"]},
              count={"type": ["integer", "null"]})
TURN = _obj(id={"type": "string"}, session_id={"type": "string"}, n=INT, status={"type": "string"},
            input=JSON_VALUE, request=JSON_VALUE, decision=JSON_VALUE, result=JSON_VALUE,
            error=NULLABLE_STR, lease={"type": ["number", "null"]},
            lease_until={"type": ["number", "null"]}, created_at={"type": "string"},
            updated_at={"type": "string"})
SESSION = _obj(id={"type": "string"}, owner={"type": "string"}, created_at={"type": "string"},
               metadata={"type": "object"})
SUMMARY = _obj(id={"type": "string"}, task={"type": "string"}, turn=INT, stopped_by=NULLABLE_STR,
               finished={"type": "boolean"}, created_at={"type": "string"},
               updated_at={"type": "string"}, pinned={"type": "boolean"})
VERSIONED = _obj(value=JSON_VALUE, version=INT)
VALUE_TYPE = {"type": "string", "enum": ["json", "bytes"],
              "description": "bytes: a value written as bytes, its `value` base64 text"}
TYPED = _obj(value=JSON_VALUE, version=INT, type=VALUE_TYPE)  # the past's values (SPEC §17)
ERROR = _obj(error=_obj(["code", "message"], code={"type": "string"}, message={"type": "string"},
                        current_version=INT, turn_id={"type": "string"}, size=INT, limit=INT,
                        outcome_unknown={"type": "boolean"}, call_id={"type": "string"},
                        at=NULLABLE_STR, error={"type": "string"}))

SCHEMAS: dict[str, dict[str, Any]] = {
    "object": {"type": "object"},
    "Versioned": _obj(key={"type": "string"}, value=JSON_VALUE, version=INT),
    "Version": _obj(version=INT),
    "Deleted": _obj(deleted={"type": "boolean"}),
    "Appended": _obj(length=INT, version=INT),
    "Items": _obj(items={"type": "array"}),
    "Touched": _obj(touched={"type": "boolean"}, expires_at=NULLABLE_STR),
    "ExpiresAt": _obj(expires_at=NULLABLE_STR),
    "Length": _obj(length=INT),
    "Keys": _obj(keys={"type": "array", "items": {"type": "string"}}, next=NULLABLE_STR),
    "BatchResults": _obj(results={"type": "array", "items": {"type": "object"}}),
    "Runs": _obj(runs={"type": "array", "items": SUMMARY}, next=NULLABLE_STR),
    "RunIds": _obj(runs={"type": "array", "items": {"type": "string"}}),
    "Run": _obj(id={"type": "string"}, snapshot={"type": ["object", "null"]},
                entries={"type": "array"}, first_seq=INT, next_seq=INT, format=INT),
    "RunHead": _obj(id={"type": "string"}, snapshot={"type": ["object", "null"]}, first_seq=INT,
                    next_seq=INT, format=INT, created_at={"type": "string"},
                    updated_at={"type": "string"}, pinned={"type": "boolean"}),
    "Problems": _obj(problems={"type": "array", "items": {"type": "string"}}),
    "Written": _obj(written={"type": "boolean"}),
    "Entries": _obj(entries={"type": "array", "items": {"type": "object"}}),
    "Record": _obj(entries={"type": "array", "items": {"type": "object"}},
                   snapshot={"type": ["object", "null"]}),
    "Id": _obj(id={"type": "string"}),
    "Removed": _obj(removed=INT),
    "Session": SESSION,
    "Sessions": _obj(sessions={"type": "array", "items": SESSION}, next=NULLABLE_STR),
    "SessionIds": _obj(sessions={"type": "array", "items": {"type": "string"}}),
    "Turn": TURN,
    "Turns": _obj(turns={"type": "array", "items": TURN}, next=NULLABLE_STR),
    "Changes": _obj(changes={"type": "array", "items": CHANGE}, last=INT),
    "Settings": {"type": "object", "properties": {name: INT for name in SETTINGS}},
    "Health": _obj(ok={"type": "boolean"}, version={"type": "string"},
                   store={"type": "string", "description": "the store's own id"},
                   now={"type": "number", "description": "the store's clock, unix seconds"}),
    "Head": _obj(head=INT),
    "Values": _obj(values={"type": "object", "additionalProperties": VERSIONED}),
    "KeyValues": _obj(items={"type": "array", "items": _obj(key={"type": "string"},
                                                            value=JSON_VALUE, version=INT)},
                      next=NULLABLE_STR),
    "Cleared": _obj(cleared=INT),
    "Pinned": _obj(pinned={"type": "boolean"}),
    "Claim": _obj(["status", "entry"], status={"type": "string", "enum": [
        "claimed", "done", "failed", "in_progress", "in_doubt"]}, result=JSON_VALUE,
        error={"type": "string"}, entry={"type": "object"}),
    "Settled": _obj(entry={"type": "object"}),
    "Revisions": _obj(revisions={"type": "array", "items": _obj(
        seq=INT, version=INT, op={"type": "string"}, at={"type": "string"}, value=JSON_VALUE,
        type=VALUE_TYPE)}, next={"type": ["integer", "null"]}),
    "Diffs": _obj(diffs={"type": "array", "items": _obj(
        kind={"type": "string"}, scope_id={"type": "string"}, key={"type": "string"},
        before=TYPED, after=TYPED)}, next={"type": ["string", "null"]}),
    "Restored": _obj(restored=INT),
}

QUERY: dict[str, dict[str, Any]] = {
    "if_version": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    "ttl": {"type": "number", "exclusiveMinimum": 0, "maximum": 1e11},
    "start": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
    "stop": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
    "since": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    "until": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    "before": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    "as_of": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1,
              "description": "a change's seq: the store as it was right after it (SPEC §17)"},
    "limit": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1,
              "description": f"lists and the feed: at most {LIMITS.list_page:,} (x-limits)"},
    "wait": {"type": "number", "minimum": 0, "maximum": LIMITS.long_poll_wait},
    "n": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
    "prefix": {"type": "string"},
    "after": {"type": "string"},
    "status": {"type": "string", "description": "one or several (comma-separated) of queued, "
               "running, held, decided, resuming, expired; absent: all of them"},
    "topic": {"type": "string", "enum": ["kv", "run", "session"]},
    "kind": KIND,
    "scope_id": KEY,
    "key": KEY,
}
PATH: dict[str, dict[str, Any]] = {
    "kind": KIND, "id": KEY, "run_id": KEY, "session_id": KEY, "turn_id": KEY, "call_id": KEY,
    "key": {**KEY, "description": "the keys `.` and `..` are written `~.` and `~..` (URLs drop "
                                  "those segments)"},
    "name": {"type": "string", "enum": list(SETTINGS)},
    "action": {"type": "string",
               "enum": ["start", "heartbeat", "hold", "decide", "resume", "finish", "fail"]},
}
ACTION_BODIES = (_models.LeaseBody, _models.HoldBody, _models.DecideBody, _models.FinishBody,
                 _models.FailBody)


def _body_schema(model: Any) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("title", None)
    schema.setdefault("additionalProperties", False)
    return schema


def _answer(route: Any) -> dict[str, Any]:
    if route.answer == "stream":
        return {"text/event-stream": {"schema": {"type": "string"}}}
    content = {"application/json": {"schema": SCHEMAS[route.answer]}}
    if route.extra.get("bytes_answer"):
        content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary"}}
    return content


def _operation(route: Any) -> dict[str, Any]:
    params = [{"name": n, "in": "path", "required": True, "schema": PATH[n]}
              for n in _path_names(route.path)]
    params += [{"name": n, "in": "query", "required": False, "schema": QUERY[n]} for n in route.query]
    if route.auth != "none":
        params.append({"name": "X-Agentstate-Principal", "in": "header", "required": False,
                       "schema": KEY, "description": "admins only: act for this principal"})
    if route.auth != "none" and route.method != "GET":
        params.append({"name": "X-Agentstate-Fence", "in": "header", "required": False,
                       "schema": KEY, "description": "a turn id: every write of the request lands "
                                                     "only while that turn holds its lease, else "
                                                     "409 lease_lost (SPEC §14)"})
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": f"{route.method.lower()}_{route.handler.__name__}_{len(route.path)}",
        "parameters": params,
        "responses": {str(route.ok): {"description": "done", "content": _answer(route)}},
    }
    if route.description:
        op["description"] = route.description
    statuses = set(route.errors) | ({400, 401, 403, 503} if route.auth != "none" else set())
    if route.auth != "none" and route.method != "GET":
        statuses.add(409)  # a write under a lapsed X-Agentstate-Fence: lease_lost
    if params and any(p["in"] == "path" for p in params):
        statuses.add(404)
    for status in sorted(statuses):
        op["responses"][str(status)] = {
            "description": {400: "invalid input", 401: "no or unknown token", 403: "forbidden",
                            404: "not found", 409: "conflict", 410: "cursor expired",
                            413: "too large", 500: "damaged", 503: "busy"}[status],
            "content": {"application/json": {"schema": ERROR}}}
    limit = (f"At most {route.limit:,} bytes, {LIMITS.json_values:,} JSON values and "
             f"{LIMITS.json_containers:,} arrays and objects (more: 413 too_large).")
    if route.body == "action":
        op["requestBody"] = {"required": True, "description": limit, "content": {"application/json": {
            "schema": {"anyOf": [_body_schema(m) for m in ACTION_BODIES]}}}}
    elif route.body is not None:
        content = {"application/json": {"schema": _body_schema(route.body)}}
        if route.extra.get("bytes_body"):
            limit += f" As application/octet-stream: at most {route.extra['bytes_body']:,} bytes."
            content["application/octet-stream"] = {"schema": {"type": "string", "format": "binary",
                                                              "maxLength": 1024}}  # the fuzzer's
        op["requestBody"] = {"required": True, "description": limit, "content": content}
    if route.auth != "none":
        op["security"] = [{"bearer": []}]
    return op


def _path_names(path: str) -> list[str]:
    return [part[1:-1] for part in path.split("/") if part.startswith("{")]


def document(routes: list[Any]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r)
    return {
        "openapi": "3.1.0",
        "info": {"title": "agentstate State API", "version": agentstate.__version__,
                 "description": "Scoped state, runs, sessions and the change feed of one "
                                "agentstate store (SPEC §12). `x-limits`: every limit a request "
                                "meets.",
                 "x-limits": LIMITS.as_dict()},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
