"""The past on the pages (SPEC §17), in process, on both backends: a key's history with what
changed between versions, and the store (a scope, a key) as of a change picked on the feed
page; the same rules as the API's (grants, the owner rule), escaping, bounded work."""

from __future__ import annotations

import html
import re
import time

import agentstate

from . import test_ui
from .test_server import signin_cookie
from .test_ui import XSS

ui = test_ui.ui  # the pages' fixture: a signed-in client factory, on each backend


def plain(page: str) -> str:
    """A page's text, tags out and entities decoded, blank lines squeezed."""
    return html.unescape(re.sub(r"\n\s*\n+", "\n", re.sub(r"<[^>]+>", "", page)))


def test_a_key_s_page_shows_its_history_and_what_each_change_changed(ui):
    client, db, _tok = ui
    s = db.scope("user", "u-7")
    s.put("settings", {"theme": "dark", "lang": "en", "tags": ["a"], "x y": 1})
    s.put("settings", {"theme": "light", "tags": ["a", "b"], "x y": 1, "new": None})
    c = client()
    r = c.get("/ui/scopes/user/u-7/keys/settings")
    assert r.status_code == 200
    text = plain(r.text)
    history = text[text.index("History"):]
    newest = history[:history.index("as of this change")]
    assert '~ theme: "dark" → "light"' in newest
    assert '- lang: "en"' in newest and '+ tags[1]: "b"' in newest and "+ new: null" in newest
    assert "x y" not in newest  # unchanged members are not listed
    assert '+ (the value): {"theme": "dark", "lang": "en", "tags": ["a"], "x y": 1}' in history
    seqs = [int(x) for x in re.findall(r'id="rev-(\d+)"', r.text)]
    assert seqs == sorted(seqs, reverse=True) and len(seqs) == 2
    assert f'/ui/scopes/user/u-7/keys/settings?as_of={seqs[1]}' in r.text


def test_a_list_s_history_says_which_items_came_and_went_and_a_deleted_key_keeps_its_page(ui):
    client, db, _tok = ui
    s = db.scope("thread", "t-1")
    s.append("log", ["hi"])
    s.append("log", ["there", "you"])
    s.pop("log")
    s.delete("log")
    c = client()
    r = c.get("/ui/scopes/thread/t-1/keys/log")
    assert r.status_code == 200
    text = plain(r.text)
    assert "No such key now" in text
    history = text[text.index("History"):]
    assert '- (the value): ["hi", "there"]' in history  # the delete
    assert '- [2]: "you"' in history  # the pop
    assert '+ [1]: "there"' in history and '+ [2]: "you"' in history  # the second append
    assert '+ (the value): ["hi"]' in history
    assert c.get("/ui/scopes/thread/t-1/keys/never").status_code == 404


def test_the_history_is_paged(ui):
    client, db, _tok = ui
    s = db.scope("agent", "a")
    for i in range(25):
        s.put("n", i)
    c = client()
    r = c.get("/ui/scopes/agent/a/keys/n")
    seqs = [int(x) for x in re.findall(r'id="rev-(\d+)"', r.text)]
    assert len(seqs) == 10
    older = re.search(r'href="\?before=(\d+)#history"', r.text)
    assert older and int(older.group(1)) == seqs[-1]
    r2 = c.get(f"/ui/scopes/agent/a/keys/n?before={seqs[-1]}")
    more = [int(x) for x in re.findall(r'id="rev-(\d+)"', r2.text)]
    assert len(more) == 10 and max(more) < min(seqs)
    assert more == list(range(seqs[-1] - 1, seqs[-1] - 11, -1))
    assert f"~ (the value): {more[-1] - 2} → {more[-1] - 1}" in plain(r2.text)  # the oldest of a
    # page compared too (the value of seq n is n - 1)


def test_the_store_as_of_a_change_picked_on_the_feed_page(ui):
    """Each kv change on the feed page links to its scope and key as they were right after
    it; the form goes to any scope as of any change; those pages show the past, read-only."""
    client, db, _tok = ui
    s = db.scope("user", "u-1")
    s.put("plan", "free")
    s.append("events", [1, 2])
    then = db.last_change()
    s.put("plan", "pro")
    s.put("later", 1)
    s.delete("events")
    c = client()
    feed = c.get("/ui/changes").text
    assert f'href="/ui/scopes/user/u-1?as_of={then}"' in feed
    assert f'href="/ui/scopes/user/u-1/keys/events?as_of={then}"' in feed
    r = c.get("/ui/scopes", params={"kind": "user", "id": "u-1", "as_of": then})
    assert (r.status_code, r.headers["location"]) == (303, f"/ui/scopes/user/u-1?as_of={then}")
    scope = c.get(f"/ui/scopes/user/u-1?as_of={then}")
    text = plain(scope.text)
    assert scope.status_code == 200 and f"As it was right after change {then}" in text
    assert "events" in text and "later" not in text and '"free"' in text and '"pro"' not in text
    assert f'href="/ui/scopes/user/u-1/keys/plan?as_of={then}"' in scope.text
    assert 'data-watch=""' in scope.text  # the past does not move
    key = c.get(f"/ui/scopes/user/u-1/keys/events?as_of={then}")
    assert key.status_code == 200 and "<dt>length</dt><dd>2</dd>" in key.text
    plan = c.get(f"/ui/scopes/user/u-1/keys/plan?as_of={then}")
    assert '"free"' in plain(plan.text).split("History")[0]
    assert re.search(r'<tr id="rev-\d+" class="then">', plan.text)  # the revision in force then
    assert c.get(f"/ui/scopes/user/u-1/keys/plan?as_of={then}&format=json").text == '"free"'
    gone = c.get(f"/ui/scopes/user/u-1/keys/later?as_of={then}")
    assert gone.status_code == 200 and f"No such key as of change {then}" in plain(gone.text)
    for bad, status in ((db.last_change() + 1, 400), ("-1", 400), ("x", 400)):
        assert c.get(f"/ui/scopes/user/u-1?as_of={bad}").status_code == status, bad
        assert c.get(f"/ui/scopes/user/u-1/keys/plan?as_of={bad}").status_code == status, bad
    db.set_setting("history_retention", 0)
    assert c.get(f"/ui/scopes/user/u-1?as_of={then}").status_code == 410


def test_the_past_on_the_pages_keeps_to_grants_and_the_owner_rule(ui):
    client, db, tok = ui
    alice = agentstate.Principal("alice")
    sid = db.sessions.create(alice).id
    st = db.sessions.state(sid, alice)
    st.put("secret", "s3")
    then = db.last_change()
    st.put("secret", "s4")
    db.scope("user", "u-2").put("k", 1)
    bob = client("bob")
    for path in (f"/ui/scopes/session/{sid}?as_of={then}",
                 f"/ui/scopes/session/{sid}/keys/secret?as_of={then}",
                 f"/ui/scopes/session/{sid}/keys/secret"):
        r = bob.get(path)
        assert r.status_code == 404 and "s3" not in r.text, path
        assert client("alice").get(path).status_code == 200, path
    carol = client(None)
    r = carol.post("/ui/login", data={"token": db.tokens.create("carol", grants=["user:u-1=r"]),
                                      "next": "/ui"})
    carol.cookies.set(*signin_cookie(r), path="/ui")
    for path in (f"/ui/scopes/user/u-2/keys/k?as_of={then}", f"/ui/scopes/user/u-2?as_of={then}",
                 "/ui/scopes/user/u-2/keys/k"):
        assert carol.get(path).status_code == 403, path
    assert carol.get(f"/ui/scopes/user/u-1?as_of={then}").status_code == 200


def test_a_hostile_value_s_history_is_escaped_and_bounded(ui):
    """Values with markup show as text in the lines; a value nested 500 deep, or of 100,000
    items, changed: the page answers quickly and says it could not compare it whole."""
    client, db, _tok = ui
    s = db.scope("app", "x")
    s.put("v", {"html": "plain"})
    s.put("v", {"html": XSS})
    deep: list = []
    cur = deep
    for _ in range(500):
        cur.append([])
        cur = cur[0]
    s.put("deep", deep)
    s.put("deep", [deep])
    s.put("wide", list(range(100_000)))
    s.put("wide", list(range(1, 100_001)))
    c = client()
    r = c.get("/ui/scopes/app/x/keys/v")
    assert XSS not in r.text and html.escape(XSS, quote=True)[:20] in r.text
    for key in ("deep", "wide"):
        t0 = time.monotonic()
        r = c.get(f"/ui/scopes/app/x/keys/{key}")
        assert r.status_code == 200 and time.monotonic() - t0 < 10, key
    assert "More changed than these lines" in plain(c.get("/ui/scopes/app/x/keys/wide").text)
