"""``agentstate serve --cors-origin ORIGIN`` (SPEC §16): the API answers a listed origin's
preflights and lets its pages read the answers; any other origin, and a server without the
option, gets no CORS header at all. (tests/test_cors_browser.py: the same in a real browser.)
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from click.testing import CliRunner

from agentstate.cli import cli
from agentstate.server import create_app
from agentstate.server._cors import origin

PAGE = "http://127.0.0.1:5173"


def call(app, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> httpx.Response:
    async def go() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://api") as c:
            return await c.request(method, path, headers=headers, content=body)

    return asyncio.run(go())


def cors_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if k.startswith("access-control-")}


@pytest.fixture
def setup(db):
    token = db.tokens.create("page", admin=True)
    return create_app(db, cors_origins=[PAGE + "/"]), create_app(db), token


PREFLIGHT = {"origin": PAGE, "access-control-request-method": "PUT",
             "access-control-request-headers": "authorization,content-type,x-agentstate-fence,x-agentstate-principal"}


def test_a_listed_origins_preflight_is_answered_before_routes_and_tokens(setup):
    """The preflight carries no token: it is answered 204 with the origin, the methods and
    the request headers the clients send."""
    app, _, _ = setup
    r = call(app, "OPTIONS", "/v1/scopes/app/x/keys/k", PREFLIGHT)
    assert r.status_code == 204, r.text
    h = cors_headers(r)
    assert h["access-control-allow-origin"] == PAGE
    assert {m.strip() for m in h["access-control-allow-methods"].split(",")} >= {"GET", "PUT", "POST", "DELETE"}
    assert h["access-control-allow-headers"].split(", ") == [
        "authorization", "content-type", "x-agentstate-fence", "x-agentstate-principal"]
    assert "access-control-allow-credentials" not in h  # the token is a header, never a cookie
    # A header that is not one the clients send is left out: the browser refuses the request.
    r = call(app, "OPTIONS", "/v1/runs", {**PREFLIGHT, "access-control-request-headers": "x-other"})
    assert r.status_code == 204 and "access-control-allow-headers" not in r.headers


def test_a_listed_origin_reads_every_answer_errors_included(setup):
    app, _, token = setup
    auth = {"origin": PAGE, "authorization": f"Bearer {token}"}
    answers = [
        call(app, "PUT", "/v1/scopes/app/x/keys/k", {**auth, "content-type": "application/json"}, b'{"value":1}'),
        call(app, "GET", "/v1/scopes/app/x/keys/k", auth),
        call(app, "GET", "/v1/scopes/app/x/keys/absent", auth),  # 404 not_found
        call(app, "PUT", "/v1/scopes/app/x/keys/k", {**auth, "content-type": "application/json"},
             b'{"value":2,"if_version":0}'),  # 409 version_conflict
        call(app, "GET", "/v1/runs", {"origin": PAGE, "authorization": "Bearer nope"}),  # 401
        call(app, "GET", "/openapi.json", {"origin": PAGE}),
    ]
    assert [r.status_code for r in answers] == [200, 200, 404, 409, 401, 200]
    for r in answers:
        assert r.headers["access-control-allow-origin"] == PAGE, r.request.url
        assert r.headers["access-control-expose-headers"] == "Content-Type, Content-Length"
        assert "origin" in r.headers["vary"].lower()


def test_an_origin_not_listed_and_a_server_without_the_option_send_no_cors_header(setup):
    app, plain, token = setup
    other = {**PREFLIGHT, "origin": "http://127.0.0.1:5174"}
    for a, headers in ((app, other), (plain, PREFLIGHT)):
        pre = call(a, "OPTIONS", "/v1/scopes/app/x/keys/k", headers)
        assert pre.status_code != 204 and cors_headers(pre) == {}, pre.headers
        get = call(a, "GET", "/v1/scopes/app/x/keys/k",
                   {"origin": headers["origin"], "authorization": f"Bearer {token}"})
        assert cors_headers(get) == {}, get.headers
    # The pages at /ui are same-origin by design: no CORS there, whatever the origin.
    assert cors_headers(call(app, "GET", "/ui/login", {"origin": PAGE})) == {}


@pytest.mark.parametrize("given, want", [
    ("http://127.0.0.1:5173", "http://127.0.0.1:5173"), ("http://127.0.0.1:5173/", "http://127.0.0.1:5173"),
    ("HTTPS://App.Example.COM:443", "https://app.example.com"), ("http://h:80", "http://h"),
    ("http://[::1]:8080", "http://[::1]:8080"),
])
def test_an_origin_is_written_as_a_browser_sends_it(given, want):
    assert origin(given) == want


@pytest.mark.parametrize("bad", ["*", "null", "127.0.0.1:5173", "ftp://h", "http://h/app", "http://h?x",
                                 "http://u:p@h", "http://", "http://h:99999"])
def test_serve_refuses_what_is_not_one_exact_origin(tmp_path, bad):
    """A usage error (exit 2) naming the option, before any file is made."""
    path = tmp_path / "s.db"
    r = CliRunner().invoke(cli, ["--db", str(path), "serve", "--cors-origin", bad])
    assert r.exit_code == 2, r.output
    assert "--cors-origin" in r.output and "not an origin" in r.output
    assert not path.exists()
