"""Who may see a session's traces: the one rule for the API's key routes and batch, the
change feed (long polls and streams) and the pages.

SPEC §4 keeps a session to its owner (and admins), and a session's state lives in the
plain ``session`` scope kind. A ``session:ID`` scope with no session behind it is a plain
scope anyone may use — unless ID is, or was, a session's: see ``SessionRule.hidden``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import agentstate
from agentstate.errors import NotFound

# The only ids the store gives sessions (_ops.session_create: "s-" and a uuid4's hex).
# They are random, so no id of this form names a plain scope by accident.
SESSION_ID = re.compile(r"s-[0-9a-f]{32}")
SEE_ALL = agentstate.Principal("agentstate-server", admin=True)


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

    def visible(self, p: agentstate.Principal, changes: list[Any]) -> list[Any]:
        """The changes ``p`` may see, in order."""
        if p.admin:
            return changes
        ids = {sid for c in changes if (sid := of_a_session(c)) is not None}
        if not ids:
            return changes
        hidden = self.hidden(p, ids)
        return [c for c in changes if of_a_session(c) not in hidden]
