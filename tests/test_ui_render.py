"""Rendering the pages (issue 26): a value's HTML is bounded in size and time and made off the
event loop, the raw JSON is a link away, and hostile form input is a 400, never a 500."""

from __future__ import annotations

import html
import json
import re
import threading
import time

import httpx
import pytest

import agentstate
from agentstate.server import create_app

from .test_server import _Sync


def deep_lists(size: int, depth: int = 500) -> list:
    """About ``size`` bytes of JSON: lists nested ``depth`` deep, side by side."""
    one: list = []
    for _ in range(depth - 2):
        one = [one]
    return [one] * (size // (2 * depth))


@pytest.fixture
def ui(any_db):
    db = any_db
    tok = {"admin": db.tokens.create("ops", admin=True), "bob": db.tokens.create("bob")}
    app = create_app(db)

    def client(who="admin"):
        c = httpx.Client(transport=_Sync(app), base_url="http://t", follow_redirects=False)
        r = c.post("/ui/login", data={"token": tok[who], "next": "/ui"})
        c.cookies.set(app.state.api.cookie, r.cookies[app.state.api.cookie], path="/ui")
        return c

    return client, db


@pytest.mark.slow_on_postgres  # the page's rendering is the same on both
def test_a_value_of_deeply_nested_lists_renders_a_bounded_page_with_a_link_to_the_json(ui):
    """Issue 26.21: 100 KB of nested lists (any token may write one) rendered as 50 MB of
    HTML; a value's HTML is now capped, says it was cut, and links to the whole value."""
    client, db = ui
    value = deep_lists(100_000)
    assert len(json.dumps(value, separators=(",", ":"))) <= 101_000
    db.scope("app", "x").put("deep", value)
    db.scope("app", "x").append("items", value[:60])
    db.runs.write("r", [{"seq": 0, "type": "tool_call", "call_id": "c", "name": "f", "arguments": value},
                        {"seq": 1, "type": "message", "role": "user", "content": value}],
                  {"task": "t", "state": value}, create=True)
    alice = agentstate.Principal("ops", admin=True)
    s = db.sessions.create(alice, metadata={"deep": value})
    t = db.sessions.start_turn(s.id, alice, input=value)
    t.hold(value)
    c = client("bob")
    for path in ("/ui/scopes/app/x/keys/deep", "/ui/scopes/app/x/keys/items", "/ui/runs/r",
                 "/ui/runs/r/snapshot", f"/ui/turns/{t.id}", "/ui/scopes/app/x"):
        t0 = time.monotonic()
        r = client().get(path)
        took = time.monotonic() - t0
        assert r.status_code == 200, path
        assert len(r.content) < 2_000_000 and took < 10, (path, len(r.content), took)
    page = client().get("/ui/scopes/app/x/keys/deep").text
    assert "truncated" in page
    raw = re.search(r'href="([^"]*format=json[^"]*)"', page).group(1)
    whole = client().get(html.unescape(raw))
    assert whole.headers["content-type"].startswith("application/json")
    assert whole.json() == value
    assert c.get("/ui/scopes/app/x/keys/deep?format=json").json() == value
    snap = client().get("/ui/runs/r/snapshot?format=json").json()
    assert snap == {"task": "t", "state": value}
    big = [[[i]] for i in range(60_000)]  # past what a page parses (50,000 values): cut there
    db.runs.write("r", [{"seq": 2, "type": "tool_result", "call_id": "c", "content": big}],
                  {"task": "t", "state": big})
    assert "truncated" in client().get("/ui/runs/r").text
    assert client().get("/ui/runs/r?format=json").json()["snapshot"]["state"] == big
    assert client().get("/ui/runs/r?format=json").json()["entries"][-1]["content"] == big
    assert client().get("/ui/runs/r/snapshot?format=json").json()["state"] == big  # whole
    assert client().get(f"/ui/turns/{t.id}?format=json").json()["request"] == value


def test_pages_are_rendered_off_the_event_loop(ui):
    """Issue 26.21: templates rendered on the event loop stalled every other request."""
    from agentstate.server.ui import _views

    client, db = ui
    db.scope("app", "x").put("deep", deep_lists(100_000))
    threads = []
    render = _views.ENV.get_template("key.html").__class__.render

    def spy(self, *args, **kwargs):
        threads.append(threading.current_thread())
        return render(self, *args, **kwargs)

    _views.ENV.get_template("key.html").__class__.render = spy
    try:
        assert client().get("/ui/scopes/app/x/keys/deep").status_code == 200
    finally:
        _views.ENV.get_template("key.html").__class__.render = render
    assert threads and all(t is not threading.main_thread() for t in threads)  # the loop's thread


@pytest.mark.parametrize("text", ["[" * 100_000, "{\"a\":" * 100_000, "[" * 600 + "]" * 600,
                                  '"\\ud800"', "1e999", '"a\\u0000b"'],
                         ids=["deep-lists", "deep-objects", "past-the-depth", "surrogate", "inf", "nul"])
def test_the_decide_form_refuses_hostile_json_with_a_400(ui, text):
    """Issue 26.22: the decide form with "[" * 100000 answered a 500 with a traceback."""
    client, db = ui
    ops = agentstate.Principal("ops", admin=True)
    t = db.sessions.start_turn(db.sessions.create(ops).id, ops)
    t.hold({"ask": "ok?"})
    c = client()
    csrf = re.search(r'name="csrf" value="([^"]+)"', c.get(f"/ui/turns/{t.id}").text).group(1)
    r = c.post(f"/ui/turns/{t.id}/decide", data={"csrf": csrf, "decision": text})
    assert r.status_code == 400 and "error" in r.text
    assert db.sessions.get_turn(t.id, ops).status == "held"


@pytest.mark.parametrize("path", ["/ui/login"])  # /ui/logout reads no form: it always signs out
@pytest.mark.parametrize("body, status", [(b"token=" + b"x" * 5_000_000, 413), (b"token=\xff", 400),
                                          (b"&".join([b"a=1"] * 200), 400)],
                         ids=["too-big", "not-utf8", "many-fields"])
def test_a_bad_sign_in_form_is_an_error_page_not_a_server_error(ui, path, body, status):
    """Hostile review: the sign-in form (before any token is checked) read 4 MiB, and its
    errors escaped the pages' handler: a 500 with a traceback."""
    client, db = ui
    c = client("bob") if path == "/ui/logout" else \
        httpx.Client(transport=_Sync(create_app(db)), base_url="http://t")
    r = c.post(path, content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == status and "text/html" in r.headers["content-type"]
    assert "default-src 'none'" in r.headers["content-security-policy"]


def test_a_run_page_reads_a_bounded_number_of_bytes_after_it(ui, monkeypatch):
    """Hostile review: looking for an open call's result, a run's page read up to 10,000
    entries after it, a thousand at a time, each up to 16 MiB; now 20 at a time, up to
    LIMITS.run_page_search bytes in all, then the call is marked as not found in what was
    searched."""
    from agentstate.server._limits import LIMITS

    client, db = ui
    entries = [{"seq": 0, "type": "tool_call", "call_id": "c", "name": "f"}]
    entries += [{"seq": i, "type": "message", "role": "tool", "content": "x" * 100_000}
                for i in range(1, 80)]
    db.runs.write("r", entries, None, create=True)
    read, original = [], db._ops.run_entries
    monkeypatch.setattr(db._ops, "run_entries", lambda *a: (lambda rows: (read.extend(
        len(t) for _, t in rows), rows)[1])(original(*a)))
    with LIMITS.override(run_page_search=1_000_000):
        page = client().get("/ui/runs/r?before=1").text
    assert "no result in the next entries searched" in page and "unknown: no result" not in page
    assert sum(read) < 1_000_000 + 20 * 100_100 and len(read) < 79 + 1
