"""The tools' arguments (SPEC §18): one strict model per tool, whose JSON schema is what a
model is shown (``tools/list``) and whose validation is what it is held to.

Strict as the State API's bodies are (``server._http.Body``: ``1.0`` is not an integer,
``"3"`` not a number, unknown arguments are refused); values themselves are the store's
to check. Descriptions are written for the model that reads them.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from agentstate.server._http import Body
from agentstate.server._limits import LIMITS
from agentstate.server._models import SettleBody

PAGE = 100  # items a paged tool returns by default ...
MAX_PAGE = 1000  # ... and at most: a model's context is the reader here, not a program
HISTORY = 20  # revisions state_history returns by default (each may hold a whole list)

Scope = Annotated[str, Field(description=(
    'The scope, written "KIND:ID": KIND is thread, session, agent, user or app; ID is 1-200 '
    'characters of A-Z a-z 0-9 . _ : - (e.g. "user:u-7", "agent:support-bot", "session:s-42"). '
    "Keys in one scope are never visible from another."))]
Key = Annotated[str, Field(description="The key: 1-200 characters of A-Z a-z 0-9 . _ : -")]
IfVersion = Annotated[int | None, Field(description=(
    "Write only if the key is still at this version (from state_get; 0: only if the key is "
    "absent). If another writer changed it since, nothing is written and the call fails with "
    "version_conflict, whose current_version is the version now stored: read the key again, "
    "redo your change on what you read, and retry with that version."))]
Limit = Annotated[int, Field(ge=1, le=MAX_PAGE, description=(
    f"At most this many (default {PAGE}, up to {MAX_PAGE})."))]
RunId = Annotated[str, Field(description="The run's id: 1-200 characters of A-Z a-z 0-9 . _ : -")]
CallId = Annotated[str, Field(description=(
    "Your id for this call, the same on every retry of it (e.g. derived from the request it "
    "serves): 1-200 characters of A-Z a-z 0-9 . _ : -"))]
TurnId = Annotated[str, Field(description="The turn's id, as turn_start returned it.")]
Lease = Annotated[float, Field(description=(
    "Seconds the turn holds the session without a heartbeat (default 60)."))]
JSON = "any JSON value"


class Args(Body):
    """Every tool's arguments: strict types, no unknown arguments (``Body``)."""


class StateGet(Args):
    scope: Scope
    key: Key


class StatePut(Args):
    scope: Scope
    key: Key
    value: Annotated[Any, Field(description=f"The new value: {JSON}, at most 1 MiB as JSON.")]
    if_version: IfVersion = None
    ttl: Annotated[float | None, Field(description=(
        "Seconds until the key expires (and reads as absent); omit for never."))] = None


class StateUpdate(Args):
    scope: Scope
    key: Key
    patch: Annotated[Any, Field(description=(
        "A JSON merge patch (RFC 7396): each member replaces that member of the stored object, "
        "a member set to null removes it, nested objects merge the same way; a patch that is "
        "not an object replaces the whole value."))]
    if_version: Annotated[int, Field(description=(
        "The version you read (state_get; 0: the key is absent and is created from the patch). "
        "The patch is applied only if the key is still at this version; otherwise nothing is "
        "written and the call fails with version_conflict and current_version: read again, "
        "check your change still makes sense, and retry with the new version."))]


class StateAppend(Args):
    scope: Scope
    key: Key
    items: Annotated[list[Any], Field(description=(
        "The items to add at the end of the list, in order (a list of JSON values)."))]


class StateSlice(Args):
    scope: Scope
    key: Key
    start: Annotated[int, Field(description=(
        "Index of the first item (default 0); negative counts from the end: -10 starts at the "
        "tenth item from the end."))] = 0
    stop: Annotated[int | None, Field(description=(
        "Index just past the last item; omit for the end; negative counts from the end."))] = None
    limit: Limit = PAGE


class StateDelete(Args):
    scope: Scope
    key: Key
    if_version: IfVersion = None


class StateList(Args):
    scope: Scope
    prefix: Annotated[str, Field(description=(
        "Only keys that start with this text (taken literally: _ % * match only themselves)."
    ))] = ""
    after: Annotated[str | None, Field(description=(
        "Only keys after this one: pass the previous call's next to read the next page."))] = None
    limit: Limit = PAGE


class StateHistory(Args):
    scope: Scope
    key: Key
    limit: Annotated[int, Field(ge=1, le=MAX_PAGE, description=(
        f"At most this many revisions, the newest first (default {HISTORY}, up to "
        f"{MAX_PAGE}; fewer when their values are large)."))] = HISTORY
    before: Annotated[int | None, Field(ge=0, description=(
        "Only changes before this seq: pass the previous call's next to read older "
        "revisions."))] = None


class ChangesWait(Args):
    since: Annotated[int | None, Field(ge=0, description=(
        "Changes after this seq: the last of your previous call. Omit to wait for changes from "
        "now on; 0 reads from the oldest change the store keeps."))] = None
    wait: Annotated[float, Field(ge=0, le=LIMITS.long_poll_wait, description=(
        "Seconds to wait when there is no change yet (default 0: answer at once; up to "
        f"{LIMITS.long_poll_wait}). Keep it under your client's time limit for a tool call."
    ))] = 0
    topic: Annotated[str | None, Field(description=(
        "Only this kind of change: kv (keys of scopes), run (runs' histories), session "
        "(sessions and turns)."))] = None
    kind: Annotated[str | None, Field(description=(
        "Only keys of scopes of this kind (thread, session, agent, user, app)."))] = None
    scope_id: Annotated[str | None, Field(description=(
        "Only this scope id (of a kv change), run id (run) or session id (session)."))] = None
    key: Annotated[str | None, Field(description="Only this key (kv changes).")] = None
    limit: Limit = PAGE


class RunsWrite(Args):
    run_id: RunId
    entries: Annotated[list[Any], Field(description=(
        'History entries to add, in seq order: objects with an integer "seq", continuing right '
        "after the run's last seq (the first entry of a run is seq 0)."))] = []
    snapshot: Annotated[Any, Field(description=(
        "An object that replaces the run's snapshot (its current state); omit or null to keep "
        "the one stored."))] = None
    create: Annotated[bool, Field(description=(
        "true: make a new run (already_exists if the id is taken); false (default): the run "
        "must exist (not_found otherwise)."))] = False


class RunsLoad(Args):
    run_id: RunId
    since: Annotated[int, Field(ge=0, description=(
        "Entries from this seq on (default 0: the first kept); pass the previous call's next "
        "for the next page, or next_seq minus N for the last N entries."))] = 0
    limit: Limit = PAGE


class RunsList(Args):
    after: Annotated[str | None, Field(description=(
        "Only runs listed after this run id: pass the previous call's next."))] = None
    limit: Limit = PAGE


class CallClaim(Args):
    run_id: RunId
    call_id: CallId
    call: Annotated[dict[str, Any] | None, Field(description=(
        "What the call is (e.g. its tool name and arguments), kept with the claim."))] = None
    lease: Annotated[float, Field(description=(
        "Seconds your claim stays in progress for other callers (default 300): settle the "
        "call within it."))] = 300.0
    retry: Annotated[bool, Field(description=(
        "true: claim again a call in_doubt. Only when you know its effect did not happen."
    ))] = False


class CallSettle(SettleBody):  # exactly one of result and error: the API's own rule
    run_id: RunId
    call_id: CallId
    result: Annotated[Any, Field(description=f"The call's result if it succeeded: {JSON}.")] = None
    error: Annotated[str | None, Field(description=(
        "What went wrong, if the call failed (a text). Give result or error, not both."))] = None
    retry: Annotated[int | None, Field(ge=0, lt=2**31, description=(
        'The claim you settle: the "retry" of the entry call_claim gave you (0, or omit it, for '
        "a first claim). If the call was claimed again since (retry true), nothing is recorded "
        "and the call fails with invalid_transition: the newer claimer settles it."))] = None


class SessionCreate(Args):
    metadata: Annotated[dict[str, Any] | None, Field(description=(
        "An object kept with the session (a title, the user it serves, ...)."))] = None


class TurnStart(Args):
    session_id: Annotated[str, Field(description="The session's id, as session_create returned it.")]
    input: Annotated[Any, Field(description=f"What the turn is for ({JSON}), kept with it.")] = None
    lease: Lease = 60.0
    queued: Annotated[bool, Field(description=(
        "true: make the turn queued, not running (it still blocks other turns)."))] = False


class TurnFinish(Args):
    turn_id: TurnId
    result: Annotated[Any, Field(description=f"The turn's result ({JSON}), kept with it.")] = None


class TurnFail(Args):
    turn_id: TurnId
    error: Annotated[str, Field(description="What went wrong (a text), kept with the turn.")]


class TurnHeartbeat(Args):
    turn_id: TurnId
    lease: Annotated[float | None, Field(description=(
        "Seconds from now the lease runs (default: its last length)."))] = None
