"""The past over HTTP (SPEC §17): ``?as_of=`` on every read route, a key's history, the
diff, restore and fork; who may read whose past (SPEC §4, §15), and the seqs no store has."""

from __future__ import annotations

import base64

import httpx
import pytest

import agentstate
from agentstate.server import create_app
from agentstate.server._limits import LIMITS

from .conftest import digest
from .test_server import _Sync

ALICE, BOB = agentstate.Principal("alice"), agentstate.Principal("bob")


@pytest.fixture
def served(any_db):
    """(db, app, client(token name)) with tokens for ops (admin), alice, bob, and carol
    (grants: thread:t-1 rw, user:u-1 r)."""
    db = any_db
    tokens = {"ops": db.tokens.create("ops", admin=True), "alice": db.tokens.create("alice"),
              "bob": db.tokens.create("bob"),
              "carol": db.tokens.create("carol", grants=["thread:t-1", "user:u-1=r"])}
    app = create_app(db)

    def client(name: str = "ops", **headers: str) -> httpx.Client:
        return httpx.Client(transport=_Sync(app), base_url="http://t", headers={
            "authorization": f"Bearer {tokens[name]}", **headers})

    return db, app, client


def err(r) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


def test_every_read_route_reads_the_past_with_as_of(served):
    """GET of a key, its expires_at, slice and length, the keys list, items, and get_many's
    body, for a plain scope and a session's own state: each as it was right after the
    change named, and as it is without as_of."""
    db, _app, client = served
    sid = db.sessions.create(ALICE).id
    for base, s in (("/v1/scopes/user/u-1", db.scope("user", "u-1")),
                    (f"/v1/sessions/{sid}/state", db.sessions.state(sid, ALICE))):
        s.put("a", {"n": 1}, ttl=3600)
        s.append("l", [1, 2, 3])
        then = db.last_change()
        s.put("a", {"n": 2})
        s.append("l", [4])
        s.put("b", "new")
        s.delete("l")
        c = client("alice") if "sessions" in base else client()
        q = {"as_of": then}
        assert c.get(f"{base}/keys/a", params=q).json() == {"key": "a", "value": {"n": 1},
                                                             "version": 1}
        assert c.get(f"{base}/keys/a").json()["value"] == {"n": 2}
        assert c.get(f"{base}/keys/a/expires_at", params=q).json()["expires_at"] is not None
        assert c.get(f"{base}/keys/a/expires_at").json()["expires_at"] is None
        assert c.get(f"{base}/keys/l/slice", params={**q, "start": 1}).json() == {"items": [2, 3]}
        assert c.get(f"{base}/keys/l/length", params=q).json() == {"length": 3}
        assert c.get(f"{base}/keys/l/length").json() == {"length": 0}
        assert err(c.get(f"{base}/keys/b", params=q)) == (404, "not_found")
        assert c.get(f"{base}/keys", params=q).json() == {"keys": ["a", "l"], "next": None}
        assert c.get(f"{base}/keys").json() == {"keys": ["a", "b"], "next": None}
        assert c.get(f"{base}/items", params={**q, "limit": 1}).json() == {
            "items": [{"key": "a", "value": {"n": 1}, "version": 1}], "next": "a"}
        assert c.post(f"{base}/get_many", json={"keys": ["a", "b", "l"], "as_of": then}).json() \
            == {"values": {"a": {"value": {"n": 1}, "version": 1}, "b": {"value": None, "version": 0},
                           "l": {"value": [1, 2, 3], "version": 1}}}


def test_bytes_of_the_past_read_as_bytes(served):
    db, _app, client = served
    s = db.scope("app", "a")
    s.put_bytes("raw", b"\xff\x00")
    then = db.last_change()
    s.put_bytes("raw", b"\x01")
    r = client().get("/v1/scopes/app/a/keys/raw", params={"as_of": then},
                     headers={"accept": "application/octet-stream"})
    assert (r.status_code, r.content) == (200, b"\xff\x00")


@pytest.mark.parametrize("as_of", ["-1", "9223372036854775808", "1.5", "x", "1e3"])
def test_an_as_of_that_is_no_seq_is_400(served, as_of):
    db, _app, client = served
    db.scope("app", "a").put("k", 1)
    for path in ("/v1/scopes/app/a/keys/k", "/v1/scopes/app/a/keys", "/v1/scopes/app/a/items",
                 "/v1/scopes/app/a/keys/k/length"):
        assert err(client().get(path, params={"as_of": as_of})) == (400, "invalid_value"), path


def test_a_seq_past_the_head_is_400_and_one_before_the_history_kept_is_410(served):
    """A seq past the newest change is no moment yet (400, also in get_many's body, and for
    an ``as_of`` just past it); with history off nothing but the head can be read (410)."""
    db, _app, client = served
    s = db.scope("app", "a")
    s.put("k", 1)
    s.put("k", 2)
    head = db.last_change()
    c = client()
    for seq in (head + 1, 2**63 - 1):
        assert err(c.get("/v1/scopes/app/a/keys/k", params={"as_of": seq})) == (400, "invalid_value")
        assert err(c.post("/v1/scopes/app/a/get_many", json={"keys": ["k"], "as_of": seq})) \
            == (400, "invalid_value")
        assert err(c.get("/v1/diff", params={"since": 0, "until": seq})) == (400, "invalid_value")
        assert err(c.post("/v1/scopes/app/a/restore", json={"at": seq})) == (400, "invalid_value")
    assert c.get("/v1/scopes/app/a/keys/k", params={"as_of": head}).json()["value"] == 2
    db.set_setting("history_retention", 0)
    assert err(c.get("/v1/scopes/app/a/keys/k", params={"as_of": head - 1})) == (410, "cursor_expired")
    assert err(c.post("/v1/scopes/app/a/restore", json={"at": head - 1})) == (410, "cursor_expired")
    assert err(c.get("/v1/diff", params={"since": head - 1})) == (410, "cursor_expired")
    assert c.get("/v1/scopes/app/a/keys/k", params={"as_of": head}).json()["value"] == 2


def test_as_of_on_a_route_that_does_not_read_the_past_is_refused(served):
    """The past is read-only: a write given ``?as_of=`` is 400 and writes nothing (it would
    otherwise land on the present, which its caller did not mean)."""
    db, _app, client = served
    db.scope("app", "a").append("l", [1])
    c = client()
    before = digest(db)
    for method, path, body in (("PUT", "/v1/scopes/app/a/keys/k", {"value": 1}),
                               ("DELETE", "/v1/scopes/app/a/keys/l", None),
                               ("POST", "/v1/scopes/app/a/keys/l/append", {"items": [2]}),
                               ("POST", "/v1/scopes/app/a/clear", {}),
                               ("POST", "/v1/batch", {"ops": [{"op": "put", "scope": "app:a",
                                                               "key": "k", "value": 1}]}),
                               ("GET", "/v1/changes", None)):
        r = c.request(method, path, params={"as_of": 1}, json=body)
        assert err(r) == (400, "invalid_value") and "read-only" in r.text, path
    assert digest(db) == before


def test_a_key_s_history_pages_newest_first_with_bytes_in_base64(served):
    db, _app, client = served
    s = db.scope("agent", "a")
    for i in range(5):
        s.put("k", {"i": i})
    s.delete("k")
    s.put_bytes("k", b"\xff")
    c = client()
    path = "/v1/scopes/agent/a/keys/k/history"
    whole = c.get(path).json()
    assert whole["next"] is None
    revs = whole["revisions"]
    assert [(r["version"], r["op"], r["type"]) for r in revs] == [
        (7, "put", "bytes"), (5, "delete", "json"), *[(5 - i, "put", "json") for i in range(5)]]
    assert base64.b64decode(revs[0]["value"]) == b"\xff" and revs[1]["value"] is None
    assert [r["value"] for r in revs[2:]] == [{"i": i} for i in (4, 3, 2, 1, 0)]
    assert revs[0]["at"].endswith("Z") and revs == sorted(revs, key=lambda r: -r["seq"])
    pages, before = [], None
    while True:
        got = c.get(path, params={"limit": 3, **({"before": before} if before else {})}).json()
        pages.append(got["revisions"])
        before = got["next"]
        if before is None:
            break
    assert [r for p in pages for r in p] == revs and [len(p) for p in pages] == [3, 3, 1]
    since = revs[3]["seq"]
    assert c.get(path, params={"since": since}).json()["revisions"] == revs[:3]
    assert c.get("/v1/scopes/agent/a/keys/never/history").json() == {"revisions": [], "next": None}
    with LIMITS.override(history_page=2):  # a bigger limit: a page of the most, and next
        assert c.get(path, params={"limit": 5}).json() == {"revisions": revs[:2],
                                                           "next": revs[1]["seq"]}
    assert err(c.get(path, params={"limit": 0})) == (400, "invalid_value")


def test_a_history_page_ends_early_past_its_byte_budget(served):
    """A list's every revision holds the whole list then: a page stops once its values pass
    history_bytes, and ``next`` goes on from there, nothing lost."""
    db, _app, client = served
    s = db.scope("agent", "a")
    for _ in range(40):
        s.append("log", ["x" * 100])
    c = client()
    with LIMITS.override(history_bytes=10_000):
        first = c.get("/v1/scopes/agent/a/keys/log/history").json()
        assert 0 < len(first["revisions"]) < 40 and first["next"] is not None
        rest = c.get("/v1/scopes/agent/a/keys/log/history", params={"before": first["next"]}).json()
    got = first["revisions"] + rest["revisions"]
    assert [r["version"] for r in got][:len(got)] == list(range(40, 40 - len(got), -1))
    assert [len(r["value"]) for r in got] == list(range(40, 40 - len(got), -1))


def test_the_diff_answers_what_changed_between_two_changes(served):
    db, _app, client = served
    a, b = db.scope("user", "u-1"), db.scope("thread", "t-1")
    a.put("x", 1)
    b.put_bytes("raw", b"\xfe")
    since = db.last_change()
    a.put("x", 2)
    a.put("y", [1])
    b.delete("raw")
    b.put("back", 1)
    b.put("back", 2)
    b.put("back", 1)
    until = db.last_change()
    a.put("x", 3)
    c = client()
    got = c.get("/v1/diff", params={"since": since, "until": until}).json()["diffs"]
    assert got == [
        {"kind": "thread", "scope_id": "t-1", "key": "back",
         "before": {"value": None, "version": 0, "type": "json"},
         "after": {"value": 1, "version": 3, "type": "json"}},
        {"kind": "thread", "scope_id": "t-1", "key": "raw",
         "before": {"value": base64.b64encode(b"\xfe").decode(), "version": 1, "type": "bytes"},
         "after": {"value": None, "version": 0, "type": "json"}},
        {"kind": "user", "scope_id": "u-1", "key": "x",
         "before": {"value": 1, "version": 1, "type": "json"},
         "after": {"value": 2, "version": 2, "type": "json"}},
        {"kind": "user", "scope_id": "u-1", "key": "y",
         "before": {"value": None, "version": 0, "type": "json"},
         "after": {"value": [1], "version": 1, "type": "json"}}]
    now = c.get("/v1/diff", params={"since": since, "kind": "user", "key": "x"}).json()["diffs"]
    assert [(d["key"], d["after"]["value"]) for d in now] == [("x", 3)]
    assert c.get("/v1/diff", params={"since": since, "scope_id": "t-1"}).json()["diffs"] == got[:2]
    assert err(c.get("/v1/diff", params={"since": until, "until": since})) == (400, "invalid_value")
    assert err(c.get("/v1/diff", params={"since": 0, "kind": "nope"})) == (400, "invalid_key")


def test_the_diff_shows_each_caller_only_what_it_may_read(served):
    """As in the feed: a token with grants sees the scopes its rules cover and its own
    sessions; another principal's session, and a deleted one, are left out; an admin sees
    everything."""
    db, _app, client = served
    since = db.last_change()
    mine = db.sessions.create(agentstate.Principal("carol")).id
    hers = db.sessions.create(ALICE).id
    gone = db.sessions.create(ALICE).id
    db.sessions.state(mine, agentstate.Principal("carol")).put("k", 1)
    db.sessions.state(hers, ALICE).put("k", 1)
    db.sessions.state(gone, ALICE).put("k", 1)
    db.sessions.delete(gone, ALICE)
    for kind, sid in (("thread", "t-1"), ("thread", "t-2"), ("user", "u-1"), ("user", "u-2"),
                      ("session", "plain")):
        db.scope(kind, sid).put("k", 1)

    def seen(who: str) -> set[tuple[str, str]]:
        r = client(who).get("/v1/diff", params={"since": since})
        assert r.status_code == 200, r.text
        return {(d["kind"], d["scope_id"]) for d in r.json()["diffs"]}

    everything = {("session", mine), ("session", hers), ("session", gone), ("thread", "t-1"),
                  ("thread", "t-2"), ("user", "u-1"), ("user", "u-2"), ("session", "plain")}
    assert seen("ops") == everything
    assert seen("carol") == {("session", mine), ("thread", "t-1"), ("user", "u-1")}
    assert seen("alice") == everything - {("session", mine), ("session", gone)}
    assert seen("bob") == everything - {("session", mine), ("session", hers), ("session", gone)}


def test_another_principal_s_session_s_past_is_as_invisible_as_its_present(served):
    """Bob reading alice's session as of a change, its history or restoring it: 404, as for
    an unknown session, by the plain scope route and the session's own; nothing written. A
    deleted session's past is hidden from its former owner too (as its feed rows are)."""
    db, _app, client = served
    sid = db.sessions.create(ALICE).id
    st = db.sessions.state(sid, ALICE)
    st.put("secret", 1)
    then = db.last_change()
    st.put("secret", 2)
    bob, alice = client("bob"), client("alice")
    before = digest(db)
    for base in (f"/v1/scopes/session/{sid}", f"/v1/sessions/{sid}/state"):
        for method, path, body in (("GET", f"{base}/keys/secret?as_of={then}", None),
                                   ("GET", f"{base}/keys?as_of={then}", None),
                                   ("GET", f"{base}/items?as_of={then}", None),
                                   ("GET", f"{base}/keys/secret/history", None),
                                   ("POST", f"{base}/get_many", {"keys": ["secret"], "as_of": then}),
                                   ("POST", f"{base}/restore", {"at": then})):
            r = bob.request(method, path, json=body)
            assert err(r) == (404, "not_found"), (path, r.text)
            assert "secret" not in r.text or "keys" in path
            assert alice.request(method, path, json=body).status_code == 200, path
    assert err(bob.post(f"/v1/sessions/{sid}/fork", json={"at": then})) == (404, "not_found")
    db.sessions.delete(sid, ALICE)
    before = digest(db)
    for path in (f"/v1/scopes/session/{sid}/keys/secret?as_of={then}",
                 f"/v1/scopes/session/{sid}/keys/secret/history"):
        assert err(alice.get(path)) == (404, "not_found"), path
        assert client().get(path).status_code == 200, path  # an admin still sees it
    assert err(alice.post(f"/v1/sessions/{sid}/fork", json={"at": then})) == (404, "not_found")
    assert digest(db) == before


def test_reading_the_past_needs_r_and_restoring_it_rw(served):
    db, _app, client = served
    for kind, sid in (("user", "u-1"), ("thread", "t-1"), ("user", "u-2")):
        db.scope(kind, sid).put("k", 1)
    then = db.last_change()
    for kind, sid in (("user", "u-1"), ("thread", "t-1"), ("user", "u-2")):
        db.scope(kind, sid).put("k", 2)
    carol = client("carol")
    assert carol.get("/v1/scopes/user/u-1/keys/k", params={"as_of": then}).json()["value"] == 1
    assert len(carol.get("/v1/scopes/user/u-1/keys/k/history").json()["revisions"]) == 2
    before = digest(db)
    assert err(carol.post("/v1/scopes/user/u-1/restore", json={"at": then})) == (403, "forbidden")
    for path in ("/v1/scopes/user/u-2/keys/k?as_of=1", "/v1/scopes/user/u-2/keys/k/history"):
        assert err(carol.get(path)) == (403, "forbidden"), path
    assert digest(db) == before
    assert carol.post("/v1/scopes/thread/t-1/restore", json={"at": then}).json() == {"restored": 1}
    assert db.scope("thread", "t-1").get_versioned("k") == (1, 3)


def test_restore_puts_a_scope_or_some_keys_back(served):
    db, _app, client = served
    s = db.scope("app", "a")
    s.put("x", 1)
    s.append("l", [1, 2])
    then = db.last_change()
    s.put("x", 2)
    s.append("l", [3])
    s.put("new", 1)
    c = client()
    assert c.post("/v1/scopes/app/a/restore", json={"at": then, "keys": ["x"]}).json() == {"restored": 1}
    assert (s.get("x"), s.get("l"), s.get("new")) == (1, [1, 2, 3], 1)
    head = db.last_change()
    assert c.post("/v1/scopes/app/a/restore", json={"at": then}).json() == {"restored": 2}
    assert (s.get("x"), s.get("l"), s.list()) == (1, [1, 2], ["l", "x"])
    assert [(ch.op, ch.key) for ch in db.changes(head)] == [("put", "l"), ("delete", "new")]
    for body in ({}, {"at": -1}, {"at": "1"}, {"at": then, "keys": "x"}, {"at": then, "keys": ["bad key"]},
                 {"at": then, "extra": 1}):
        assert err(c.post("/v1/scopes/app/a/restore", json=body)) in (
            (400, "invalid_value"), (400, "invalid_key")), body


def test_a_fork_is_a_new_session_of_the_caller_with_the_state_then(served):
    db, _app, client = served
    sid = db.sessions.create(ALICE, metadata={"m": 1}).id
    st = db.sessions.state(sid, ALICE)
    st.append("history", [1, 2])
    then = db.last_change()
    st.append("history", [3])
    alice = client("alice")
    r = alice.post(f"/v1/sessions/{sid}/fork", json={"at": then})
    assert r.status_code == 201 and r.json()["owner"] == "alice" and r.json()["metadata"] == {"m": 1}
    new = r.json()["id"]
    assert new != sid
    assert alice.get(f"/v1/sessions/{new}/state/keys/history").json()["value"] == [1, 2]
    assert alice.get(f"/v1/sessions/{new}/turns").json()["turns"] == []
    now = alice.post(f"/v1/sessions/{sid}/fork", json={"metadata": {"m": 2}}).json()
    assert now["metadata"] == {"m": 2}
    assert alice.get(f"/v1/sessions/{now['id']}/state/keys/history").json()["value"] == [1, 2, 3]
    alice.post(f"/v1/sessions/{new}/state/keys/history/append", json={"items": [9]})
    assert st.get("history") == [1, 2, 3]
    assert err(alice.post(f"/v1/sessions/{sid}/fork", json={"at": db.last_change() + 1})) \
        == (400, "invalid_value")
    assert err(alice.post(f"/v1/sessions/{sid}/fork", json={"metadata": []})) == (400, "invalid_value")
    assert err(alice.post("/v1/sessions/s-nope/fork", json={})) == (404, "not_found")


def test_the_diff_pages_and_filters_in_the_store(served, monkeypatch):
    """The diff comes a page at a time (limit, next), every key exactly once across the
    pages; what a caller may not read is left out by the store's own query: the past of
    3,000 keys it may not read is never read for it (one page of a big diff cost the
    whole store's)."""
    from agentstate.backends import past

    db, _app, client = served
    since = db.last_change()
    with db.batch() as b:
        for i in range(3000):
            b.scope("thread", "t-2").put(f"k{i:04}", i)
    for i in range(5):
        db.scope("thread", "t-1").put(f"k{i}", i)
    got, after = [], None
    while True:
        params = {"since": since, "limit": 700, **({"after": after} if after else {})}
        page = client("ops").get("/v1/diff", params=params).json()
        assert len(page["diffs"]) <= 700
        got += [(d["scope_id"], d["key"]) for d in page["diffs"]]
        after = page["next"]
        if after is None:
            break
    assert len(got) == len(set(got)) == 3005 and got == sorted(got)
    assert len(db.diff(since)) == 3005 and len(db.diff(since, limit=7)) == 7
    assert db.diff(since, after=("thread", "t-2", "k2998")) == db.diff(since)[-1:]
    reads = []
    real = past.state
    monkeypatch.setattr(past, "state", lambda *a: reads.append(1) or real(*a))
    page = client("carol").get("/v1/diff", params={"since": since}).json()
    assert [d["key"] for d in page["diffs"]] == [f"k{i}" for i in range(5)]
    assert len(reads) == 10 and page["next"] is None  # before and after of 5 keys
    assert client("carol").get("/v1/diff", params={"since": since, "after": "x/y"}).status_code == 400
