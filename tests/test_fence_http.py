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


# What each write route is sent (its path filled, its body): a request that succeeds
# unfenced, so a refusal under a lapsed fence is the fence's (SPEC §16: every write route).
def _write_requests(db, n: int) -> dict[tuple[str, str], tuple[str, dict | None]]:
    s = db.sessions
    run = f"r{n}"
    db.runs.write(run, [{"seq": 0, "type": "note"}], None, create=True)
    db.runs.claim(run, "c1")
    db.scope("thread", f"t{n}").append("list", [1, 2, 3])
    own = s.create(ALICE)
    s.state(own.id, ALICE).append("list", [1, 2])
    busy = s.create(ALICE)
    s.start_turn(busy.id, ALICE, lease=600)
    idle = s.create(ALICE)
    gone = s.create(ALICE)
    moving = s.start_turn(s.create(ALICE).id, ALICE, lease=600)
    kv = f"/v1/scopes/thread/t{n}"
    st = f"/v1/sessions/{own.id}/state"
    then = db.last_change()  # the restores put the scopes back to here (SPEC §17)
    return {
        ("PUT", "/v1/scopes/{kind}/{id}/keys/{key}"): (f"{kv}/keys/k", {"value": 1}),
        ("DELETE", "/v1/scopes/{kind}/{id}/keys/{key}"): (f"{kv}/keys/list", None),
        ("POST", "/v1/scopes/{kind}/{id}/keys/{key}/append"): (f"{kv}/keys/list/append", {"items": [4]}),
        ("POST", "/v1/scopes/{kind}/{id}/keys/{key}/pop"): (f"{kv}/keys/list/pop", {"n": 1}),
        ("POST", "/v1/scopes/{kind}/{id}/keys/{key}/touch"): (f"{kv}/keys/list/touch", {"ttl": 60}),
        ("POST", "/v1/scopes/{kind}/{id}/clear"): (f"{kv}/clear", None),
        ("PUT", "/v1/sessions/{session_id}/state/keys/{key}"): (f"{st}/keys/k", {"value": 1}),
        ("DELETE", "/v1/sessions/{session_id}/state/keys/{key}"): (f"{st}/keys/list", None),
        ("POST", "/v1/sessions/{session_id}/state/keys/{key}/append"): (f"{st}/keys/list/append",
                                                                         {"items": [3]}),
        ("POST", "/v1/sessions/{session_id}/state/keys/{key}/pop"): (f"{st}/keys/list/pop", {"n": 1}),
        ("POST", "/v1/sessions/{session_id}/state/keys/{key}/touch"): (f"{st}/keys/list/touch",
                                                                        {"ttl": 60}),
        ("POST", "/v1/sessions/{session_id}/state/clear"): (f"{st}/clear", None),
        ("POST", "/v1/scopes/{kind}/{id}/restore"): (f"{kv}/restore", {"at": then}),
        ("POST", "/v1/sessions/{session_id}/state/restore"): (f"{st}/restore",
                                                             {"at": then, "keys": ["list"]}),
        ("POST", "/v1/sessions/{session_id}/fork"): (f"/v1/sessions/{own.id}/fork", {"at": then}),
        ("POST", "/v1/batch"): ("/v1/batch", {"ops": [{"op": "put", "scope": f"thread:t{n}",
                                                       "key": "b", "value": 1}]}),
        ("POST", "/v1/runs/prune"): ("/v1/runs/prune", {"older_than": 0, "finished_only": True}),
        ("POST", "/v1/runs/{run_id}/write"): (f"/v1/runs/{run}/write",
                                              {"entries": [{"seq": 2, "type": "note"}],
                                               "snapshot": None}),
        ("POST", "/v1/runs/{run_id}/fork"): (f"/v1/runs/{run}/fork", {"new_id": f"{run}-fork"}),
        ("POST", "/v1/runs/{run_id}/trim"): (f"/v1/runs/{run}/trim", {"before": 1}),
        ("POST", "/v1/runs/{run_id}/pin"): (f"/v1/runs/{run}/pin", {"pinned": True}),
        ("POST", "/v1/runs/{run_id}/calls/{call_id}/claim"): (f"/v1/runs/{run}/calls/c2/claim", {}),
        ("POST", "/v1/runs/{run_id}/calls/{call_id}/settle"): (f"/v1/runs/{run}/calls/c1/settle",
                                                               {"result": 1}),
        ("DELETE", "/v1/runs/{run_id}"): (f"/v1/runs/{run}", None),  # after the run's others
        ("POST", "/v1/sessions"): ("/v1/sessions", {}),
        ("POST", "/v1/sessions/prune"): ("/v1/sessions/prune", {"idle_for": 1e6}),
        ("DELETE", "/v1/sessions/{session_id}"): (f"/v1/sessions/{gone.id}", None),
        ("POST", "/v1/sessions/{session_id}/turns"): (f"/v1/sessions/{idle.id}/turns", {}),
        ("POST", "/v1/sessions/{session_id}/release"): (f"/v1/sessions/{busy.id}/release", None),
        ("POST", "/v1/turns/{turn_id}/{action}"): (f"/v1/turns/{moving.id}/heartbeat", {}),
        ("PUT", "/v1/settings/{name}"): ("/v1/settings/feed_retention", {"value": 86400}),
    }


def test_every_write_route_is_fenced(any_db):
    """X-Agentstate-Fence with a lapsed turn refuses every write route (409 lease_lost,
    nothing written), runs' delete, trim and fork, a session's delete and the turn routes
    included (SPEC §16); unfenced, the same request succeeds. The table covers every route
    that writes, so a new one must be added here."""
    import time

    from agentstate.server._routes import ROUTES

    db = any_db
    app = create_app(db)
    admin = db.tokens.create("ops", admin=True)
    lapsed = db.sessions.start_turn(db.sessions.create(ALICE).id, ALICE, lease=0.05)
    time.sleep(0.1)
    requests = _write_requests(db, 0)
    writes = {(r.method, r.path) for r in ROUTES if r.method != "GET"
              and not r.path.endswith("/get_many")}
    assert set(requests) == writes
    fenced, plain = _client(app, admin, lapsed.id), _client(app, admin, "")
    del plain.headers["x-agentstate-fence"]
    for (method, _route), (path, body) in requests.items():
        before = digest(db)
        r = fenced.request(method, path, json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "lease_lost"), (path, r.text)
        assert digest(db) == before, path
        ok = plain.request(method, path, json=body)
        assert ok.status_code < 300, (path, ok.text)


def test_a_settle_body_says_one_outcome(any_db):
    """settle with {"error": null}, or with both result and error: 400 invalid_value, nothing
    recorded (it answered 200 and recorded a result of null)."""
    db = any_db
    app = create_app(db)
    c = _client(app, db.tokens.create("ops", admin=True), "")
    del c.headers["x-agentstate-fence"]
    db.runs.write("r", [], None, create=True)
    db.runs.claim("r", "c1")
    before = digest(db)
    for body in ({"error": None}, {"result": 1, "error": "x"}, {"result": None, "error": None},
                 {}, {"result": 1, "retry": -1}, {"result": 1, "retry": "0"}):
        r = c.post("/v1/runs/r/calls/c1/settle", json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_value"), body
    assert digest(db) == before
    assert c.post("/v1/runs/r/calls/c1/settle", json={"result": None, "retry": 0}).status_code == 200
    assert db.runs.claim("r", "c1").status == "done"
