"""The pages at /ui (issue 16), in process: signing in, access rules, CSRF, escaping, paging.

The same pages in a real browser are in test_ui_browser.py.
"""

from __future__ import annotations

import html
import re
import json
import time

import httpx
import pytest

import agentstate
from agentstate.server import create_app
from agentstate.server.ui._signin import RECHECK_S, safe_next
from agentstate.server.ui._timeline import timeline

from .test_server import _Sync

XSS = "<script>document.title='pwned'</script>"


@pytest.fixture
def ui(any_db):
    """(client factory signed in with a token, db, tokens), on each backend."""
    db = any_db
    tok = {"admin": db.tokens.create("ops", admin=True), "alice": db.tokens.create("alice"),
           "bob": db.tokens.create("bob")}
    app = create_app(db)

    def client(who: str | None = "admin") -> httpx.Client:
        c = httpx.Client(transport=_Sync(app), base_url="http://t", follow_redirects=False)
        if who is not None:
            r = c.post("/ui/login", data={"token": tok[who], "next": "/ui"})
            assert r.status_code == 303 and r.headers["location"] == "/ui"
            c.cookies.set(app.state.api.cookie, r.cookies[app.state.api.cookie], path="/ui")
        return c

    return client, db, tok


def held_turn(db, owner: str, request=None):
    p = agentstate.Principal(owner)
    s = db.sessions.create(p)
    t = db.sessions.start_turn(s.id, p, input={"message": "refund?"})
    t.hold(request or {"ask": "approve the refund?"})
    return s, t


def test_signed_out_pages_send_to_the_sign_in_form_and_the_token_stays_out_of_urls(ui):
    client, db, tok = ui
    anon = client(None)
    r = anon.get("/ui/runs?page=2")
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=%2Fui%2Fruns%3Fpage%3D2"
    assert anon.get("/ui/stream").status_code == 303
    form = anon.get("/ui/login?next=/ui/runs")
    assert 'method="post"' in form.text and 'type="password"' in form.text
    bad = anon.post("/ui/login", data={"token": "nope", "next": "/ui"})
    assert bad.status_code == 401 and "unknown token" in bad.text and "agentstate_ui" not in bad.headers.get("set-cookie", "")
    r = anon.post("/ui/login", data={"token": tok["alice"], "next": "/ui/runs"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/runs"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert tok["alice"] not in cookie and tok["alice"] not in r.headers["location"]
    # an API bearer token is not a page sign-in, and a page cookie is no API token
    other = client(None)
    assert other.get("/ui", headers={"authorization": f"Bearer {tok['alice']}"}).status_code == 303
    c = client("alice")
    assert c.get("/v1/runs").status_code == 401


@pytest.mark.parametrize("target, expected", [
    ("/ui/runs", "/ui/runs"), ("https://evil.example/", "/ui"), ("//evil.example/ui", "/ui"),
    ("/uix/../../", "/uix/../../"), ("/ui\\@evil", "/ui"), ("", "/ui"), ("/ui\r\nX: 1", "/ui"),
])
def test_after_signing_in_only_a_page_of_ours(target, expected):
    assert safe_next(target) == expected


def test_sign_out_and_revoked_tokens_end_the_sign_in(ui):
    client, db, tok = ui
    c = client("bob")
    page = c.get("/ui")
    assert page.status_code == 200 and "bob" in page.text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
    assert c.post("/ui/logout", data={"csrf": csrf}).status_code == 303
    assert c.get("/ui").status_code == 303
    c = client("bob")
    assert c.get("/ui").status_code == 200
    assert db.tokens.revoke("bob") == 1
    time.sleep(RECHECK_S + 0.5)
    assert c.get("/ui").status_code == 303  # the token is looked up again: signed out


def test_a_principal_sees_and_decides_only_its_own_sessions(ui):
    client, db, tok = ui
    s, t = held_turn(db, "alice")
    bob, alice, admin = client("bob"), client("alice"), client("admin")
    for path in (f"/ui/sessions/{s.id}", f"/ui/turns/{t.id}", f"/ui/scopes/session/{s.id}",
                 f"/ui/scopes/session/{s.id}/keys/x"):
        assert bob.get(path).status_code == 404, path
        assert alice.get(path).status_code in (200, 404) and admin.get(path).status_code in (200, 404)
    for path in ("/ui", "/ui/sessions", "/ui/changes", "/ui/scopes"):
        assert s.id not in bob.get(path).text and t.id not in bob.get(path).text, path
    assert t.id in alice.get("/ui/changes").text and t.id in admin.get("/ui/changes").text
    assert t.id in alice.get("/ui").text and t.id in admin.get("/ui").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', bob.get("/ui").text).group(1)
    r = bob.post(f"/ui/turns/{t.id}/decide", data={"csrf": csrf, "decision": "true"})
    assert r.status_code == 404
    assert db.sessions.get_turn(t.id, agentstate.Principal("alice")).status == "held"
    csrf = re.search(r'name="csrf" value="([^"]+)"', admin.get(f"/ui/turns/{t.id}").text).group(1)
    r = admin.post(f"/ui/turns/{t.id}/decide", data={"csrf": csrf, "decision": '{"ok": true}'})
    assert r.status_code == 303 and r.headers["location"] == f"/ui/turns/{t.id}"
    after = db.sessions.get_turn(t.id, agentstate.Principal("alice"))
    assert after.status == "decided" and after.decision == {"ok": True}


def test_deciding_needs_the_pages_csrf_token_and_our_origin(ui):
    client, db, tok = ui
    s, t = held_turn(db, "alice")
    c = client("alice")
    page = c.get(f"/ui/turns/{t.id}").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page).group(1)
    for data, headers in (({"decision": "1"}, {}), ({"decision": "1", "csrf": "x" * len(csrf)}, {}),
                          ({"decision": "1", "csrf": csrf}, {"origin": "http://evil.example"})):
        r = c.post(f"/ui/turns/{t.id}/decide", data=data, headers=headers)
        assert r.status_code == 403, (data, headers)
    bad = c.post(f"/ui/turns/{t.id}/decide", data={"csrf": csrf, "decision": "{nope"})
    assert bad.status_code == 400 and "not JSON" in bad.text and "{nope" in bad.text
    nan = c.post(f"/ui/turns/{t.id}/decide", data={"csrf": csrf, "decision": "NaN"})
    assert nan.status_code == 400
    assert db.sessions.get_turn(t.id, agentstate.Principal("alice")).status == "held"
    ok = c.post(f"/ui/turns/{t.id}/decide", data={"csrf": csrf, "decision": "1"},
                headers={"origin": "http://t"})
    assert ok.status_code == 303
    again = c.post(f"/ui/turns/{t.id}/decide", data={"csrf": csrf, "decision": "2"})
    assert again.status_code == 400 and "InvalidTransition" in again.text


def test_everything_from_the_store_is_escaped(ui):
    client, db, tok = ui
    s, t = held_turn(db, "ops", request={"ask": XSS})
    db.sessions.state(s.id, agentstate.Principal("ops")).put("k", XSS)
    db.scope("user", "u1").put("note", XSS)
    db.scope("user", "u1").append("list", [XSS])
    db.runs.write("r-x", [{"seq": 0, "type": "message", "role": XSS, "content": XSS},
                          {"seq": 1, "type": "tool_call", "call_id": XSS, "name": XSS, "arguments": XSS}],
                  {"task": XSS}, create=True)
    c = client("admin")
    for path in ("/ui", "/ui/runs", "/ui/runs/r-x", "/ui/runs/r-x/snapshot", "/ui/sessions",
                 f"/ui/sessions/{s.id}", f"/ui/turns/{t.id}", "/ui/scopes", "/ui/scopes/user/u1",
                 "/ui/scopes/user/u1/keys/note", "/ui/scopes/user/u1/keys/list", "/ui/changes"):
        r = c.get(path)
        assert r.status_code == 200, path
        assert "<script>document" not in r.text, path
        assert "default-src 'none'" in r.headers["content-security-policy"]
    for path in ("/ui/runs/r-x", f"/ui/turns/{t.id}", "/ui/scopes/user/u1/keys/note"):
        assert html.escape(XSS, quote=False) in c.get(path).text.replace("&#39;", "'"), path


def test_a_run_of_100000_entries_opens_at_its_newest_page(ui):
    client, db, tok = ui
    n = 100_000
    entries = [{"seq": i, "type": "message", "role": "assistant", "content": f"step {i}"} for i in range(n - 1)]
    entries.append({"seq": n - 1, "type": "tool_call", "call_id": "last", "name": "pay"})
    db.runs.write("big", entries, {"task": "big"}, create=True)
    c = client("admin")
    page = c.get("/ui/runs/big").text
    seqs = [int(x) for x in re.findall(r'id="seq-(\d+)"', page)]
    assert seqs == list(range(n - 50, n))
    assert 'class="call unknown"' in page  # the interrupted call, as load() would see it
    assert f"?before={n - 50}" in page and '"task": "big"' in html.unescape(page)  # runs.head()
    older = c.get(f"/ui/runs/big?before={n - 50}").text
    assert [int(x) for x in re.findall(r'id="seq-(\d+)"', older)] == list(range(n - 100, n - 50))
    first = c.get("/ui/runs/big?before=50").text
    assert [int(x) for x in re.findall(r'id="seq-(\d+)"', first)] == list(range(0, 50))
    assert 'id="older"' not in first


def test_lists_and_keys_are_paged(ui):
    client, db, tok = ui
    sc = db.scope("app", "many")
    with db.transaction():
        for i in range(120):
            sc.put(f"k{i:03d}", i)
    sc.append("long", list(range(500)))
    c = client("admin")
    first = c.get("/ui/scopes/app/many").text
    assert "k000" in first and "k049" in first and "k050" not in first
    second = c.get("/ui/scopes/app/many?after=k049").text
    assert "k050" in second and "k099" in second and "k100" not in second
    items = c.get("/ui/scopes/app/many/keys/long?start=100").text
    assert 'value="100"' in items and 'value="149"' in items and 'value="150"' not in items
    for i in range(60):
        db.runs.write(f"run-{i:02d}", [], {"task": "t"}, create=True)
    assert c.get("/ui/runs").text.count('href="/ui/runs/run-') == 50
    first = c.get("/ui/runs").text
    older = re.search(r'href="(/ui/runs\?after=[^"]+)">Older', first).group(1)
    second = c.get(older.replace("&amp;", "&")).text
    assert second.count('href="/ui/runs/run-') == 10 and "Older</a>" not in second
    ids = lambda page: set(re.findall(r'href="/ui/runs/(run-\d+)"', page))
    assert ids(first) | ids(second) == {f"run-{i:02d}" for i in range(60)}
    assert not ids(first) & ids(second)


def test_the_overview_finds_running_held_and_expired_turns(ui):
    client, db, tok = ui
    ops = agentstate.Principal("ops", admin=True)
    running = db.sessions.start_turn(db.sessions.create(ops).id, ops)
    s, held = held_turn(db, "ops")
    lapsed = db.sessions.start_turn(db.sessions.create(ops).id, ops, lease=0.05)
    time.sleep(0.2)
    page = client("admin").get("/ui").text
    sections = {name: page.split(f'id="{name}"')[1].split("</section>")[0]
                for name in ("active", "held", "expired")}
    assert running.id in sections["active"] and held.id in sections["held"]
    assert lapsed.id in sections["expired"] and lapsed.id not in sections["active"]


def test_timeline_pairs_calls_and_marks_what_load_would_mark_unknown(db):
    entries = [{"seq": 0, "type": "tool_call", "call_id": "a"}, {"seq": 1, "type": "tool_call", "call_id": "b"},
               {"seq": 2, "type": "tool_result", "call_id": "a"}, {"seq": 3, "type": "tool_call", "call_id": "c"},
               {"seq": 4, "type": "message", "role": "user", "content": "x"}, {"seq": 5, "note": 1}]
    later = [{"seq": 6, "type": "tool_result", "call_id": "c"}]
    items = timeline(entries[:5] + [entries[5]], lambda since, n: [e for e in later if e["seq"] >= since][:n])
    by = {it.entry["seq"]: it for it in items}
    assert by[0].result == entries[2] and by[2].paired_above
    assert by[1].unknown and not by[0].unknown and by[3].result == later[0] and not by[3].unknown
    assert [it.kind for it in items] == ["call", "call", "result", "call", "message", "other"]
    db.runs.write("r", entries + later, None, create=True)  # the same answer as load()
    synthetic = [e["call_id"] for e in db.runs.load("r").entries if e.get("status") == "unknown"]
    assert synthetic == ["b"]


def test_the_pages_read_pages_never_tables(db, tmp_path):
    """A store of 2,000 sessions (a quarter held for a decision, half with a lapsed lease),
    2,000 runs and one of 5,000 entries: every page fetches a bounded number of rows (counted by apsw's row trace
    on every connection the server opens), and shows what it should."""
    ops, alice = agentstate.Principal("ops", admin=True), agentstate.Principal("alice")
    with db.transaction():
        for i in range(2000):
            who = alice if i % 2 else ops
            s = db.sessions.create(who)
            t = db.sessions.start_turn(s.id, who, lease=0.01 if i % 4 in (0, 3) else 600)
            if i % 4 == 1:
                t.hold({"i": i})
            db.runs.write(f"run-{i:04d}", [{"seq": 0, "type": "message"}], {"task": "t"}, create=True)
    db.runs.write("long", [{"seq": i, "type": "message", "content": i} for i in range(5000)],
                  {"task": "long one"}, create=True)
    time.sleep(0.05)  # the short leases lapse
    tok = {"ops": db.tokens.create("ops", admin=True), "alice": db.tokens.create("alice")}
    rows = [0]

    def hook(conn):
        conn.row_trace = lambda cursor, row: (rows.__setitem__(0, rows[0] + 1), row)[1]

    import apsw
    apsw.connection_hooks.append(hook)
    try:
        db2 = agentstate.open(db.path)
        app = create_app(db2)
        for who in ("ops", "alice"):
            c = httpx.Client(transport=_Sync(app), base_url="http://t", follow_redirects=False)
            r = c.post("/ui/login", data={"token": tok[who], "next": "/ui"})
            c.cookies.set(app.state.api.cookie, r.cookies[app.state.api.cookie], path="/ui")
            for path, shows in (("/ui", "100+"), ("/ui/runs", "run-1999"), ("/ui/sessions", "s-"),
                                ("/ui/turns?which=held", "held"), ("/ui/turns?which=expired", "expired"),
                                ("/ui/turns?which=active", "running"), ("/ui/runs/long", "long one"),
                                ("/ui/runs/long/snapshot", "long one")):
                rows[0] = 0
                page = c.get(path)
                assert page.status_code == 200 and shows in page.text, (who, path)
                assert rows[0] < 800, (who, path, rows[0])  # the store holds over 10,000 rows
            older = re.search(r'href="(/ui/turns\?which=held&amp;after=[^"]+)">Older', c.get("/ui/turns?which=held").text)
            assert older is not None
            second = c.get(older.group(1).replace("&amp;", "&")).text
            assert second.count('class="status s-held"') == 50
        db2.close()
    finally:
        apsw.connection_hooks.remove(hook)


def test_the_run_page_marks_claims_in_doubt_and_in_progress(ui):
    """A call claimed by once() with no result: highlighted as in doubt once its claim is
    not live, marked in progress while it is; a settled call is neither (SPEC §14)."""
    client, db, tok = ui
    db.runs.write("calls", [], None, create=True)
    db.runs.once("calls", "paid", lambda: "ch_1")
    db.runs.claim("calls", "running")
    db.runs.claim("calls", "lost", lease=0.01)
    time.sleep(0.05)
    page = client("admin").get("/ui/runs/calls").text
    classes = dict(re.findall(r'<li class="([^"]+)" id="seq-(\d+)"', page)[i][::-1]
                   for i in range(4))
    assert classes["0"] == "call" and classes["2"] == "call in-progress"
    assert classes["3"] == "call unknown in-doubt"
    assert "in doubt: claimed at" in page and "in progress: claimed at" in page


def test_claims_are_judged_by_the_store_s_clock(pg_url, monkeypatch):
    """On PostgreSQL the database server's clock judges a claim's lease (SPEC §16), not the
    clock of the machine showing it: with this machine 400 s ahead, a claim of 300 s made a
    moment ago is in progress on the run page and in `agentstate runs show`, as the claim
    route says (they judged it by this machine's clock: in doubt)."""
    from click.testing import CliRunner

    from agentstate.cli import cli

    with agentstate.open(pg_url) as db:
        db.runs.write("r", [], None, create=True)
        db.runs.claim("r", "c1", lease=300)
        real = time.time
        monkeypatch.setattr(time, "time", lambda: real() + 400)
        app = create_app(db)
        c = httpx.Client(transport=_Sync(app), base_url="http://t")
        r = c.post("/ui/login", data={"token": db.tokens.create("ops", admin=True), "next": "/ui"})
        c.cookies.set(app.state.api.cookie, r.cookies[app.state.api.cookie], path="/ui")
        page = c.get("/ui/runs/r").text
        assert "in progress: claimed at" in page and "in doubt" not in page
        shown = CliRunner().invoke(cli, ["--db", pg_url, "--json", "runs", "show", "r"])
        assert json.loads(shown.stdout)["open_calls"] == {"c1": "in_progress"}
        assert db.runs.claim("r", "c1").status == "in_progress"
