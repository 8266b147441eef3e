"""The State API's one route table: Starlette's routes and the OpenAPI document are both
made from ROUTES, and each entry states what its route needs (``auth``, the ``grant`` a
token with grants needs — SPEC §15, ``_access.GRANTS`` — and the body's ``limit``), all
checked by ``API.endpoint`` before the handler runs."""

from __future__ import annotations

from ._api import Route_
from ._limits import LIMITS
from ._models import (AppendBody, BatchBody, ClaimBody, ForkBody, GetManyBody, PinBody, PopBody,
                      PruneRunsBody, PruneSessionsBody, PutBody, RestoreBody, SessionBody,
                      SessionForkBody, SettingBody, SettleBody, TouchBody, TrimBody, TurnBody,
                      WriteBody)
from .views import admin, changes, keys, past, runs, sessions

VALUES = LIMITS.value_body  # a body that carries values
PAST = ("as_of",)  # a read of the past (SPEC §17): 400 past the head, 410 before what is kept
AS_OF = ("The store as it was right after change `as_of` (SPEC §17): 400 invalid_value past "
         "the newest change, 410 cursor_expired older than the history kept.")


def _key_routes() -> list[Route_]:
    kv = "/v1/scopes/{kind}/{id}/keys"
    own = "/v1/sessions/{session_id}/state/keys"
    out: list[Route_] = []
    for base, tag in ((kv, "scope"), (own, "session state")):
        rd, wr = (("scope", "r"), ("scope", "rw")) if base == kv else ("session", "session")
        out += [
            Route_("GET", base + "/{key}", keys.get_key, f"Read a key ({tag})", answer="Versioned",
                   query=PAST, errors=(400, 404, 410), extra={"bytes_answer": True}, grant=rd,
                   description=AS_OF),
            Route_("PUT", base + "/{key}", keys.put_key, f"Write a key ({tag})", body=PutBody,
                   query=("if_version", "ttl"), answer="Version", errors=(400, 409, 413),
                   limit=VALUES, extra={"bytes_body": LIMITS.bytes_body}, grant=wr),
            Route_("DELETE", base + "/{key}", keys.delete_key, f"Delete a key ({tag})",
                   query=("if_version",), answer="Deleted", errors=(400, 409), grant=wr),
            Route_("POST", base + "/{key}/append", keys.append, f"Append to a list ({tag})",
                   body=AppendBody, answer="Appended", errors=(400, 409, 413), limit=VALUES,
                   grant=wr),
            Route_("POST", base + "/{key}/pop", keys.pop, f"Pop the last items ({tag})", body=PopBody,
                   answer="Items", errors=(400, 409, 413), grant=wr),
            Route_("POST", base + "/{key}/touch", keys.touch, f"Set a key's expiry ({tag})",
                   body=TouchBody, answer="Touched", errors=(400, 413), grant=wr),
            Route_("GET", base + "/{key}/expires_at", keys.expires_at, f"When a key expires ({tag})",
                   query=PAST, answer="ExpiresAt", errors=(400, 410), grant=rd, description=AS_OF),
            Route_("GET", base + "/{key}/slice", keys.slice, f"Items of a list ({tag})",
                   query=("start", "stop", *PAST), answer="Items", errors=(400, 409, 410),
                   grant=rd, description=AS_OF),
            Route_("GET", base + "/{key}/length", keys.length, f"Length of a list ({tag})",
                   query=PAST, answer="Length", errors=(400, 409, 410), grant=rd,
                   description=AS_OF),
            Route_("GET", base + "/{key}/history", past.history,
                   f"A key's kept revisions, newest first ({tag})",
                   query=("since", "before", "limit"), answer="Revisions", errors=(400, 410),
                   grant=rd, description=past.HISTORY),
            Route_("GET", base, keys.keys, f"List keys ({tag})",
                   query=("prefix", "after", "limit", *PAST), answer="Keys", errors=(400, 410),
                   grant=rd, description=AS_OF),
            Route_("POST", base[:-len("/keys")] + "/get_many", keys.get_many,
                   f"Read several keys at once ({tag})", body=GetManyBody, answer="Values",
                   errors=(400, 410, 413), limit=LIMITS.value_body, grant=rd,
                   description="`as_of`: the keys as they were right after that change (SPEC "
                               "§17; 400 past the newest change, 410 older than the history "
                               "kept)."),
            Route_("GET", base[:-len("/keys")] + "/items", keys.items,
                   f"List keys with their values ({tag})",
                   query=("prefix", "after", "limit", *PAST), answer="KeyValues",
                   errors=(400, 410), grant=rd, description=AS_OF),
            Route_("POST", base[:-len("/keys")] + "/clear", keys.clear,
                   f"Delete every key ({tag})", answer="Cleared", errors=(400,), grant=wr),
            Route_("POST", base[:-len("/keys")] + "/restore", past.restore,
                   f"Put keys back as they were after a change ({tag})", body=RestoreBody,
                   answer="Restored", errors=(400, 409, 410, 413), limit=VALUES, grant=wr,
                   description=past.RESTORE),
        ]
    for r in out:
        if r.path.startswith(own):
            r.errors = tuple(sorted({*r.errors, 404}))
    return out


ROUTES: list[Route_] = _key_routes() + [
    Route_("POST", "/v1/batch", keys.batch, "Writes applied all or none", body=BatchBody,
           answer="BatchResults", errors=(400, 404, 409, 413), limit=LIMITS.batch_body,
           grant="batch",
           description=f"At most {LIMITS.batch_ops:,} ops (more: 413 too_large). Each op takes its "
                       "own fields only; a `put` without `value` or an `append` without `items` is "
                       "400 invalid_value (an explicit null is a value). A `check` (`scope`, `key`, "
                       "`if_version`) writes nothing: the batch applies only if that key is at "
                       "that version (0: absent), else 409 version_conflict; its result is "
                       "`{\"version\"}`. A token with grants needs `rw` on every written op's "
                       "scope (`r` for a check), else 403 forbidden and nothing is written."),
    Route_("GET", "/v1/runs", runs.runs_list, "Runs, newest update first", query=("after", "limit"),
           answer="Runs", errors=(400, 403, 404), grant="list",
           description="A token with grants sees the runs a `runs` rule covers, and no other."),
    Route_("POST", "/v1/runs/prune", runs.runs_prune, "Delete old runs (admin)", body=PruneRunsBody,
           answer="RunIds", errors=(400, 403, 413), auth="admin", grant="admin"),
    Route_("GET", "/v1/runs/{run_id}", runs.run_get, "A run: entries and snapshot",
           answer="Run", errors=(400, 404), grant=("run", "r")),
    Route_("GET", "/v1/runs/{run_id}/head", runs.run_head, "A run's snapshot and bounds, without "
           "its history", answer="RunHead", errors=(400, 404, 500), grant=("run", "r")),
    Route_("DELETE", "/v1/runs/{run_id}", runs.run_delete, "Delete a run", answer="Deleted",
           grant=("run", "rw")),
    Route_("POST", "/v1/runs/{run_id}/write", runs.run_write, "Add entries, replace the snapshot",
           body=WriteBody, answer="Written", errors=(400, 404, 409, 413), limit=LIMITS.run_body,
           grant=("run", "rw")),
    Route_("GET", "/v1/runs/{run_id}/entries", runs.run_entries, "Entries from a seq",
           query=("since", "limit"), answer="Entries", grant=("run", "r")),
    Route_("GET", "/v1/runs/{run_id}/tail", runs.run_tail, "The last entries", query=("n",),
           answer="Entries", grant=("run", "r")),
    Route_("GET", "/v1/runs/{run_id}/load", runs.run_load, "The run ready to resume",
           answer="Record", errors=(400, 404, 500), grant=("run", "r")),
    Route_("POST", "/v1/runs/{run_id}/fork", runs.run_fork, "Fork a run", body=ForkBody,
           answer="Id", errors=(400, 404, 409, 413), grant=("run", "r"),
           description="A token with grants needs `r` on the run and `rw` on `new_id`."),
    Route_("POST", "/v1/runs/{run_id}/trim", runs.run_trim, "Remove old entries", body=TrimBody,
           answer="Removed", errors=(400, 404, 413), grant=("run", "rw")),
    Route_("POST", "/v1/runs/{run_id}/pin", runs.run_pin, "Keep a run from prune (or not)",
           body=PinBody, answer="Pinned", errors=(400, 404, 413), grant=("run", "rw")),
    Route_("POST", "/v1/runs/{run_id}/calls/{call_id}/claim", runs.call_claim,
           "Claim a tool call, or say where it stands (SPEC §14)", body=ClaimBody,
           answer="Claim", errors=(400, 404, 409, 413), limit=LIMITS.run_body, grant=("run", "rw"),
           description="Every status is a 200 answer: claimed (run the call now, then settle "
                       "it), done (with its result), failed (with its error), in_progress, "
                       "in_doubt (retry=true claims it again). Errors: a bad request, a missing "
                       "run, or a lapsed X-Agentstate-Fence (409 lease_lost)."),
    Route_("POST", "/v1/runs/{run_id}/calls/{call_id}/settle", runs.call_settle,
           "Record a claimed tool call's outcome", body=SettleBody, answer="Settled",
           errors=(400, 404, 409, 413), limit=LIMITS.run_body, grant=("run", "rw"),
           description="Exactly one of `result` (a JSON value) and `error` (its text); "
                       "`retry` names the claim settled (its entry's `retry`, 0 for the first). "
                       "409 invalid_transition: the call is not claimed, settled already, or "
                       "claimed again since the claim named."),
    Route_("POST", "/v1/sessions", sessions.sessions_create, "A new session", body=SessionBody,
           ok=201, answer="Session", errors=(400, 403, 413), limit=VALUES, grant="session"),
    Route_("GET", "/v1/sessions", sessions.sessions_list, "My sessions (all: admin)",
           query=("after", "limit"), answer="Sessions", errors=(400, 403, 404), grant="session"),
    Route_("POST", "/v1/sessions/prune", sessions.sessions_prune, "Delete idle sessions (admin)",
           body=PruneSessionsBody, answer="SessionIds", errors=(400, 403, 413), auth="admin",
           grant="admin"),
    Route_("GET", "/v1/sessions/{session_id}", sessions.session_get, "A session", answer="Session",
           errors=(400, 403, 404), grant="session"),
    Route_("DELETE", "/v1/sessions/{session_id}", sessions.session_delete, "Delete a session",
           answer="Deleted", errors=(400, 403, 404), grant="session"),
    Route_("POST", "/v1/sessions/{session_id}/fork", past.fork,
           "A new session with this one's state as of a change", body=SessionForkBody, ok=201,
           answer="Session", errors=(400, 403, 404, 410, 413), limit=VALUES, grant="session",
           description="A new session of the caller's (SPEC §17) whose state is the session's "
                       "right after change `at` (absent or null: now), with no turns; "
                       "`metadata` absent or null: the original's. Its lists are shared until "
                       "written. 404 for a session not the caller's (as for an unknown one), "
                       "400 for `at` past the newest change, 410 older than the history kept."),
    Route_("GET", "/v1/sessions/{session_id}/turns", sessions.turns_list, "A session's turns",
           query=("after", "limit"), answer="Turns", errors=(400, 403, 404), grant="session"),
    Route_("POST", "/v1/sessions/{session_id}/turns", sessions.turn_start, "Start (or queue) a turn",
           body=TurnBody, ok=201, answer="Turn", errors=(400, 403, 404, 409, 413), limit=VALUES,
           grant="session"),
    Route_("POST", "/v1/sessions/{session_id}/release", sessions.session_release,
           "End the active turn (admin)", answer="Turn", errors=(400, 403, 404, 409),
           grant="session",
           description="An admin's; anyone else gets 404 for a session not theirs (as for an "
                       "unknown one) and 403 for their own: the store decides, in that order."),
    Route_("GET", "/v1/turns", sessions.turns_by_status, "Open turns by status (mine; all: admin)",
           query=("status", "after", "limit"), answer="Turns", errors=(400, 403, 404),
           grant="session"),
    Route_("GET", "/v1/turns/{turn_id}", sessions.turn_get, "A turn", answer="Turn",
           errors=(400, 403, 404), grant="session"),
    Route_("POST", "/v1/turns/{turn_id}/{action}", sessions.turn_action, "Move a turn",
           body="action", answer="Turn", errors=(400, 403, 404, 409, 413), limit=VALUES,
           grant="session"),
    Route_("GET", "/v1/changes", changes.changes, "Changes after a seq (a long poll with wait)",
           query=("since", "wait", "topic", "kind", "scope_id", "key", "limit"), answer="Changes",
           errors=(400, 410), grant="feed",
           description="`last` is where the next poll starts: past every change scanned, those "
                       "the filters or the session rule left out included. With `wait` (up to "
                       f"{LIMITS.long_poll_wait} s) the answer waits for a change the caller may "
                       "see; a token revoked meanwhile ends it with a 401. A token with grants sees "
                       "the changes of what it may read: its rules' scopes and runs, its own "
                       "sessions."),
    Route_("GET", "/v1/diff", past.diff, "What changed between two changes",
           query=("since", "until", "kind", "scope_id", "key", "after", "limit"), answer="Diffs",
           errors=(400, 410), grant="feed", description=past.DIFF),
    Route_("GET", "/v1/changes/head", changes.changes_head, "The newest change's seq",
           answer="Head", errors=(), grant="none"),
    Route_("GET", "/v1/changes/stream", changes.changes_stream, "Changes as server-sent events",
           query=("since", "topic", "kind", "scope_id", "key", "limit"), answer="stream",
           errors=(400, 410), grant="feed", description=changes.STREAM_EVENTS),
    Route_("GET", "/v1/settings", admin.settings, "The store's settings", answer="Settings",
           errors=(), grant="none"),
    Route_("PUT", "/v1/settings/{name}", admin.set_setting, "Change a setting (admin)",
           body=SettingBody, answer="Settings", errors=(400, 403, 413), auth="admin",
           grant="admin"),
    Route_("GET", "/v1/admin/check", admin.check, "Integrity and invariants (admin)",
           answer="Problems", errors=(403, 500), auth="admin", grant="admin"),
    Route_("GET", "/v1/admin/info", admin.info, "Sizes, versions, counts (admin)", answer="object",
           errors=(403,), auth="admin", grant="admin"),
    Route_("GET", "/v1/whoami", admin.whoami, "Who a request acts as (and its token's grants)",
           answer="object", errors=(), grant="none"),
    Route_("GET", "/v1/health", admin.health, "Liveness", answer="Health", errors=(), auth="none",
           grant="none"),
    Route_("GET", "/openapi.json", admin.openapi, "This document", answer="object", errors=(),
           auth="none", grant="none"),
]
