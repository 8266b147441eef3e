"""Review of the past over HTTP and MCP (SPEC §17, §12, §15, §18) as an attacker and as a
careful user: answers bounded in bytes whatever the stored values, a diff followed page by
page is of one moment, fenced writes of the past honoured, refusals that change nothing."""

from __future__ import annotations

import time

import httpx
import pytest

import agentstate
from agentstate.server import create_app
from agentstate.server._limits import LIMITS

from .conftest import digest
from .mcpclient import Reach, call, run
from .test_server import _Sync

ALICE = agentstate.Principal("alice")


@pytest.fixture
def served(any_db):
    db = any_db
    tokens = {"ops": db.tokens.create("ops", admin=True), "alice": db.tokens.create("alice")}
    app = create_app(db)

    def client(name: str = "ops", **headers: str) -> httpx.Client:
        return httpx.Client(transport=_Sync(app), base_url="http://t", headers={
            "authorization": f"Bearer {tokens[name]}", **headers})

    return db, app, client


def _value_bytes(values: list[dict]) -> int:
    return sum(len(str(v["value"])) for v in values)


def test_review_history_a_history_page_keeps_to_its_byte_budget(served):
    """A page "ends early once its values pass history_bytes": it may pass the budget by
    one revision, not by a whole read of 32 (each revision of a list holds the whole list
    of its moment, so 32 of a 4 MiB value were 128 MiB in one answer, and in memory)."""
    db, _app, client = served
    s = db.scope("agent", "a")
    for i in range(40):
        s.put("big", f"{i:02}" + "x" * 998)  # 1,000 characters each
    c = client()
    with LIMITS.override(history_bytes=3_000):
        got, before, pages = [], None, 0
        while True:
            page = c.get("/v1/scopes/agent/a/keys/big/history",
                         params={} if before is None else {"before": before}).json()
            assert _value_bytes(page["revisions"]) < 3_000 + 1_100, (
                f"a page of {len(page['revisions'])} revisions of 1,000 bytes for a budget "
                "of 3,000")
            got += page["revisions"]
            pages += 1
            before = page["next"]
            if before is None:
                break
    assert [r["version"] for r in got] == list(range(40, 0, -1)) and pages >= 10


def test_review_history_a_diff_page_keeps_to_a_byte_budget(served):
    """A diff's page holds each key's value before and after: 1,000 keys (the default
    limit) of 4 MiB values were an 8 GB answer built in the server's memory. It ends early
    past the budget the history's pages keep (history_bytes), and ``next`` goes on from
    there: every key exactly once."""
    db, _app, client = served
    since = db.last_change()
    with db.batch() as b:
        for i in range(30):
            b.scope("app", "wide").put(f"k{i:02}", "x" * 1_000)
    c = client()
    got, after = [], None
    with LIMITS.override(history_bytes=5_000):
        while True:
            page = c.get("/v1/diff", params={"since": since, **({"after": after} if after else {})})
            assert page.status_code == 200, page.text
            page = page.json()
            size = sum(len(str(d["after"]["value"])) for d in page["diffs"])
            assert size < 5_000 + 1_100, f"a diff page of {len(page['diffs'])} keys of 1,000 bytes"
            got += [d["key"] for d in page["diffs"]]
            after = page["next"]
            if after is None:
                break
    assert got == [f"k{i:02}" for i in range(30)]


def test_review_history_a_diff_followed_page_by_page_is_of_one_moment(served, monkeypatch):
    """Without ``until`` a diff is up to the newest change; a caller follows ``next``
    (both clients do). Each page used to be up to the newest change of its own request: a
    batch that wrote a and z together between two pages showed up half (z's new value, a's
    old one), a state the store never had, and a key changed only after the first page
    was listed in a later one. The pages of one diff are of one moment."""
    from agentstate.server.views import past

    monkeypatch.setattr(past, "DIFF_PAGE", 2)
    db, _app, client = served
    s = db.scope("app", "p")
    since = db.last_change()
    for k in ("a", "b", "y", "z"):
        s.put(k, 0)
    c = client()
    first = c.get("/v1/diff", params={"since": since}).json()
    assert [d["key"] for d in first["diffs"]] == ["a", "b"] and first["next"]
    with db.batch() as b:  # one write of two keys, between the pages
        b.scope("app", "p").put("a", 1)
        b.scope("app", "p").put("z", 1)
        b.scope("app", "q").put("new", 1)
    rest = c.get("/v1/diff", params={"since": since, "after": first["next"]}).json()
    after = {d["key"]: d["after"]["value"] for d in first["diffs"] + rest["diffs"]}
    assert after["a"] == after["z"], f"a diff shows a = {after['a']}, z = {after['z']}"
    assert "new" not in after


def _lapsed_turn(db) -> str:
    sid = db.sessions.create(ALICE).id
    turn = db.sessions.start_turn(sid, ALICE, lease=0.05)
    time.sleep(0.2)
    return turn.id


def test_review_history_restore_and_fork_over_http_honour_the_fence(served):
    """X-Agentstate-Fence on restore (the plain scope and the session's own state) and on
    fork: a lapsed turn is 409 lease_lost and nothing is written (SPEC §14, §16)."""
    db, _app, client = served
    sid = db.sessions.create(ALICE).id
    own = db.sessions.state(sid, ALICE)
    s = db.scope("app", "cfg")
    s.put("x", 1)
    own.put("x", 1)
    then = db.last_change()
    s.put("x", 2)
    own.put("x", 2)
    fence = {"x-agentstate-fence": _lapsed_turn(db)}
    before = digest(db)
    c = client("alice", **fence)
    for path, body in (("/v1/scopes/app/cfg/restore", {"at": then}),
                       (f"/v1/sessions/{sid}/state/restore", {"at": then}),
                       (f"/v1/sessions/{sid}/fork", {"at": then})):
        r = c.post(path, json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (409, "lease_lost"), (path, r.text)
    assert digest(db) == before and s.get("x") == 2 and own.get("x") == 2


def test_review_history_refused_restore_bodies_change_nothing(served):
    """Each bad body is the §6 error it should be (400 invalid_value / invalid_key, 413),
    never a framework's 422 or a 500, and writes nothing."""
    db, _app, client = served
    s = db.scope("app", "cfg")
    s.put("x", 1)
    then = db.last_change()
    s.put("x", 2)
    before = digest(db)
    c = client()
    for body, want in (({"at": -1}, "invalid_value"), ({"at": "1"}, "invalid_value"),
                       ({"at": 2**63}, "invalid_value"), ({}, "invalid_value"),
                       ({"at": then, "keys": "x"}, "invalid_value"),
                       ({"at": then, "keys": ["x", "bad key"]}, "invalid_key"),
                       ({"at": then, "keys": [1]}, "invalid_value"),
                       ({"at": then, "extra": 1}, "invalid_value"),
                       ({"at": db.last_change() + 1}, "invalid_value")):
        r = c.post("/v1/scopes/app/cfg/restore", json=body)
        assert (r.status_code, r.json()["error"]["code"]) == (400, want), (body, r.text)
    assert digest(db) == before and s.get("x") == 2


def test_review_history_state_history_keeps_a_model_s_context_bounded(db, tmp_path):
    """state_history's page "ends early once its values pass" 1 MiB (a model reads it):
    by one revision at most, not by the whole first read of up to 32."""
    s = db.scope("user", "u-1")
    for i in range(10):
        s.put("notes", f"{i}" + "n" * 300_000)
    reach = Reach("stdio", db, tmp_path)

    async def go():
        async with reach.client() as c:
            got = await call(c, "state_history", scope="user:u-1", key="notes")
            assert sum(len(r["value"]) for r in got["revisions"]) < 1024 * 1024 + 310_000, (
                f"{len(got['revisions'])} revisions of 300 kB in one answer")
            assert got["next"] is not None

    try:
        run(go())
    finally:
        reach.close()
