"""Grants (SPEC §15): rules, tokens that keep them and expire, every route checking them in
one place, the batch all or none, the feed and the lists showing only what a token may
read, the pages, the remote client's Forbidden; and a reference model of §15 the server's
answers are checked against (hypothesis)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate import _grants
from agentstate.cli import cli
from agentstate.server import create_app
from agentstate.server._access import GRANTS
from agentstate.server._api import Route_
from agentstate.server._routes import ROUTES

from .conftest import RawSQL, digest
from .test_server import _Sync
from .test_server_feed import events, running, sign_in

KINDS = ("thread", "session", "agent", "user", "app")
ENTRY = {"seq": 0, "type": "message", "content": "hi"}


def model_allows(rules: list[str] | None, kind: str, id: str, write: bool) -> bool:
    """SPEC §15 as written, for the tests (not agentstate's code): a rule KIND:ID[=r|rw]
    covers the scope (kind ``runs``: the run) KIND:X when ID is X, or ends in * and X starts
    with what precedes it; r reads, rw (the default) reads and writes. No rules: anything."""
    if rules is None:
        return True
    for text in rules:
        k, _, rest = text.partition(":")
        ident, _, mode = rest.partition("=")  # ids never hold "=" (the key rules)
        if k == kind and (mode in ("", "rw") or not write) and (
                ident == id or (ident.endswith("*") and id.startswith(ident[:-1]))):
            return True
    return False


def client(app, token, **headers):
    return httpx.Client(transport=_Sync(app), base_url="http://t",
                        headers={"authorization": f"Bearer {token}", **headers})


def code(r) -> str | None:
    return r.json()["error"]["code"] if r.status_code >= 400 else None


# -- the rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text, kind, id, prefix, write", [
    ("thread:t-1", "thread", "t-1", False, True), ("user:u-7=r", "user", "u-7", False, False),
    ("agent:*", "agent", "", True, True), ("runs:team-a-*", "runs", "team-a-", True, True),
    ("session:a:b=rw", "session", "a:b", False, True), ("app:x.y_z*=r", "app", "x.y_z", True, False)])
def test_rules_parse_as_spec_15_writes_them(text, kind, id, prefix, write):
    """KIND:ID[=r|rw]: a scope kind or runs; an id, a prefix ending in *, or *; rw by default."""
    r = _grants.parse_rule(text)
    assert (r.kind, r.id, r.prefix, r.write) == (kind, id, prefix, write)
    assert _grants.parse_rule(str(r)) == r


@pytest.mark.parametrize("text", [
    "thread", "thread:", "threads:t-1", "run:r-1", "thread:t-1=w", "thread:t-1=", "thread:=r",
    "thread:t*1", "thread:**", "thread:t 1", "thread:t-1=r=r", ":t-1", "thread:" + "x" * 201,
    "THREAD:t-1", "thread:t-1=RW"])
def test_a_rule_that_does_not_parse_is_refused_naming_it(text, tmp_path):
    """A bad rule is InvalidValue from db.tokens.create, and the command's one-line error
    (exit 1) from tokens create; no token is made, and no file is created for it."""
    with agentstate.open(str(tmp_path / "a.db")) as db:
        with pytest.raises(agentstate.InvalidValue, match="grant"):
            db.tokens.create("bob", grants=["thread:ok", text])
        assert db.tokens.list() == []
    path = str(tmp_path / "new.db")
    r = CliRunner().invoke(cli, ["--db", path, "tokens", "create", "bob", "--grant", text])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and "invalid_value" in r.output, r.output
    assert not (tmp_path / "new.db").exists()


def test_grants_that_make_no_sense_are_refused(db):
    """An empty list of rules, a string, an admin with grants, a bad expiry: InvalidValue, and
    no token."""
    for kwargs in ({"grants": []}, {"grants": "thread:t-1"}, {"grants": [1]},
                   {"grants": ["thread:t-1"], "admin": True}, {"expires": 0}, {"expires": -1},
                   {"expires": True}, {"expires": "30d"}, {"expires": float("nan")}):
        with pytest.raises(agentstate.InvalidValue):
            db.tokens.create("bob", **kwargs)
    assert db.tokens.list() == []


def test_tokens_keep_their_grants_and_expiry_on_both_backends(any_db):
    """The rules (in their canonical text) and the end are kept with the token's hash; list()
    shows every token with an id that tells two of one name apart, never the token."""
    db = any_db
    t1 = db.tokens.create("bob", grants=["thread:t-1", "runs:team-a-*=r", "thread:t-1"])
    t2 = db.tokens.create("bob", expires=3600)
    rows = db.tokens.list()
    assert [r["name"] for r in rows] == ["bob", "bob"] and len({r["id"] for r in rows}) == 2
    by_grants = {json.dumps(r["grants"]): r for r in rows}
    first = by_grants[json.dumps(["thread:t-1=rw", "runs:team-a-*=r"])]
    assert first["expires_at"] is None and first["admin"] is False
    second = by_grants["null"]
    ends = agentstate.backends.leases.parse_iso(second["expires_at"])
    assert 3500 < ends - time.time() < 3700
    assert all(t not in json.dumps(rows) for t in (t1, t2))
    assert db.tokens.principal(t1) == agentstate.Principal("bob")
    # revoke one by its id: the other stands
    assert db.tokens.revoke("bob", id=first["id"]) == 1
    assert db.tokens.principal(t1) is None and db.tokens.principal(t2) is not None
    assert db.tokens.revoke("bob") == 1 and db.tokens.list() == []


def test_an_expired_token_is_unknown(any_db):
    """Past its expiry the store no longer finds a token (principal() is None), as if unknown."""
    db = any_db
    t = db.tokens.create("bob", expires=0.5)
    made = time.time()
    while time.time() < made + 0.6:
        time.sleep(0.05)
    assert db.tokens.principal(t) is None
    assert db.tokens.list()[0]["expires_at"] is not None  # listed still, with its end


def test_tokens_list_and_create_on_the_command(tmp_path):
    """tokens create --grant ... --expires DUR prints the token once; tokens list shows id,
    principal, admin flag, grants, creation and expiry, never a token."""
    path, run = str(tmp_path / "a.db"), CliRunner().invoke
    assert run(cli, ["--db", path, "init"]).exit_code == 0
    r = run(cli, ["--db", path, "tokens", "create", "bob", "--grant", "thread:t-1",
                  "--grant", "runs:team-a-*=r", "--expires", "30d"])
    assert r.exit_code == 0, r.output
    token = r.output.strip()
    r = run(cli, ["--db", path, "tokens", "create", "ops", "--admin", "--grant", "thread:x"])
    assert r.exit_code == 1 and "admin" in r.output
    run(cli, ["--db", path, "tokens", "create", "ops", "--admin"])
    out = run(cli, ["--db", path, "tokens", "list"]).output
    assert token not in out
    header, bob, ops = out.splitlines()
    assert header.split() == ["ID", "NAME", "ADMIN", "GRANTS", "CREATED", "EXPIRES"]
    assert bob.split()[1:5] == ["bob", "no", "thread:t-1=rw", "runs:team-a-*=r"]
    assert ops.split()[1:4] == ["ops", "yes", "(all)"] and ops.split()[-1] == "never"
    rows = json.loads(run(cli, ["--db", path, "--json", "tokens", "list"]).output)
    assert rows[0]["grants"] == ["thread:t-1=rw", "runs:team-a-*=r"]
    r = run(cli, ["--db", path, "tokens", "revoke", "bob", "--id", rows[0]["id"]])
    assert r.exit_code == 0 and "revoked 1" in r.output


# -- the route table: one check, before every handler --------------------------------------------


def test_every_route_states_the_grant_it_needs():
    """Each entry of the route table says what a token with grants needs (the check in
    API.endpoint reads it); a route without one would be refused to everyone."""
    missing = [f"{r.method} {r.path}" for r in ROUTES if r.grant not in GRANTS]
    assert missing == []
    # an admin route says so twice (only admins reach it: no grant to check); a route that
    # needs nothing of a token with grants names no scope, run, session or turn
    assert all((r.grant == "admin") == (r.auth == "admin") for r in ROUTES)
    assert all(not any(f"{{{p}}}" in r.path for p in ("kind", "id", "run_id", "session_id",
                                                       "turn_id"))
               for r in ROUTES if r.grant == "none")
    for r in ROUTES:  # a path that names a scope or a run says which, and reads or writes
        if "{kind}" in r.path:
            assert r.grant[0] == "scope", r.path
        elif "{run_id}" in r.path:
            assert r.grant[0] == "run", r.path
        if isinstance(r.grant, tuple):
            writes = r.method != "GET" and not r.path.endswith("/get_many")
            assert r.grant[1] == ("rw" if writes else "r") or r.path.endswith("/fork"), r.path


def test_a_route_without_a_grant_is_refused_to_every_caller(db):
    """Fails closed: an entry added without a grant answers 403 even to an admin, and its
    handler never runs."""
    from starlette.responses import Response
    from starlette.routing import Route

    ran = []

    async def handler(api, c):
        ran.append(1)
        return Response("ok")

    app = create_app(db)
    route = Route_("GET", "/v1/new", handler, "A new route")
    app.router.routes.insert(0, Route(route.path, app.state.api.endpoint(route), methods=["GET"]))
    r = client(app, db.tokens.create("ops", admin=True)).get("/v1/new")
    assert (r.status_code, code(r)) == (403, "forbidden") and ran == []


# -- every route family, a token with grants and a read-only one --------------------------------


@pytest.fixture
def store(db):
    """A store with data inside and outside the test tokens' grants, and the app over it."""
    admin = db.tokens.create("ops", admin=True)
    tok = {"admin": admin,
           "rw": db.tokens.create("bob", grants=["thread:t-1", "runs:team-a-*"]),
           "ro": db.tokens.create("carol", grants=["thread:t-1=r", "runs:team-a-*=r"])}
    for sid in ("t-1", "t-10", "t-2"):
        db.scope("thread", sid).put("k", [1, 2])
    db.scope("user", "t-1").put("k", 1)
    for run_id in ("team-a-1", "team-a", "team-b-1", "team-a-1x"):
        db.runs.write(run_id, [ENTRY], {"task": run_id}, create=True)
    return db, tok, create_app(db)


def _bodies(run_id: str, n: int) -> dict[str, object]:
    return {"put_key": {"value": 1}, "append": {"items": [1]}, "pop": {"n": 1}, "touch": {"ttl": 60},
            "get_many": {"keys": ["k"]}, "clear": {}, "delete_key": None,
            "run_write": {"entries": [{**ENTRY, "seq": 1}], "snapshot": {"task": "x"}},
            "run_fork": {"new_id": f"{run_id}-fork{n}"}, "run_trim": {"before": 0},
            "run_pin": {"pinned": True}, "call_claim": {"call": {"name": "f"}},
            "call_settle": {"result": 1}}


def _request(c, route, params, n):
    path = route.path
    for name, value in params.items():
        path = path.replace("{" + name + "}", value)
    body = _bodies(params.get("run_id", ""), n).get(route.handler.__name__)
    if route.method == "GET":
        return c.get(path)
    if route.method == "DELETE":
        return c.delete(path)
    return c.request(route.method, path, json=body if body is not None else {})


SCOPE_OUT = [("thread", "t-2"), ("thread", "t-10"), ("user", "t-1"), ("thread", "t-")]
RUN_OUT = ["team-b-1", "team-a", "team-", "team-b-1-team-a-1"]


def test_every_scope_and_run_route_refuses_what_no_rule_covers(store):
    """Each route that names a scope or a run, with ids just outside the grants (another id
    with the granted one as its prefix, the same id of another kind, the prefix without its
    last character): 403 forbidden for the token with grants and the read-only one, and the
    store unchanged."""
    db, tok, app = store
    routes = [r for r in ROUTES if isinstance(r.grant, tuple)]
    assert len(routes) >= 25  # 13 of a scope, 12 of a run
    before = digest(db)
    n = 0
    for who in ("rw", "ro"):
        c = client(app, tok[who])
        for route in routes:
            outs = ([{"kind": k, "id": i, "key": "k"} for k, i in SCOPE_OUT]
                    if route.grant[0] == "scope" else
                    [{"run_id": i, "call_id": "c-1"} for i in RUN_OUT])
            for params in outs:
                n += 1
                r = _request(c, route, params, n)
                assert (r.status_code, code(r)) == (403, "forbidden"), (who, route.path, params, r.text)
                what = (f"{params['kind']}:{params['id']}" if "kind" in params
                        else f"the run {params['run_id']}")
                assert what in r.json()["error"]["message"]
    assert digest(db) == before


def test_a_read_only_token_reads_and_a_granted_one_writes_what_its_rules_cover(store):
    """Inside the grants: the read-only token's reads pass and its writes are 403; the other
    token's reads and writes both pass (and a fork needs rw on its new id as well)."""
    db, tok, app = store
    routes = [r for r in ROUTES if isinstance(r.grant, tuple)]
    ro, rw = client(app, tok["ro"]), client(app, tok["rw"])
    n = 0
    for route in routes:
        params = ({"kind": "thread", "id": "t-1", "key": "k"} if route.grant[0] == "scope"
                  else {"run_id": "team-a-1", "call_id": f"c-{n}"})
        writes = route.method != "GET" and not route.path.endswith("/get_many")  # (a fork
        # writes its new run)
        n += 1
        r = _request(ro, route, params, n)
        if writes:
            assert (r.status_code, code(r)) == (403, "forbidden"), (route.path, r.text)
        else:
            assert r.status_code != 403, (route.path, r.text)
        n += 1
        r = _request(rw, route, params, n)
        assert r.status_code != 403, (route.path, r.text)
    # a fork: r on the run forked, rw on the new one
    assert code(ro.post("/v1/runs/team-a-1/fork", json={"new_id": "team-a-copy"})) == "forbidden"
    assert code(rw.post("/v1/runs/team-a-1/fork", json={"new_id": "team-b-copy"})) == "forbidden"
    assert code(rw.post("/v1/runs/team-b-1/fork", json={"new_id": "team-a-copy"})) == "forbidden"
    assert rw.post("/v1/runs/team-a-1x/fork", json={"new_id": "team-a-copy"}).status_code == 200
    assert db.runs.head("team-a-copy") is not None and db.runs.head("team-b-copy") is None


def test_tokens_without_grants_and_admins_are_not_limited(store):
    """A token without grants uses every scope and run as in §12; an admin too."""
    db, tok, app = store
    plain = db.tokens.create("dave")
    for token in (plain, tok["admin"]):
        c = client(app, token)
        assert c.put("/v1/scopes/thread/t-2/keys/x", json={"value": 1}).status_code == 200
        assert c.get("/v1/runs/team-b-1/head").status_code == 200
        assert {r["id"] for r in c.get("/v1/runs").json()["runs"]} >= {"team-a-1", "team-b-1"}


def test_sessions_keep_the_owner_rule_whatever_the_grants(store):
    """A token with grants uses its own sessions and their state without any grant; no grant
    (session:*, even) opens another's session: as absent as an unknown one (404)."""
    db, tok, app = store
    wide = db.tokens.create("bob", grants=["session:*", "thread:t-1"])
    alice = db.sessions.create(agentstate.Principal("alice"))
    bob = client(app, tok["rw"])
    mine = bob.post("/v1/sessions", json={}).json()["id"]
    for path in (f"/v1/scopes/session/{mine}/keys/k", f"/v1/sessions/{mine}/state/keys/k"):
        assert bob.put(path, json={"value": 1}).status_code == 200
    assert bob.post(f"/v1/sessions/{mine}/turns", json={}).status_code == 201
    for c in (bob, client(app, wide)):
        for path in (f"/v1/scopes/session/{alice.id}/keys/k", f"/v1/sessions/{alice.id}/state/keys/k",
                     f"/v1/sessions/{alice.id}"):
            assert code(c.get(path)) == "not_found", path
        r = c.post("/v1/batch", json={"ops": [{"op": "put", "scope": f"session:{alice.id}",
                                               "key": "k", "value": 1}]})
        assert code(r) == "not_found"
    # a plain scope of kind session (not a session's id) is a scope: a rule must cover it
    assert code(bob.put("/v1/scopes/session/plain/keys/k", json={"value": 1})) == "forbidden"
    assert client(app, wide).put("/v1/scopes/session/plain/keys/k", json={"value": 1}).status_code == 200


def test_a_batch_with_one_uncovered_op_writes_nothing(store):
    """/v1/batch checks every op's scope before it applies any: one op outside the grants (or
    outside the read-only token's rw) and the answer is 403, naming it, with nothing written."""
    db, tok, app = store
    ops = [{"op": "put", "scope": "thread:t-1", "key": "a", "value": 1},
           {"op": "append", "scope": "thread:t-1", "key": "k", "items": [3]},
           {"op": "delete", "scope": "thread:t-10", "key": "k"}]
    before = digest(db)
    r = client(app, tok["rw"]).post("/v1/batch", json={"ops": ops})
    assert code(r) == "forbidden" and "thread:t-10" in r.json()["error"]["message"]
    r = client(app, tok["ro"]).post("/v1/batch", json={"ops": ops[:2]})
    assert code(r) == "forbidden"
    assert digest(db) == before
    r = client(app, tok["rw"]).post("/v1/batch", json={"ops": ops[:2]})
    assert r.status_code == 200 and db.scope("thread", "t-1").get("a") == 1


def test_a_batch_check_needs_only_read_access(store):
    """A check writes nothing: a read grant on its scope lets it in, where a write needs rw;
    a check of a scope the token may not read is 403, with nothing written."""
    db, tok, app = store
    check = {"op": "check", "scope": "thread:t-1", "key": "k", "if_version": 1}
    ro, rw = client(app, tok["ro"]), client(app, tok["rw"])
    r = ro.post("/v1/batch", json={"ops": [check]})
    assert r.status_code == 200 and r.json() == {"results": [{"version": 1}]}
    r = ro.post("/v1/batch", json={"ops": [{**check, "if_version": 2}]})
    assert code(r) == "version_conflict" and r.json()["error"]["current_version"] == 1
    before = digest(db)
    r = rw.post("/v1/batch", json={"ops": [{**check, "scope": "thread:t-2"},
                                          {"op": "put", "scope": "thread:t-1", "key": "b", "value": 1}]})
    assert code(r) == "forbidden" and "thread:t-2" in r.json()["error"]["message"]
    assert digest(db) == before
    r = rw.post("/v1/batch", json={"ops": [check, {"op": "put", "scope": "thread:t-1", "key": "b",
                                                   "value": 1}]})
    assert r.json() == {"results": [{"version": 1}, {"version": 1}]}


def test_a_list_of_runs_shows_only_what_the_token_may_read(store):
    """GET /v1/runs: the runs a runs rule covers, paged (a full page when more follow); after=
    a run it may not read is 403 (not a hint that it exists); no runs rule: no runs."""
    db, tok, app = store
    for i in range(5):
        db.runs.write(f"team-a-{i + 2}", [ENTRY], {"task": "t"}, create=True)
        db.runs.write(f"team-b-{i + 2}", [ENTRY], {"task": "t"}, create=True)
    c = client(app, tok["ro"])
    seen, after = [], None
    while True:
        page = c.get("/v1/runs", params={"limit": 2, **({"after": after} if after else {})}).json()
        seen += [r["id"] for r in page["runs"]]
        assert len(page["runs"]) == 2 or page["next"] is None
        after = page["next"]
        if after is None:
            break
    assert sorted(seen) == sorted(["team-a-1", "team-a-1x"] + [f"team-a-{i + 2}" for i in range(5)])
    assert code(c.get("/v1/runs", params={"after": "team-b-1"})) == "forbidden"
    only_threads = db.tokens.create("eve", grants=["thread:*"])
    assert client(app, only_threads).get("/v1/runs").json()["runs"] == []


# -- the feed -------------------------------------------------------------------------------------


@pytest.fixture
def feed(any_db):
    db = any_db
    tok = {"admin": db.tokens.create("ops", admin=True),
           "bob": db.tokens.create("bob", grants=["thread:t-1", "runs:team-a-*=r", "agent:*"])}
    return db, tok, create_app(db)


def _write_everywhere(db):
    """One change in and out of bob's grants of each kind: kv, runs, sessions (his, alice's)."""
    bob, alice = agentstate.Principal("bob"), agentstate.Principal("alice")
    db.scope("thread", "t-2").put("k", 1)
    db.scope("thread", "t-1").put("k", 1)
    db.scope("agent", "any").put("k", 1)
    db.scope("user", "t-1").put("k", 1)
    db.runs.write("team-b-1", [ENTRY], None, create=True)
    db.runs.write("team-a-1", [ENTRY], None, create=True)
    mine, theirs = db.sessions.create(bob), db.sessions.create(alice)
    db.sessions.state(mine.id, bob).put("k", 1)
    db.sessions.state(theirs.id, alice).put("k", 1)
    db.scope("session", "plain").put("k", 1)
    return mine, theirs


def _expected(db, mine):
    out = []
    for ch in db.changes(0, limit=1000):
        if ch.topic == "run":
            ok = ch.scope_id.startswith("team-a-")
        elif ch.topic == "session" or ch.kind == "session":
            ok = ch.scope_id == mine.id
        else:
            ok = model_allows(["thread:t-1", "agent:*"], ch.kind, ch.scope_id, False)
        if ok:
            out.append(ch.seq)
    return out


def test_the_feed_shows_a_granted_token_only_what_it_may_read(feed):
    """Long poll and stream: the changes of its rules' scopes and runs and of its own
    sessions, none of another's session or of scopes and runs no rule covers; the cursor
    moves past the others (last is the head)."""
    db, tok, app = feed
    mine, _ = _write_everywhere(db)
    want = _expected(db, mine)
    assert 0 < len(want) < db.last_change()
    c = client(app, tok["bob"])
    d = c.get("/v1/changes", params={"since": 0}).json()
    assert [ch["seq"] for ch in d["changes"]] == want and d["last"] == db.last_change()
    # paged: each page's last is where the next starts, and nothing is lost or repeated
    got, since = [], 0
    while since < db.last_change():
        d = c.get("/v1/changes", params={"since": since, "limit": 2}).json()
        got += [ch["seq"] for ch in d["changes"]]
        assert d["last"] > since
        since = d["last"]
    assert got == want
    # the stream, from a real server (it never ends by itself)
    with running(app) as url, httpx.stream("GET", url + "/v1/changes/stream?since=0", timeout=30,
                                           headers={"authorization": f"Bearer {tok['bob']}"}) as s:
        seen, last_id = [], 0
        for ev in events(s.iter_lines()):
            last_id = int(ev.get("id", last_id))
            if "data" in ev:
                seen.append(json.loads(ev["data"])["seq"])
            if last_id >= db.last_change():
                break
    assert seen == want


def test_a_long_poll_wakes_only_for_what_the_token_may_read(feed):
    """A granted token's long poll goes on waiting through changes it may not see and answers
    the first one it may, with the cursor past both."""
    db, tok, app = feed
    head = db.last_change()
    with running(app) as url:
        answer = {}

        def poll():
            answer["d"] = httpx.get(url + "/v1/changes", params={"since": head, "wait": 60},
                                    headers={"authorization": f"Bearer {tok['bob']}"}, timeout=90).json()

        t = threading.Thread(target=poll)
        t.start()
        for i in range(20):
            db.scope("thread", "t-2").put("k", i)  # not bob's
        db.scope("thread", "t-1").put("k", "yes")
        t.join(90)
    d = answer["d"]
    assert [(ch["scope_id"], ch["version"]) for ch in d["changes"]] == [("t-1", 1)]
    assert d["last"] == db.last_change()


def test_a_granted_token_s_feed_is_filtered_by_the_store_s_query(feed, monkeypatch):
    """The changes a token may not see are left out in SQL: no Python object is made for any
    of 3,000 of them, and the answer moves the cursor to the head at once."""
    db, tok, app = feed
    with db.batch() as b:
        for i in range(1000):
            b.scope("thread", "t-2").put(f"k{i}", i)
    for _ in range(2):
        with db.batch() as b:
            for i in range(1000):
                b.scope("user", "u").put(f"k{i}", i)
    made = []
    real = agentstate._changes.change
    monkeypatch.setattr(agentstate._changes, "change", lambda row: made.append(1) or real(row))
    d = client(app, tok["bob"]).get("/v1/changes", params={"since": 0, "limit": 100}).json()
    assert d == {"changes": [], "last": db.last_change()} and made == []


def test_a_granted_token_s_read_of_the_feed_scans_a_window_at_a_time(feed, monkeypatch):
    """A read scans at most WINDOW seqs (no snapshot held over a huge feed): the cursor stops
    there, and a long poll goes on through the windows to what it may see."""
    from agentstate.server import _feedread

    monkeypatch.setattr(_feedread, "WINDOW", 50)
    db, tok, app = feed
    with db.batch() as b:
        for i in range(120):
            b.scope("thread", "t-2").put(f"k{i}", i)
    db.scope("thread", "t-1").put("k", 1)
    c = client(app, tok["bob"])
    assert c.get("/v1/changes", params={"since": 0}).json() == {"changes": [], "last": 50}
    d = c.get("/v1/changes", params={"since": 0, "wait": 30}).json()
    assert [ch["scope_id"] for ch in d["changes"]] == ["t-1"] and d["last"] == db.last_change()


# -- expiry ---------------------------------------------------------------------------------------


def _expire_now(db, token):
    """Move a token's end into the past, as the store's clock tells it."""
    from agentstate.backends.local import digest as token_hash

    with RawSQL(db) as sql:
        past = "now() - interval '1 second'" if sql.pg else str(time.time() - 1)
        sql.execute(f"UPDATE token SET expires_at = {past} WHERE hash = ?", (token_hash(token),))


def test_an_expired_token_is_401_like_an_unknown_one(feed):
    """Past its expiry a token is 401 unauthorized on every route that needs one (within the
    server's 1 s cache), its message the unknown token's."""
    db, tok, app = feed
    short = db.tokens.create("bob", expires=3600)
    c = client(app, short)
    assert c.get("/v1/whoami").status_code == 200
    _expire_now(db, short)
    deadline = time.monotonic() + 10
    while (r := c.get("/v1/whoami")).status_code == 200:
        assert time.monotonic() < deadline, "the expired token still works"
        time.sleep(0.05)
    assert (r.status_code, code(r)) == (401, "unauthorized")
    unknown = client(app, "x" * 43).get("/v1/whoami")
    assert r.json() == unknown.json()
    # and a token made to expire in 1 s: works before, 401 after
    brief = db.tokens.create("bob", expires=1.0)
    made = time.monotonic()
    r = client(app, brief).get("/v1/whoami")
    if time.monotonic() - made < 0.9:  # (a loaded machine may have let it lapse already)
        assert r.status_code == 200
    while time.monotonic() < made + 1.1:
        time.sleep(0.05)
    assert client(app, brief).get("/v1/whoami").status_code == 401


def test_an_expired_token_s_open_stream_ends(feed):
    """A stream whose token expires while it is open ends with an unauthorized event."""
    db, tok, app = feed
    t = db.tokens.create("bob", grants=["thread:*"], expires=3600)
    with running(app) as url, httpx.stream("GET", url + "/v1/changes/stream", timeout=30,
                                           headers={"authorization": f"Bearer {t}"}) as s:
        lines = s.iter_lines()
        next(lines)
        _expire_now(db, t)
        ended = time.monotonic()
        last = None
        for ev in events(lines):
            last = ev
    assert time.monotonic() - ended < 10
    assert last["event"] == "error" and json.loads(last["data"])["error"]["code"] == "unauthorized"


# -- the pages and the remote client ------------------------------------------------------------


def test_the_pages_show_a_granted_token_what_the_api_would(store):
    """Signed in with a token with grants, the pages list only its runs, show its scopes and
    runs and refuse (403) the others."""
    db, tok, app = store
    page = sign_in(app, tok["ro"])
    runs = page.get("/ui/runs").text
    assert "team-a-1" in runs and "team-b-1" not in runs
    assert page.get("/ui/runs/team-a-1").status_code == 200
    for path in ("/ui/runs/team-b-1", "/ui/runs/team-b-1/snapshot", "/ui/scopes/thread/t-2",
                 "/ui/scopes/thread/t-2/keys/k", "/ui/runs?after=team-b-1"):
        r = page.get(path)
        assert r.status_code == 403 and "grants" in r.text, path
    assert page.get("/ui/scopes/thread/t-1/keys/k").status_code == 200
    changes = page.get("/ui/changes").text
    assert "t-1" in changes and "t-2" not in changes and "team-b-1" not in changes
    overview = page.get("/ui").text
    assert "team-a-1" in overview and "team-b-1" not in overview


def test_the_remote_client_raises_forbidden_naming_what_was_refused(tmp_path):
    """Through connect(), a write or read outside the grants is Forbidden (a PermissionError)
    whose message names the scope or run; nothing is written."""
    local = agentstate.open(str(tmp_path / "a.db"))
    t = local.tokens.create("bob", grants=["thread:t-1", "runs:team-a-*=r"])
    local.runs.write("team-b-1", [ENTRY], None, create=True)
    app = create_app(local)
    try:
        with running(app) as url:
            remote = agentstate.connect(url, token=t)
            remote.scope("thread", "t-1").put("k", 1)
            with pytest.raises(agentstate.Forbidden, match="write the scope thread:t-2"):
                remote.scope("thread", "t-2").put("k", 1)
            with pytest.raises(PermissionError, match="read the run team-b-1"):
                remote.runs.load("team-b-1")
            with pytest.raises(agentstate.Forbidden, match="write the run team-a-1"):
                remote.runs.write("team-a-1", [ENTRY], None, create=True)
            with pytest.raises(agentstate.Forbidden, match="thread:t-3"), remote.batch() as b:
                b.scope("thread", "t-1").put("z", 1)
                b.scope("thread", "t-3").put("z", 1)
            assert remote.scope("thread", "t-1").get("z") is None
            assert [r.id for r in remote.runs.list()] == []
            remote.close()
    finally:
        local.close()


# -- a reference model of §15 ---------------------------------------------------------------------

IDS = ("a", "ab", "a-1", "b")
rule_texts = st.builds(
    lambda kind, ident, star, mode: f"{kind}:{'*' if ident is None else ident + star}{mode}",
    st.sampled_from((*KINDS, "runs")), st.one_of(st.none(), st.sampled_from(IDS)),
    st.sampled_from(("", "*")), st.sampled_from(("", "=r", "=rw")))
requests = st.tuples(st.sampled_from((*KINDS, "runs")), st.sampled_from(IDS), st.booleans())


@pytest.fixture
def modelled(any_db):
    """A store with a change for each scope and run of the model's ids, and an app."""
    db = any_db
    admin = db.tokens.create("ops", admin=True)
    for kind in KINDS:
        for i in IDS:
            db.scope(kind, i).put("k", 1)
    for i in IDS:
        db.runs.write(i, [ENTRY], {"task": i}, create=True)
    return db, admin, create_app(db)


@settings(max_examples=40)
@given(rules=st.lists(rule_texts, min_size=1, max_size=4),
       asks=st.lists(requests, min_size=1, max_size=6))
def test_the_server_answers_as_the_reference_model_of_spec_15(modelled, rules, asks):
    """Random rule sets and requests: each request is refused (403) exactly when the model
    says no rule covers it; a refused write changes nothing; the token's feed is exactly the
    changes the model lets it read, and its runs list the runs."""
    db, admin, app = modelled
    c = client(app, db.tokens.create("bob", grants=rules))
    for kind, i, write in asks:
        before = digest(db) if write else None
        if kind == "runs":
            r = c.post(f"/v1/runs/{i}/pin", json={"pinned": True}) if write \
                else c.get(f"/v1/runs/{i}/head")
        else:
            path = f"/v1/scopes/{kind}/{i}/keys/k"
            r = c.put(path, json={"value": 1}) if write else c.get(path)
        allowed = model_allows(rules, kind, i, write)
        assert (r.status_code == 403) == (not allowed), (rules, kind, i, write, r.text)
        if not allowed:
            assert code(r) == "forbidden"
            if write:
                assert digest(db) == before
    # the writes asked of scopes, as one batch: all or none
    ops = [{"op": "put", "scope": f"{kind}:{i}", "key": "b", "value": 1}
           for kind, i, write in asks if write and kind != "runs"]
    if ops:
        before = digest(db)
        r = c.post("/v1/batch", json={"ops": ops})
        allowed = all(model_allows(rules, *op["scope"].split(":"), True) for op in ops)
        assert (r.status_code == 403) == (not allowed), (rules, ops, r.text)
        if not allowed:
            assert digest(db) == before
    d = c.get("/v1/changes", params={"since": 0, "limit": 10000}).json()
    want = [ch.seq for ch in db.changes(0, limit=10000)
            if model_allows(rules, "runs" if ch.topic == "run" else ch.kind, ch.scope_id, False)]
    assert [ch["seq"] for ch in d["changes"]] == want and d["last"] == db.last_change()
    listed = {r["id"] for r in c.get("/v1/runs").json()["runs"]}
    assert listed == {i for i in IDS if model_allows(rules, "runs", i, False)}



# -- the schema migration -----------------------------------------------------------------------


def _shape(c) -> list:
    """The columns and indexes of the tables §15 touches, as the catalogue tells them."""
    cols = c.execute("SELECT table_name, column_name, data_type, is_nullable FROM "
                     "information_schema.columns WHERE table_schema = current_schema() AND "
                     "table_name IN ('token', 'signin', 'run') ORDER BY 1, 2").fetchall()
    idx = c.execute("SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = "
                    "current_schema() AND tablename IN ('token', 'signin', 'run') ORDER BY 2"
                    ).fetchall()
    fks = c.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE "
                    "conrelid = to_regclass('signin') ORDER BY 1").fetchall()
    return [cols, [(t, n, d.replace(f"{c.info.parameter_status('search_path')}.", ""))
                   for t, n, d in idx], fks]


def test_a_version_2_postgresql_store_gains_grants_expiry_and_sign_ins(pg_url):
    """The 2->3 step adds the token's grants and expiry columns and the signin table with
    its indexes, as a new store has them; a token made before keeps working, without grants
    and without an end."""
    import psycopg

    from agentstate.backends.local import digest
    from agentstate.backends.postgres.schema import SCHEMA_VERSION

    old = "a-token-of-bob-made-by-version-4"
    with psycopg.connect(pg_url, autocommit=True) as c:  # a version 4 store, made version 2
        c.execute((Path(__file__).parent / "fixtures" / "schema_postgres_v4.sql").read_text())
        c.execute("INSERT INTO token (hash, name, admin, created_at) VALUES (%s, 'bob', false, now())",
                  (digest(old),))
        want = _shape(c)
        c.execute("DROP TABLE run_call; DROP TABLE store; "  # 0.4's (the 3->4 step makes them again)
                  "DROP TABLE signin; ALTER TABLE token DROP COLUMN grants, DROP COLUMN expires_at; "
                  "DROP VIEW runs; DROP INDEX run_entry_call; ALTER TABLE run DROP COLUMN pinned; "
                  "CREATE VIEW runs AS SELECT id FROM run; UPDATE agentstate_version SET version = 2")
        assert _shape(c) != want
    with agentstate.open(pg_url) as db:
        assert db.info()["schema_version"] == SCHEMA_VERSION
        assert db.tokens.principal(old) == agentstate.Principal("bob")
        assert [(r["grants"], r["expires_at"]) for r in db.tokens.list()] == [(None, None)]
        assert db._ops.signin_create(old, 60) is not None
        assert db.check() == []
    with psycopg.connect(pg_url, autocommit=True) as c:
        assert _shape(c) == want


def test_the_dot_ids_of_a_path_are_checked_as_the_handler_reads_them(db):
    """``~.`` and ``~..`` in a path are the ids ``.`` and ``..`` for the grant check as for the
    handler: a rule for ``.`` opens them, a rule for another id does not (no escape past the
    check)."""
    app = create_app(db)
    dot = client(app, db.tokens.create("bob", grants=["thread:.", "runs:.."]))
    other = client(app, db.tokens.create("carol", grants=["thread:t", "runs:t*"]))
    assert dot.put("/v1/scopes/thread/~./keys/~.", json={"value": 1}).status_code == 200
    assert db.scope("thread", ".").get(".") == 1
    assert dot.post("/v1/runs/~../write", json={"entries": [ENTRY], "snapshot": None,
                                                "create": True}).status_code == 200
    assert db.runs.head("..") is not None
    for c, path in ((other, "/v1/scopes/thread/~./keys/~."), (other, "/v1/runs/~../head"),
                    (dot, "/v1/scopes/thread/~../keys/k"), (dot, "/v1/runs/~./head")):
        assert code(c.get(path)) == "forbidden", path
    with pytest.raises(agentstate.InvalidValue):
        db.tokens.create("bob", grants=["thread:~."])


def _many_rules() -> list[str]:
    """1,000 rules (the most a token takes): exact ids, prefixes of 199 lengths (the
    deepest SQL a grouping by length could make), runs, session-kind ones."""
    rules = [f"thread:t-{i}" for i in range(300)]
    rules += ["user:" + "u" * n + "*" for n in range(1, 200)]
    rules += [f"agent:a{i}*=r" for i in range(200)]
    rules += [f"runs:r-{i}" for i in range(200)]
    rules += [f"session:plain-{i}" for i in range(101)]
    assert len(rules) == _grants.MAX_RULES
    return rules


def test_a_token_with_a_thousand_rules_is_answered_on_every_route(any_db):
    """However many rules a token has (up to 1,000), the feed, the long poll, the stream,
    the list of runs and the pages answer it on both backends (SPEC §16; on a file past
    ~990 rules every one of them was 500 "Expression tree is too large"), showing exactly
    what its rules cover."""
    db = any_db
    rules = _many_rules()
    token = db.tokens.create("many", grants=rules)
    writes = [("thread", "t-5"), ("thread", "t-500"), ("user", "uuuu-x"), ("user", "x"),
              ("agent", "a17x"), ("agent", "b"), ("session", "plain-3"), ("session", "plain-x")]
    for kind, sid in writes:
        db.scope(kind, sid).put("k", 1)
    for run_id in ("r-7", "r-700"):
        db.runs.write(run_id, [ENTRY], None, create=True)
    want = [ch.seq for ch in db.changes(0)
            if model_allows(rules, "runs" if ch.topic == "run" else ch.kind, ch.scope_id, False)]
    assert len(want) == 5
    app = create_app(db)
    c = client(app, token)
    d = c.get("/v1/changes", params={"since": 0}).json()
    assert [ch["seq"] for ch in d["changes"]] == want and d["last"] == db.last_change()
    d = c.get("/v1/changes", params={"since": 0, "wait": 1}).json()
    assert [ch["seq"] for ch in d["changes"]] == want
    assert [r["id"] for r in c.get("/v1/runs").json()["runs"]] == ["r-7"]
    page = sign_in(app, token)
    for path in ("/ui", "/ui/changes", "/ui/runs", "/ui/runs/r-7"):
        assert page.get(path).status_code == 200, path
    with running(app) as url, httpx.stream("GET", url + "/v1/changes/stream?since=0", timeout=30,
                                           headers={"authorization": f"Bearer {token}"}) as s:
        seen = []
        for ev in events(s.iter_lines()):
            if "data" in ev:
                seen.append(json.loads(ev["data"])["seq"])
            if int(ev.get("id", 0)) >= db.last_change():
                break
    assert seen == want


def test_an_admin_acting_for_a_principal_is_not_held_to_its_tokens_grants(any_db):
    """Grants belong to a token (SPEC §16): an admin acting for bob (X-Agentstate-Principal)
    is not limited by the grants of bob's own token, while bob's token is."""
    db = any_db
    app = create_app(db)
    admin = db.tokens.create("ops", admin=True)
    bob = db.tokens.create("bob", grants=["thread:t-1"])
    path = "/v1/scopes/user/u-9/keys/k"
    assert code(client(app, bob).put(path, json={"value": 1})) == "forbidden"
    r = client(app, admin, **{"x-agentstate-principal": "bob"}).put(path, json={"value": 2})
    assert r.status_code == 200 and db.scope("user", "u-9").get("k") == 2
    who = client(app, admin, **{"x-agentstate-principal": "bob"}).get("/v1/whoami").json()
    assert who == {"name": "bob", "admin": False, "grants": None}
