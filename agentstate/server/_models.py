"""Request bodies of the State API: strict envelopes; values are checked by the store."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from ._http import Body

Seconds = float  # strict: an int or a float, never a bool or a string


class PutBody(Body):
    value: Any
    if_version: int | None = None
    ttl: float | int | None = None
    keep_ttl: bool = False  # with if_version: keep the key's expiry (a remote update())


class AppendBody(Body):
    items: list[Any]
    ttl: float | int | None = None


class PopBody(Body):
    n: int = 1


class TouchBody(Body):
    ttl: float | int | None = None


# Each batch op's required field and the fields it takes besides op, scope and key: the
# validator below enforces them, and the OpenAPI document states them (_op_fields), so
# that a client generated from it, or a fuzzer, agrees with the server.
_OP_FIELDS: dict[str, tuple[str | None, frozenset[str]]] = {
    "put": ("value", frozenset({"value", "if_version", "ttl"})),
    "delete": (None, frozenset({"if_version"})),
    "append": ("items", frozenset({"items", "ttl"})),
    "check": ("if_version", frozenset({"if_version"})),
}


def _op_fields(schema: dict[str, Any]) -> None:
    schema["allOf"] = [
        {"if": {"properties": {"op": {"const": op}}},
         "then": {"required": [needs] if needs else [],
                  "properties": {**{name: False for name in ("value", "items", "if_version", "ttl")
                                    if name not in takes},
                                 # null is refused too (by BatchScope.check)
                                 **({"if_version": {"type": "integer"}} if op == "check" else {})}}}
        for op, (needs, takes) in _OP_FIELDS.items()]


class BatchOp(Body):
    """One op; each takes its own fields only. As for PUT of a key, a missing ``value`` is
    refused and an explicit null is a value (so ``value`` cannot default to None here).
    A ``check`` writes nothing: the batch applies only if its key is at ``if_version``."""

    model_config = ConfigDict(json_schema_extra=_op_fields)

    op: Literal["put", "delete", "append", "check"]
    scope: str
    key: str
    value: Any = None
    items: list[Any] | None = None
    if_version: int | None = None
    ttl: float | int | None = None

    @model_validator(mode="after")
    def _fields_of_its_op(self) -> BatchOp:
        given = self.model_fields_set
        needs, takes = _OP_FIELDS[self.op]
        if needs is not None and needs not in given:
            raise ValueError(f"a {self.op} needs {needs!r} (null is a value; a missing one is not)")
        extra = sorted(given - takes - {"op", "scope", "key"})
        if extra:
            raise ValueError(f"a {self.op} takes no {', '.join(extra)}")
        return self


class BatchBody(Body):
    ops: list[BatchOp]


class WriteBody(Body):
    entries: list[Any] = Field(default_factory=list)
    snapshot: Any = None
    create: bool = False


class ForkBody(Body):
    new_id: str
    upto: int | None = None


class TrimBody(Body):
    before: int


class PruneRunsBody(Body):
    older_than: float | int
    finished_only: bool = True


class PruneSessionsBody(Body):
    idle_for: float | int


class SessionBody(Body):
    metadata: dict[str, Any] | None = None


class TurnBody(Body):
    input: Any = None
    lease: float | int = 60.0
    queued: bool = False


class LeaseBody(Body):
    lease: float | int | None = None


class HoldBody(Body):
    request: Any = None


class DecideBody(Body):
    decision: Any = None


class FinishBody(Body):
    result: Any = None


class FailBody(Body):
    error: str


class SettingBody(Body):
    value: Any


class GetManyBody(Body):
    keys: list[str]
    as_of: int | None = Field(default=None, ge=0, lt=2**63)  # SPEC §17: the keys then


class RestoreBody(Body):
    """Put a scope's keys (or only ``keys``) back as they were right after change ``at``."""

    at: int = Field(ge=0, lt=2**63)
    keys: list[str] | None = None


class SessionForkBody(Body):
    """A new session whose state is the original's right after change ``at`` (null: now);
    ``metadata`` null: the original's."""

    at: int | None = Field(default=None, ge=0, lt=2**63)
    metadata: dict[str, Any] | None = None


class PinBody(Body):
    pinned: bool = True


class ClaimBody(Body):
    """A claim of a tool call (SPEC §14); ``call`` is merged into its tool_call entry."""

    call: dict[str, Any] | None = None
    lease: float | int = 300.0
    retry: bool = False


class SettleBody(Body):
    """A claimed call's outcome: ``result`` (a JSON value; null is one) or ``error`` (a
    text), and ``retry``, the claim it settles (its entry's count, 0 for the first)."""

    result: Any = None
    error: str | None = None
    retry: int | None = Field(default=None, ge=0, lt=2**31)

    @model_validator(mode="after")
    def _one_outcome(self) -> SettleBody:
        if len(self.model_fields_set & {"result", "error"}) != 1:
            raise ValueError("give the call's result, or its error, and not both")
        if "error" in self.model_fields_set and self.error is None:
            raise ValueError("error must be the error's text (a result of null is "
                             '{"result": null})')
        return self
