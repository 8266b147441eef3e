"""Who may use what: the one place for the API's routes and batch, the change feed (long
polls and streams) and the pages.

- Grants (SPEC §15): a token with grants may use a scope or a run only where one of its
  rules covers it (``need``; ``check_route`` for a route's own ids, before its handler
  runs). Admins and tokens without grants are not limited by them.
- Sessions (SPEC §4) are their owner's (and admins'), whatever the grants. A session's
  state lives in the plain ``session`` scope kind. A ``session:ID`` scope with no session
  behind it is a plain scope anyone may use (a token with grants: where a rule covers it)
  — unless ID is, or was, a session's: see ``SessionRule.hidden``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import agentstate
from agentstate import _grants
from agentstate._encoding import SCOPE_KINDS, check_key, check_kind
from agentstate._grants import RUNS, Rule
from agentstate.backends.grants import SESSION_ID, Readable
from agentstate.errors import Forbidden, NotFound

SEE_ALL = agentstate.Principal("agentstate-server", admin=True)
Rules = tuple[Rule, ...] | None  # a token's grants; None: it has none
# What a route needs (its Route_.grant): a read ("r") or a write ("rw") of the scope its
# path names, or of the run; "session": SPEC §4's owner rule, checked by the store; "list",
# "feed", "batch": the handler asks, for what the body or the store's rows name; "admin":
# an admin route; "none": nothing beyond a valid token (or no token: auth "none").
GRANTS = (("scope", "r"), ("scope", "rw"), ("run", "r"), ("run", "rw"), "session", "list",
          "feed", "batch", "admin", "none")


def may(p: agentstate.Principal, rules: Rules, kind: str, id: str, write: bool) -> bool:
    """Whether ``p`` with ``rules`` may read (``write``: and write) the scope ``kind:id``
    (kind ``runs``: the run ``id``) as far as grants go. An id of a session's form is the
    session rule's to decide, never a grant's."""
    if p.admin or rules is None:
        return True
    if kind == "session" and SESSION_ID.fullmatch(id):
        return True  # its owner's without a grant; anyone else's by no grant (SessionRule)
    return _grants.allows(rules, kind, id, write)


def need(p: agentstate.Principal, rules: Rules, kind: str, id: str, write: bool) -> None:
    """Forbidden (403, and nothing done) unless ``may``."""
    if not may(p, rules, kind, id, write):
        what = f"the run {id}" if kind == RUNS else f"the scope {kind}:{id}"
        raise Forbidden(f"this token's grants do not let it {'write' if write else 'read'} "
                        f"{what}")


def check_route(grant: Any, p: agentstate.Principal | None, rules: Rules,
                params: dict[str, str]) -> None:
    """What the route's entry says it needs of the ids in its path, before its handler runs.
    Bad ids are refused first, as the handler would (InvalidKey: 400 whoever asks)."""
    if grant not in GRANTS:
        raise Forbidden("this route states no grant: refused")  # tests/test_grants.py
    if not isinstance(grant, tuple) or p is None:
        return
    what, mode = grant
    if what == "scope":
        kind, sid = check_kind(params["kind"]), check_key(params["id"], "scope id")
    else:
        kind, sid = RUNS, check_key(params["run_id"], "run id")
    need(p, rules, kind, sid, mode == "rw")


def readable(p: agentstate.Principal, rules: Rules) -> Readable | None:
    """The feed filter of a caller with grants (the store applies it), else None."""
    return None if p.admin or rules is None else Readable(p.name, rules)


def past_readable(p: agentstate.Principal, rules: Rules) -> Readable | None:
    """What a caller may read of the store's past, as one filter of the store's query: a
    token's grants as in the feed; without grants, every scope but other principals'
    sessions (the session rule, in SQL: every kind by a rule for any id, a session's only
    its owner's); an admin, everything (None)."""
    if p.admin:
        return None
    if rules is None:
        rules = tuple(Rule(kind, "", True, False) for kind in SCOPE_KINDS)
    return Readable(p.name, rules)


def of_a_session(c: agentstate.Change) -> str | None:
    """The session id a change is about (its own topic, or a key of its scope), else None."""
    if c.topic == "session" or (c.topic == "kv" and c.kind == "session"):
        return c.scope_id
    return None


class SessionRule:
    """Which session ids a principal may not see, by a point read of each id involved."""

    def __init__(self, db: agentstate.Database) -> None:
        self.db = db  # a store-side ``sessions.owners(ids)`` would make this one statement

    def hidden(self, p: agentstate.Principal, ids: Iterable[str]) -> set[str]:
        """The ids of ``ids`` whose scope, keys and feed rows ``p`` may not see: none for an
        admin; for anyone else,

        - a session that exists and is another principal's: hidden;
        - the principal's own session: visible;
        - no session with that id, and the id has the form the store gives sessions
          (``s-`` and 32 hex digits): it was a session, since deleted — hidden, from its
          former owner too, because the store does not keep a deleted session's owner;
        - any other id: never a session's (the store makes no other), so a plain scope of
          kind ``session``, anyone's — visible, and no read is needed.

        Blocking (a store read per id of a session's form): call it from a worker thread.
        tests/test_server_feed.py checks that the store still makes ids of that form.
        """
        if p.admin:
            return set()
        out = set()
        for sid in set(ids):
            if not SESSION_ID.fullmatch(sid):
                continue  # never a session's id: a plain scope's, and no read needed
            try:  # the row, not sessions.get(): no metadata (up to 1 MiB) decoded per id
                owner = self.db._ops.session_get(sid, SEE_ALL.name, True)[1]
            except NotFound:
                out.add(sid)  # of a session's form, and none: a deleted one
                continue
            if owner != p.name:
                out.add(sid)
        return out

    def check(self, p: agentstate.Principal, kind: str, scope_id: str) -> None:
        """NotFound for a scope this principal may not use (as for an unknown session)."""
        if kind == "session" and self.hidden(p, [scope_id]):
            raise NotFound(f"no session {scope_id!r}")

    def visible(self, p: agentstate.Principal, changes: list[Any], rules: Rules = None) -> list[Any]:
        """The changes ``p`` (with ``rules``, its token's grants) may see, in order: the
        session rule, and the grants. (For a caller with grants the store's query has
        left out the rest already: ``readable``; this is the same rule, in Python.)"""
        if p.admin:
            return changes
        ids = {sid for c in changes if (sid := of_a_session(c)) is not None}
        hidden = self.hidden(p, ids) if ids else set()
        return [c for c in changes if _shown(c, p, rules, hidden)]


def _shown(c: Any, p: agentstate.Principal, rules: Rules, hidden: set[str]) -> bool:
    sid = of_a_session(c)
    if sid is not None and sid in hidden:
        return False
    if c.topic == "run":
        return may(p, rules, RUNS, c.scope_id, False)
    if c.topic == "kv":
        return may(p, rules, c.kind, c.scope_id, False)
    return True  # a session's own change: the session rule alone
