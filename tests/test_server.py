"""The State API (SPEC §12): auth, isolation, strict bodies, limits, waits, many client processes."""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import signal
import threading
import time
from urllib.parse import quote

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate.cli import cli
from agentstate.server import create_app

from .conftest import file_digest
from .serverproc import serve
from .strategies import nested


@pytest.fixture
def api(db):
    """(client factory, db, admin token, alice token) against the app in process."""
    admin = db.tokens.create("ops", admin=True)
    alice = db.tokens.create("alice")
    bob = db.tokens.create("bob")
    app = create_app(db)

    def client(token=admin, **headers):
        hs = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(transport=_Sync(app),
                            base_url="http://t", headers={**hs, **headers})

    return client, db, {"admin": admin, "alice": alice, "bob": bob}


class _Sync(httpx.BaseTransport):
    """httpx's ASGITransport is async-only: drive it from a private event loop."""

    def __init__(self, app):
        self.inner = httpx.ASGITransport(app=app)
        self.loop = asyncio.new_event_loop()

    def handle_request(self, request):
        async def go():
            body = b"".join([part async for part in request.stream]) \
                if hasattr(request.stream, "__aiter__") else b"".join(request.stream)
            req = httpx.Request(request.method, request.url, headers=request.headers, content=body)
            r = await self.inner.handle_async_request(req)
            content = b"".join([c async for c in r.stream])
            return httpx.Response(r.status_code, headers=r.headers, content=content)

        return self.loop.run_until_complete(go())


def signin_cookie(r) -> tuple[str, str]:
    """The sign-in cookie a /ui/login answer set: its name (the store's: SPEC §16) and value."""
    (name, value), = [(k, v) for k, v in r.cookies.items() if k.startswith("agentstate_ui_")]
    return name, value


def err(r):
    assert r.headers["content-type"].startswith("application/json"), r.text
    return r.json()["error"]


def test_tokens_are_required_and_only_hashes_are_stored(api, db_path):
    client, db, tok = api
    for headers in ({}, {"authorization": "Bearer nope-nope-nope-nope-nope"}, {"authorization": "Basic x"}):
        r = client(None, **headers).get("/v1/runs")
        assert r.status_code == 401 and err(r)["code"] == "unauthorized"
    assert client(None).get("/v1/health").status_code == 200
    raw = open(db_path, "rb").read() + open(db_path + "-wal", "rb").read()
    assert all(t.encode() not in raw for t in tok.values())  # hashes only


def test_principals_see_only_their_own_sessions(api):
    client, db, tok = api
    alice, bob, admin = client(tok["alice"]), client(tok["bob"]), client(tok["admin"])
    s = alice.post("/v1/sessions", json={"metadata": {"x": 1}}).json()
    assert s["owner"] == "alice"
    for path in (f"/v1/sessions/{s['id']}", f"/v1/sessions/{s['id']}/turns",
                 f"/v1/sessions/{s['id']}/state/keys/k"):
        r = bob.get(path)
        assert r.status_code == 404 and err(r)["code"] == "not_found"  # as for an unknown id
    assert bob.put(f"/v1/sessions/{s['id']}/state/keys/k", json={"value": 1}).status_code == 404
    alice.put(f"/v1/sessions/{s['id']}/state/keys/k", json={"value": "private"})
    for r in (bob.get(f"/v1/scopes/session/{s['id']}/keys/k"),  # nor through the plain scope route
              bob.get(f"/v1/scopes/session/{s['id']}/keys"),
              bob.put(f"/v1/scopes/session/{s['id']}/keys/k", json={"value": 1})):
        assert r.status_code == 404 and err(r)["code"] == "not_found"
    assert alice.get(f"/v1/scopes/session/{s['id']}/keys/k").json()["value"] == "private"
    assert bob.put("/v1/scopes/session/not-a-session/keys/k", json={"value": 1}).status_code == 200
    assert admin.get(f"/v1/sessions/{s['id']}").status_code == 200
    t = alice.post(f"/v1/sessions/{s['id']}/turns", json={"input": "hi"}).json()
    assert bob.post(f"/v1/turns/{t['id']}/finish", json={}).status_code == 404
    r = alice.post(f"/v1/sessions/{s['id']}/turns", json={})
    assert r.status_code == 409 and err(r)["code"] == "session_busy" and err(r)["turn_id"] == t["id"]
    # acting for another principal: admins only
    r = bob.get("/v1/sessions", headers={"x-agentstate-principal": "alice"})
    assert r.status_code == 403 and err(r)["code"] == "forbidden"
    on_behalf = admin.post("/v1/sessions", json={}, headers={"x-agentstate-principal": "carol"}).json()
    assert on_behalf["owner"] == "carol"
    assert [x["id"] for x in admin.get("/v1/sessions", headers={"x-agentstate-principal": "carol"})
            .json()["sessions"]] == [on_behalf["id"]]
    r = alice.post(f"/v1/sessions/{s['id']}/release")
    assert r.status_code == 403
    assert admin.post(f"/v1/sessions/{s['id']}/release").json()["status"] == "failed"


def test_revoked_tokens_stop_working(api):
    client, db, tok = api
    assert client(tok["bob"]).get("/v1/runs").status_code == 200
    assert db.tokens.revoke("bob") == 1
    time.sleep(2.2)  # SPEC §15: a revoked token stops within 2 s (the cache is shorter)
    assert client(tok["bob"]).get("/v1/runs").status_code == 401


BAD_BODIES = [
    (b'{"value": NaN}', "invalid_value"), (b'{"value": 1e999}', "invalid_value"),
    (b'{"value": 18446744073709551616}', "invalid_value"), (b'{"value": "a\\u0000b"}', "invalid_value"),
    (b'{"value": "\\ud800"}', "invalid_value"), (b'{"value": 1, "if_version": false}', "invalid_value"),
    (b'{"value": 1, "if_version": "3"}', "invalid_value"), (b'{"value": 1, "if_version": 1.0}', "invalid_value"),
    (b'{"value": 1, "extra": 1}', "invalid_value"), (b'{"value": 1', "invalid_value"),
    (b"[1]", "invalid_value"), (b"\xff\xfe", "invalid_value"), (b'{"value": 1, "ttl": 0}', "invalid_value"),
    (b'{"value": 1, "ttl": true}', "invalid_value"),
    (json.dumps({"value": nested(513)}).encode(), "invalid_value"),
]


@pytest.mark.parametrize("body, code", BAD_BODIES)
def test_bad_bodies_are_refused_and_change_nothing(api, db_path, body, code):
    client, db, tok = api
    db.scope("app", "a").put("k", 0)
    before = file_digest(db_path)
    r = client().put("/v1/scopes/app/a/keys/k", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and err(r)["code"] == code, r.text
    assert file_digest(db_path) == before


def test_values_at_the_limits_are_accepted(api):
    client, db, _ = api
    c = client()
    assert c.put("/v1/scopes/app/a/keys/deep", json={"value": nested(512)}).status_code == 200
    big = "x" * (1024 * 1024 - 2)
    assert c.put("/v1/scopes/app/a/keys/big", json={"value": big}).json() == {"version": 1}
    r = c.put("/v1/scopes/app/a/keys/big", json={"value": big + "x"})
    assert r.status_code == 413 and err(r)["code"] == "too_large" and err(r)["limit"] == 1024 * 1024


def test_a_body_over_the_limit_is_refused_before_it_is_read_whole(api):
    client, db, _ = api
    sent = []

    def body():
        for _ in range(64):
            sent.append(1)
            yield b"x" * (1024 * 1024)

    r = client().put("/v1/scopes/app/a/keys/k", content=body(),
                     headers={"content-type": "application/json"})
    assert r.status_code == 413 and err(r)["code"] == "too_large"
    r = client().put("/v1/scopes/app/a/keys/k", content=b"{}",
                     headers={"content-type": "application/json", "content-length": str(10**9)})
    assert r.status_code == 413


def test_routes_answer_the_commands_json_shapes(api):
    client, db, _ = api
    c = client()
    assert c.put("/v1/scopes/session/s-42/keys/settings",
                 json={"value": {"model": "small"}, "if_version": 0}).json() == {"version": 1}
    r = c.put("/v1/scopes/session/s-42/keys/settings", json={"value": 2, "if_version": 0})
    assert r.status_code == 409 and err(r) == {
        "code": "version_conflict", "current_version": 1, "message": err(r)["message"]}
    assert c.get("/v1/scopes/session/s-42/keys/settings").json() == {
        "key": "settings", "value": {"model": "small"}, "version": 1}
    r = c.get("/v1/scopes/session/s-42/keys/nope")
    assert r.status_code == 404 and err(r)["code"] == "not_found"
    assert c.post("/v1/scopes/session/s-42/keys/h/append", json={"items": [1, 2, 3]}).json() == \
        {"length": 3, "version": 1}
    r = c.post("/v1/scopes/session/s-42/keys/settings/append", json={"items": [1]})
    assert r.status_code == 409 and err(r)["code"] == "not_a_list"
    assert c.get("/v1/scopes/session/s-42/keys/h/slice", params={"start": -2}).json() == {"items": [2, 3]}
    assert c.post("/v1/scopes/session/s-42/keys/h/pop", json={"n": 2}).json() == {"items": [2, 3]}
    assert c.get("/v1/scopes/session/s-42/keys/h/length").json() == {"length": 1}
    assert c.get("/v1/scopes/session/s-42/keys", params={"limit": 1}).json() == {"keys": ["h"], "next": "h"}
    assert c.delete("/v1/scopes/session/s-42/keys/h", params={"if_version": 2}).json() == {"deleted": True}
    r = c.put("/v1/scopes/app/a/keys/b", content=b"\xff\x00",
              headers={"content-type": "application/octet-stream"})
    assert r.json() == {"version": 1}
    assert c.get("/v1/scopes/app/a/keys/b", headers={"accept": "application/octet-stream"}).content \
        == b"\xff\x00"
    r = c.post("/v1/batch", json={"ops": [{"op": "put", "scope": "app:a", "key": "x", "value": 1},
                                          {"op": "put", "scope": "app:a", "key": "y", "value": 1,
                                           "if_version": 7}]})
    assert r.status_code == 409 and err(r)["current_version"] == 0
    assert db.scope("app", "a").get("x") is None  # all or none
    r = c.put("/v1/scopes/nope/a/keys/k", json={"value": 1})
    assert r.status_code == 400 and err(r)["code"] == "invalid_key"
    assert c.get("/v1/nowhere").status_code == 404


def _write_later(path, delay, what):
    time.sleep(delay)
    with agentstate.open(path) as db:
        if what == "append":
            db.scope("session", "s-42").append("history", [{"n": 1}])
        else:
            db.runs.write("run-1", [{"seq": 0}], None, create=True)


def test_long_poll_and_stream_wake_on_another_process_write(tmp_path):
    srv = serve(str(tmp_path / "served.db"))
    try:
        h = {"authorization": f"Bearer {srv.token}"}
        head = httpx.get(srv.url + "/v1/changes/head", headers=h).json()["head"]
        ctx = mp.get_context("spawn")
        p = ctx.Process(target=_write_later, args=(srv.db, 1.0, "append"))
        p.start()
        t0 = time.monotonic()
        r = httpx.get(srv.url + "/v1/changes", headers=h, timeout=60,
                      params={"since": head, "wait": 30, "key": "history"})
        waited = time.monotonic() - t0
        p.join(30)
        assert [c["op"] for c in r.json()["changes"]] == ["append"]
        assert 0.5 < waited < 15  # it held the request, then answered soon after the write
        # the stream: a server-sent event for a run written by another process
        p = ctx.Process(target=_write_later, args=(srv.db, 1.0, "run"))
        with httpx.stream("GET", srv.url + "/v1/changes/stream", headers=h, timeout=60,
                          params={"since": r.json()["last"], "topic": "run"}) as s:
            p.start()
            for line in s.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    break
        p.join(30)
        assert event["topic"] == "run" and event["op"] == "create" and event["scope_id"] == "run-1"
        r = httpx.get(srv.url + "/v1/changes", headers=h, params={"since": 0, "wait": "nan"})
        assert r.status_code == 400
    finally:
        srv.stop()


SERVE_ADMIN = agentstate.Principal("admin", admin=True)  # the token serve makes first


def _client_worker(url, token, n, seed, sid):
    import random

    rnd = random.Random(seed)
    db = agentstate.connect(url, token=token)
    kv = db.scope("agent", "shared")
    ops = {"inc": 0, "items": [], "turns": 0, "busy": 0}
    admin = SERVE_ADMIN
    for i in range(n):
        r = rnd.random()
        if r < 0.4:
            kv.update("counter", lambda v: v + 1, default=0)
            ops["inc"] += 1
        elif r < 0.8:
            item = f"{seed}-{i}"
            kv.append("items", [item])
            ops["items"].append(item)
        else:
            try:
                with db.sessions.turn(sid, admin, lease=60):
                    ops["turns"] += 1
            except agentstate.SessionBusy:
                ops["busy"] += 1
    db.close()
    return ops


def test_eight_client_processes_through_the_server(tmp_path):
    """8 processes mix updates, appends and turns through one server: nothing lost or doubled,
    one turn at a time."""
    srv = serve(str(tmp_path / "served.db"))
    try:
        db = agentstate.connect(srv.url, token=srv.token)
        sid = db.sessions.create(SERVE_ADMIN).id
        with mp.get_context("spawn").Pool(8) as pool:
            results = pool.starmap(_client_worker, [(srv.url, srv.token, 60, i, sid) for i in range(8)])
        kv = db.scope("agent", "shared")
        assert kv.get("counter", 0) == sum(r["inc"] for r in results)
        items = kv.slice("items")
        assert sorted(items) == sorted(x for r in results for x in r["items"])  # none lost or doubled
        for seed in range(8):  # each process's items in its own order
            mine = [x for x in items if x.startswith(f"{seed}-")]
            assert mine == sorted(mine, key=lambda x: int(x.split("-")[1]))
        turns = db.sessions.turns(sid, SERVE_ADMIN)
        assert sum(t.status == "finished" for t in turns) == sum(r["turns"] for r in results)
        db.close()
    finally:
        srv.stop()
    with agentstate.open(srv.db) as local:
        assert local.check() == []


def test_command_tokens_and_serve_makes_the_first_admin_token(tmp_path):
    path = str(tmp_path / "t.db")
    run = lambda *a: CliRunner().invoke(cli, ["--db", path, *a])  # noqa: E731
    assert run("init").exit_code == 0
    r = run("--json", "tokens", "create", "alice")
    assert r.exit_code == 0 and json.loads(r.stdout)["name"] == "alice"
    token = json.loads(r.stdout)["token"]
    with agentstate.open(path) as db:
        assert db.tokens.principal(token) == agentstate.Principal("alice")
    assert "alice" in run("tokens", "list").stdout
    assert run("tokens", "create", "bad name").exit_code == 1
    assert run("--json", "tokens", "revoke", "alice").stdout.strip() == '{"revoked": 1}'
    srv = serve(str(tmp_path / "fresh.db"))  # no token yet: serve makes one for 'admin'
    try:
        db = agentstate.connect(srv.url, token=srv.token)
        assert db.sessions.list(agentstate.Principal("admin", admin=True)) == []
        with pytest.raises(agentstate.Unauthorized):
            agentstate.connect(srv.url, token="x" * 43).scope("app", "a").get("k")
        with pytest.raises(agentstate.UsageError):
            with db.transaction():
                pass
    finally:
        srv.stop()


@settings(max_examples=40, deadline=None)
@given(path=st.text(st.characters(min_codepoint=32, max_codepoint=0x10FFFF), max_size=30),
       body=st.binary(max_size=60), method=st.sampled_from(["GET", "PUT", "POST", "DELETE"]))
def test_hostile_requests_never_get_a_server_error(tmp_path_factory, path, body, method):
    """Any path, method and body: a §6 error or an answer, never a 500 or a framework page."""
    path_db = str(tmp_path_factory.mktemp("h") / "h.db")
    with agentstate.open(path_db) as db:
        token = db.tokens.create("ops", admin=True)
        c = httpx.Client(transport=_Sync(create_app(db)), base_url="http://t",
                         headers={"authorization": f"Bearer {token}"})
        # what a client can put on the wire: the path's UTF-8 bytes (lone surrogates too),
        # percent-encoded
        wire = quote(path.encode("utf-8", "surrogatepass"), safe="/:@!$&'()*+,;=")
        for prefix in ("/v1/scopes/app/a/keys/", "/v1/runs/", "/v1/sessions/", "/v1/turns/"):
            url = prefix + wire.lstrip("/")
            r = c.request(method, url, content=body, headers={"content-type": "application/json"})
            assert r.status_code < 500, (url, r.text)
            if r.status_code >= 400:
                assert "code" in err(r)


def test_the_server_runs_store_calls_off_the_event_loop(db, db_path):
    """While a write waits for the lock another connection holds, the server answers health checks."""
    import apsw

    token = db.tokens.create("ops", admin=True)
    app = create_app(db)

    async def main():
        other = apsw.Connection(db_path)
        other.execute("BEGIN IMMEDIATE")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                     headers={"authorization": f"Bearer {token}"}) as c:
            write = asyncio.create_task(c.put("/v1/scopes/app/a/keys/k", json={"value": 1}))
            await asyncio.sleep(0.2)
            t0 = time.monotonic()
            health = await c.get("/v1/health")
            fast = time.monotonic() - t0
            other.execute("COMMIT")
            r = await write
        other.close()
        return health.status_code, fast, r.status_code

    status, fast, written = asyncio.run(main())
    assert status == 200 and written == 200 and fast < 1.0


def test_the_feed_hides_other_principals_sessions(api):
    """A non-admin sees every change but those of others' sessions; an admin sees all."""
    client, db, tok = api
    alice, bob, admin = client(tok["alice"]), client(tok["bob"]), client(tok["admin"])
    mine = bob.post("/v1/sessions", json={}).json()["id"]
    theirs = alice.post("/v1/sessions", json={}).json()["id"]
    alice.put(f"/v1/sessions/{theirs}/state/keys/secret", json={"value": 1})
    bob.put("/v1/scopes/app/shared/keys/k", json={"value": 1})
    seen = bob.get("/v1/changes", params={"since": 0}).json()
    assert {c["scope_id"] for c in seen["changes"]} == {mine, "shared"}
    assert seen["last"] == db.last_change()  # the cursor moves past what was hidden
    assert theirs in {c["scope_id"] for c in admin.get("/v1/changes", params={"since": 0}).json()["changes"]}
    r = bob.get("/v1/changes", params={"since": seen["last"], "wait": 0.2})
    assert r.json() == {"changes": [], "last": seen["last"]}


def test_connection_failures_are_storage_errors_and_say_when_a_write_may_have_happened():
    from .serverproc import free_port

    db = agentstate.connect(f"http://127.0.0.1:{free_port()}", token="t" * 43, timeout=2)
    with pytest.raises(agentstate.StorageError) as read:
        db.scope("app", "a").get("k")
    assert read.value.outcome_unknown is False  # a read changes nothing
    with pytest.raises(agentstate.StorageError) as write:
        db.scope("app", "a").put("k", 1)
    assert write.value.outcome_unknown is True  # it may have reached the server
    db.close()
    with pytest.raises(agentstate.Closed):
        db.scope("app", "a").get("k")


def _open_fds(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/fd"))


def test_streams_that_disconnect_cost_nothing_after(tmp_path):
    """Clients that open the event stream or a long poll and go away leave no connection,
    file or task behind in the server."""
    srv = serve(str(tmp_path / "served.db"))
    try:
        h = {"authorization": f"Bearer {srv.token}"}
        httpx.get(srv.url + "/v1/changes", headers=h, params={"since": 0})  # warm up
        time.sleep(0.5)
        before = _open_fds(srv.proc.pid)
        for _ in range(20):
            with httpx.stream("GET", srv.url + "/v1/changes/stream", headers=h, timeout=10) as s:
                next(s.iter_lines())  # connected and waiting
            try:
                httpx.get(srv.url + "/v1/changes", headers=h, timeout=0.2,
                          params={"since": 0, "wait": 30, "key": "never"})
            except httpx.TimeoutException:
                pass  # a long poll the client gave up on
        with agentstate.open(srv.db) as local:
            local.scope("app", "a").put("k", 1)  # wakes every waiter still there, if any
        deadline = time.monotonic() + 30
        while _open_fds(srv.proc.pid) > before + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _open_fds(srv.proc.pid) <= before + 2
        assert httpx.get(srv.url + "/v1/health").status_code == 200
    finally:
        srv.stop()


def test_ctrl_c_stops_the_server_while_streams_and_long_polls_are_open(tmp_path):
    """uvicorn waits for every open response before it stops, and a change stream never ends:
    Ctrl-C must end them (the API's stream and long poll, the page's stream) first."""
    srv = serve(str(tmp_path / "served.db"))
    h = {"authorization": f"Bearer {srv.token}"}
    polls: list = []

    def long_poll() -> None:
        try:
            polls.append(httpx.get(srv.url + "/v1/changes", headers=h, timeout=60,
                                   params={"since": 0, "wait": 60, "key": "never"}))
        except httpx.HTTPError as e:  # shown by the assertion below
            polls.append(e)

    try:
        page = httpx.Client(base_url=srv.url)
        r = page.post("/ui/login", data={"token": srv.token, "next": "/ui"})
        page.cookies.set(*signin_cookie(r), path="/ui")
        poll = threading.Thread(target=long_poll)
        poll.start()  # first: it has the streams' two round trips and a second to arrive
        with httpx.stream("GET", srv.url + "/v1/changes/stream", headers=h, timeout=60) as api_s, \
                page.stream("GET", "/ui/stream", timeout=60) as ui_s:
            api_lines, ui_lines = api_s.iter_lines(), ui_s.iter_lines()
            next(api_lines), next(ui_lines)  # both connected and waiting
            time.sleep(1.0)  # the long poll is waiting too
            assert polls == []
            t0 = time.monotonic()
            srv.proc.send_signal(signal.SIGINT)
            assert srv.proc.wait(15) == 0  # was: still running after 20 s, until the streams ended
            stopped = time.monotonic() - t0
            poll.join(15)
            assert [x for x in [*api_lines, *ui_lines] if x] == []  # both ended, nothing more
        assert stopped < 8
        assert isinstance(polls[0], httpx.Response), polls
        assert polls[0].status_code == 200 and polls[0].json()["changes"] == []
    finally:
        srv.stop()


def test_a_long_poll_ends_when_its_client_leaves(db):
    """A client that gives up on a long poll (wait=30) leaves no request behind in the server:
    the handler sees the disconnect and returns, it does not wait out the 30 s."""
    token = db.tokens.create("ops", admin=True)
    app = create_app(db)

    async def main() -> float:
        left = asyncio.Event()
        first = [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive():
            if first:
                return first.pop()
            await left.wait()
            return {"type": "http.disconnect"}

        async def send(message):
            pass

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": "/v1/changes", "raw_path": b"/v1/changes",
                 "root_path": "", "query_string": b"since=0&wait=30&key=never",
                 "headers": [(b"host", b"t"), (b"authorization", f"Bearer {token}".encode())],
                 "client": ("127.0.0.1", 1), "server": ("t", 80)}
        handler = asyncio.ensure_future(app(scope, receive, send))
        await asyncio.sleep(0.5)
        assert not handler.done()  # it is waiting for a change
        t0 = time.monotonic()
        left.set()
        await asyncio.wait_for(handler, 10)
        return time.monotonic() - t0

    assert asyncio.run(main()) < 2


def test_a_change_during_a_long_poll_s_read_wakes_it_at_once(db):
    """Found in review: a change noticed while a long poll read the feed replaced the event
    before the poll waited on it, so the poll slept its 5 s turn before answering."""
    token = db.tokens.create("ops", admin=True)
    app = create_app(db)
    notifier, read = app.state.notifier, db._ops.feed_scan

    async def main() -> tuple[float, list]:
        loop = asyncio.get_running_loop()

        def fire() -> None:  # what the notifier's own watcher does at a change
            notifier.event.set()
            notifier.event = asyncio.Event()

        def changes_then_a_write(*args, **kwargs):
            found = read(*args, **kwargs)  # nothing yet
            db._ops.feed_scan = read
            db.scope("app", "a").put("k", 1)  # lands just after this read...
            loop.call_soon_threadsafe(fire)  # ...and is noticed before the poll waits
            time.sleep(0.2)
            return found

        since = db.last_change()
        db._ops.feed_scan = changes_then_a_write  # what the server reads the feed with
        body, first = [], [{"type": "http.request", "body": b"", "more_body": False}]

        async def receive():
            if first:
                return first.pop()
            await asyncio.Event().wait()  # the client stays

        async def send(message):
            body.append(message.get("body", b""))

        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": "GET", "scheme": "http", "path": "/v1/changes", "raw_path": b"/v1/changes",
                 "root_path": "", "query_string": f"since={since}&wait=30".encode(),
                 "headers": [(b"host", b"t"), (b"authorization", f"Bearer {token}".encode())],
                 "client": ("127.0.0.1", 1), "server": ("t", 80)}
        t0 = time.monotonic()
        await asyncio.wait_for(app(scope, receive, send), 20)
        return time.monotonic() - t0, json.loads(b"".join(body))["changes"]

    took, changes = asyncio.run(main())
    assert [c["key"] for c in changes] == ["k"]
    assert took < 3  # the old code: 5 s


def test_a_batch_cannot_reach_another_principals_session(api):
    """Found in review: /v1/batch skipped the session access check."""
    client, db, tok = api
    alice, bob = client(tok["alice"]), client(tok["bob"])
    sid = alice.post("/v1/sessions", json={}).json()["id"]
    alice.put(f"/v1/sessions/{sid}/state/keys/secret", json={"value": "alice's"})
    for op in ({"op": "put", "scope": f"session:{sid}", "key": "secret", "value": "bob's"},
               {"op": "delete", "scope": f"session:{sid}", "key": "secret"},
               {"op": "append", "scope": f"session:{sid}", "key": "l", "items": [1]}):
        r = bob.post("/v1/batch", json={"ops": [op]})
        assert r.status_code == 404 and err(r)["code"] == "not_found"
    assert alice.get(f"/v1/sessions/{sid}/state/keys/secret").json()["value"] == "alice's"
    assert alice.post("/v1/batch", json={"ops": [{"op": "put", "scope": f"session:{sid}",
                                                   "key": "x", "value": 1}]}).status_code == 200


@pytest.mark.parametrize("query", ["since=%C2%B2", "since=%D9%A1", "limit=%EF%BC%91"])
def test_non_ascii_digits_are_invalid_not_a_server_error(api, query):
    """Found in review: '²' passed str.isdigit() and then broke int() (a 500)."""
    client, _, _ = api
    r = client().get("/v1/changes?" + query)
    assert r.status_code == 400 and err(r)["code"] == "invalid_value"
    r = client().get("/v1/changes/stream?" + query)  # refused before the stream starts
    assert r.status_code == 400 and err(r)["code"] == "invalid_value"
    assert client().get("/v1/changes", params={"limit": 0}).status_code == 400


def test_a_deleted_session_stays_hidden_in_the_feed(api):
    """Found in review: after its deletion, another principal's session showed in /v1/changes."""
    client, db, tok = api
    alice, bob = client(tok["alice"]), client(tok["bob"])
    head = db.last_change()
    sid = alice.post("/v1/sessions", json={}).json()["id"]
    alice.put(f"/v1/sessions/{sid}/state/keys/api_key", json={"value": 1})
    alice.post(f"/v1/sessions/{sid}/turns", json={"input": "secret"})
    alice.delete(f"/v1/sessions/{sid}")
    seen = bob.get("/v1/changes", params={"since": head}).json()
    assert seen["changes"] == [] and seen["last"] == db.last_change()


def test_an_unknown_route_is_unknown_route_not_an_absent_key(any_db):
    """An unknown path answers 404 unknown_route (SPEC §16), never not_found: the remote
    client sent to a wrong prefix raises StorageError instead of reading "absent key" (it
    read None for every get); a known route's absent key is still not_found."""
    import threading

    import uvicorn

    from .serverproc import free_port

    db = any_db
    app = create_app(db)
    token = db.tokens.create("ops", admin=True)
    c = httpx.Client(transport=_Sync(app), base_url="http://t",
                     headers={"authorization": f"Bearer {token}"})
    for method, path in (("GET", "/v1/nope"), ("GET", "/state/v1/scopes/app/a/keys/k"),
                         ("POST", "/v1/turns/t-1/bogus")):
        r = c.request(method, path, json={})
        assert (r.status_code, err(r)["code"]) == (404, "unknown_route"), (path, r.text)
    assert err(c.get("/v1/scopes/app/a/keys/k"))["code"] == "not_found"
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        db.scope("app", "a").put("k", 1)
        wrong = agentstate.connect(f"http://127.0.0.1:{port}/state", token=token)
        with pytest.raises(agentstate.StorageError):
            wrong.scope("app", "a").get("k")
        with pytest.raises(agentstate.StorageError):
            wrong.runs.read("r")
        right = agentstate.connect(f"http://127.0.0.1:{port}", token=token)
        assert right.scope("app", "a").get("k") == 1 and right.runs.read("r") is None
    finally:
        server.should_exit = True
        thread.join(30)
