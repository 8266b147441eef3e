"""The pages' sign-ins kept in the store (SPEC §15): two servers of one store (two apps, each
with its own Database, as two processes would have) know the same sign-ins; the store keeps
only a hash; a sign-in ends at sign-out through either, with its token (revoked or expired),
and when it lapses; CSRF works across servers. (tests/test_several_servers.py does it with
real processes.)"""

from __future__ import annotations

import re
import time

import httpx
import pytest

import agentstate
from agentstate.backends.local import digest as hash_of
from agentstate.server import create_app

from .conftest import RawSQL, target
from .test_server import _Sync
from .test_ui import held_turn


@pytest.fixture
def two(any_db):
    """(db, app over db, app over a second Database of the same store, tokens)."""
    db = any_db
    other = agentstate.open(target(db))
    tok = {"alice": db.tokens.create("alice"), "bob": db.tokens.create("bob")}
    yield db, create_app(db), create_app(other), tok
    other.close()


def page(app, cookie=None):
    c = httpx.Client(transport=_Sync(app), base_url="http://t", follow_redirects=False)
    if cookie is not None:
        c.cookies.set(app.state.api.cookie, cookie, path="/ui")
    return c


def sign_in(app, token) -> str:
    r = page(app).post("/ui/login", data={"token": token, "next": "/ui"})
    assert r.status_code == 303 and r.headers["location"] == "/ui"
    return r.cookies[app.state.api.cookie]


def signed_out_within(app, cookie, seconds=10.0) -> float:
    """Seconds until ``cookie`` no longer opens a page of ``app`` (fails after ``seconds``)."""
    start = time.monotonic()
    while page(app, cookie).get("/ui").status_code == 200:
        assert time.monotonic() - start < seconds, "still signed in"
        time.sleep(0.05)
    return time.monotonic() - start


def test_a_sign_in_through_one_server_is_a_sign_in_on_another(two):
    """The cookie one server gave opens the other's pages, and the CSRF token of a page one
    server showed is accepted by the other (a turn decided through it)."""
    db, app1, app2, tok = two
    _s, t = held_turn(db, "alice")
    cookie = sign_in(app1, tok["alice"])
    assert page(app2, cookie).get("/ui").status_code == 200
    shown = page(app1, cookie).get(f"/ui/turns/{t.id}").text
    csrf = re.search(r'name="csrf" value="([^"]+)"', shown).group(1)
    r = page(app2, cookie).post(f"/ui/turns/{t.id}/decide", data={"csrf": csrf, "decision": "1"},
                                headers={"origin": "http://t"})
    assert r.status_code == 303
    assert db.sessions.get_turn(t.id, agentstate.Principal("alice")).status == "decided"
    # another sign-in's CSRF token is not this one's
    other = sign_in(app2, tok["alice"])
    _s, t2 = held_turn(db, "alice")
    r = page(app2, other).post(f"/ui/turns/{t2.id}/decide", data={"csrf": csrf, "decision": "1"},
                               headers={"origin": "http://t"})
    assert r.status_code == 403


def test_the_store_keeps_a_hash_of_a_sign_in_never_the_id_or_the_token(two):
    """The signin table holds sha256 of the cookie, tied to the token's hash; neither the
    cookie, nor the token, nor the CSRF token is stored."""
    db, app1, _app2, tok = two
    cookie = sign_in(app1, tok["alice"])
    with RawSQL(db) as sql:
        rows = sql.execute("SELECT hash, token FROM signin")
    assert [tuple(r) for r in rows] == [(hash_of(cookie), hash_of(tok["alice"]))]
    assert cookie not in repr(rows) and tok["alice"] not in repr(rows)


def test_signing_out_through_one_server_signs_out_on_all(two):
    """Sign-out deletes the sign-in from the store: the other server's pages go back to the
    sign-in form (within its one-second cache)."""
    db, app1, app2, tok = two
    cookie = sign_in(app1, tok["bob"])
    assert page(app2, cookie).get("/ui").status_code == 200
    csrf = re.search(r'name="csrf" value="([^"]+)"', page(app2, cookie).get("/ui").text).group(1)
    assert page(app2, cookie).post("/ui/logout", data={"csrf": csrf}).status_code == 303
    assert signed_out_within(app1, cookie) < 5


@pytest.mark.parametrize("form, headers", [({"csrf": "x"}, {}), ({}, {}),
                                           (None, {"origin": "https://elsewhere.example"})],
                         ids=["wrong-csrf", "no-csrf", "other-origin"])
def test_a_sign_out_always_ends_the_sign_in(two, form, headers):
    """Hostile review: a sign-out whose form failed its CSRF or origin check answered as a
    sign-out (303, cookie dropped) but left the sign-in live in the store, usable for 12
    hours by whoever kept the cookie. A sign-out now always ends it, on every server."""
    db, app1, app2, tok = two
    cookie = sign_in(app1, tok["bob"])
    if form is None:
        csrf = re.search(r'name="csrf" value="([^"]+)"', page(app1, cookie).get("/ui").text).group(1)
        form = {"csrf": csrf}
    r = page(app1, cookie).post("/ui/logout", data=form, headers=headers)
    assert r.status_code == 303
    assert signed_out_within(app1, cookie) < 5 and signed_out_within(app2, cookie) < 5


@pytest.mark.parametrize("how", ["revoked", "expired", "lapsed"])
def test_a_sign_in_ends_with_its_token_or_its_own_end(two, how):
    """A revoked token's sign-ins are deleted with it; an expired token's, or a sign-in past
    its own end, are no longer found: both servers sign the page out."""
    db, app1, app2, tok = two
    cookie = sign_in(app1, tok["bob"])
    keep = sign_in(app1, tok["alice"])
    assert page(app2, cookie).get("/ui").status_code == 200
    with RawSQL(db) as sql:
        past = "now() - interval '1 second'" if sql.pg else str(time.time() - 1)
        if how == "revoked":
            assert db.tokens.revoke("bob") == 1
            assert sql.execute("SELECT count(*) FROM signin WHERE hash = ?",
                               (hash_of(cookie),))[0][0] == 0
        elif how == "expired":
            sql.execute(f"UPDATE token SET expires_at = {past} WHERE hash = ?", (hash_of(tok["bob"]),))
        else:
            sql.execute(f"UPDATE signin SET expires_at = {past} WHERE hash = ?", (hash_of(cookie),))
    for app in (app1, app2):
        assert signed_out_within(app, cookie) < 5
    assert page(app2, keep).get("/ui").status_code == 200  # alice's sign-in stands


def test_an_expired_token_cannot_sign_in(two):
    """Signing in with a token past its end is refused as with an unknown token."""
    db, app1, _app2, _tok = two
    t = db.tokens.create("carol", expires=3600)
    with RawSQL(db) as sql:
        past = "now() - interval '1 second'" if sql.pg else str(time.time() - 1)
        sql.execute(f"UPDATE token SET expires_at = {past} WHERE hash = ?", (hash_of(t),))
    r = page(app1).post("/ui/login", data={"token": t, "next": "/ui"})
    assert app1.state.api.cookie not in r.cookies
    with RawSQL(db) as sql:
        assert sql.execute("SELECT count(*) FROM signin")[0][0] == 0


def test_two_stores_on_one_host_keep_their_own_sign_ins(two, tmp_path):
    """The sign-in cookie's name carries the store's id (SPEC §16): two stores served on
    one host (cookies ignore the port) neither share nor clobber a sign-in — a browser keeps
    both and each store finds its own; the servers of one store name it alike."""
    db, app1, app2, tok = two
    assert app1.state.api.cookie == app2.state.api.cookie  # one store, every server
    with agentstate.open(str(tmp_path / "other.db")) as other:
        app3 = create_app(other)
        assert app3.state.api.cookie != app1.state.api.cookie
        jar = {app1.state.api.cookie: sign_in(app1, tok["alice"])}

        def browse(app):  # one browser on one host: every cookie it holds, sent to each
            return httpx.Client(transport=_Sync(app), base_url="http://t", cookies=jar,
                                follow_redirects=False).get("/ui")

        assert browse(app3).status_code == 303  # not signed in to the other store
        jar[app3.state.api.cookie] = sign_in(app3, other.tokens.create("carol"))
        assert len(jar) == 2  # both kept
        assert "alice" in browse(app1).text and "carol" in browse(app3).text
