"""The fence header over HTTP (SPEC §14) keeps to the owner rule (SPEC §4): a turn of
another principal's session fences nothing and reveals nothing, on both backends."""

from __future__ import annotations

import httpx

import agentstate
from agentstate.server import create_app

from .conftest import digest
from .test_server import _Sync

ALICE, BOB = agentstate.Principal("alice"), agentstate.Principal("bob")


def _client(app, token, fence):
    return httpx.Client(transport=_Sync(app), base_url="http://t", headers={
        "authorization": f"Bearer {token}", "x-agentstate-fence": fence})


def test_a_fence_naming_another_principal_s_turn_is_as_an_unknown_turn(any_db):
    """Hostile review: bob's write fenced by alice's running turn went through (and by her
    held turn said 'held'), telling bob her turn's state while GET /v1/turns/ID was 404 for
    him. Now it is lease_lost '(unknown)' whatever her turn's state, and writes nothing;
    alice's own and an admin's fenced writes still land."""
    db = any_db
    app = create_app(db)
    tokens = {name: db.tokens.create(name, admin=name == "ops") for name in ("alice", "bob", "ops")}
    s = db.sessions.create(ALICE)
    turn = db.sessions.start_turn(s.id, ALICE, lease=600)
    path = "/v1/scopes/thread/t-1/keys/k"
    answers = {}
    for state in ("running", "held"):
        if state == "held":
            turn.hold()
        before = digest(db)
        r = _client(app, tokens["bob"], turn.id).put(path, json={"value": 1})
        answers[state] = (r.status_code, r.json()["error"]["code"], "(unknown)" in r.text)
        batch = {"ops": [{"op": "put", "scope": "thread:t-1", "key": "k", "value": 1}]}
        rb = _client(app, tokens["bob"], turn.id).post("/v1/batch", json=batch)
        assert rb.status_code == 409 and "(unknown)" in rb.text
        assert digest(db) == before
    unknown = _client(app, tokens["bob"], "t-" + "0" * 32).put(path, json={"value": 1})
    assert answers == {"running": (409, "lease_lost", True), "held": (409, "lease_lost", True)}
    assert unknown.status_code == 409 and "(unknown)" in unknown.text
    turn2 = db.sessions.start_turn(db.sessions.create(ALICE).id, ALICE, lease=600)
    assert _client(app, tokens["alice"], turn2.id).put(path, json={"value": 2}).status_code == 200
    assert _client(app, tokens["ops"], turn2.id).put(path, json={"value": 3}).status_code == 200
    assert db.scope("thread", "t-1").get("k") == 3
