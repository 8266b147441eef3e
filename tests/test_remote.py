"""The behavioural tests of SPEC §2–§5, §9 and §10, run again through ``agentstate.connect()``.

The same test functions, imported from their modules, with one fixture changed:
``db`` is a remote Database talking HTTP to a real server (uvicorn on a
loopback port, started per test over a fresh file at ``db_path``). The server
holds an admin token for "ops", the admin principal of the tests; other
principals are named per call in X-Agentstate-Principal. Tests that reach
into the local file's connection (``db._store``) or open their own database
are left out below, each with its reason.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn

import agentstate
import agentstate.backends.sqlite.schema
from agentstate import Principal
from agentstate.server import create_app

from .test_expiry import *  # noqa: F403
from .test_feed import *  # noqa: F403
from .test_fence import *  # noqa: F403
from .test_history import *  # noqa: F403
from .test_once import *  # noqa: F403
from .test_parity import *  # noqa: F403
from .test_past import *  # noqa: F403
from .test_pop_async_batch import *  # noqa: F403
from .test_reads import *  # noqa: F403
from .test_runs import *  # noqa: F403
from .test_scope import *  # noqa: F403
from .test_sessions import *  # noqa: F403

# Left out: what only makes sense in the process that holds the file.
LEFT_OUT = {
    # reach into the local connection (db._store) or the file's SQL directly
    "test_delete_removes_list_items", "test_put_over_list_replaces_items", "test_append_is_o1",
    "test_delete_cascades", "test_read_is_consistent_while_writing", "test_delete_session",
    "test_integrity", "test_check_finds_a_hole_made_by_hand", "test_delete",
    "test_write_entries_and_tail_cost_does_not_grow_with_history", "test_list_does_not_read_histories",
    "test_put_replaces_a_list_and_its_items", "test_append_is_flat_in_storage",
    "test_delete_removes_session_turns_and_state",
    # open databases of their own (hypothesis examples, processes): already run locally
    "test_setting_values", "test_bad_ttls_are_refused_and_change_nothing",
    "test_pop_matches_a_python_list", "test_a_polling_reader_never_sees_a_lower_seq_appear",
    "test_a_list_written_between_a_page_and_its_items_reads_as_one_state",
    # transaction() cannot span HTTP calls (remote transactions: test_server.py)
    "test_transaction_rows_are_consecutive_and_rollback_leaves_none",
    "test_watch_inside_a_transaction_is_a_usage_error", "test_transaction_groups_writes_across_scopes",
    "test_refused_call_inside_transaction_keeps_earlier_writes", "test_nested_transactions",
    "test_a_check_in_a_transaction_holds_its_key_until_the_end",
    "test_a_batch_of_checks_only_is_a_read_that_waits_for_no_writer",  # holds the file's lock
    # the local purge and vacuum run where the file is
    "test_expired_rows_are_purged_as_writes_happen", "test_vacuum_purges_everything_expired",
    # the command works on a file or a server URL, not on an HTTP URL
    "test_command_changes_and_follow", "test_command_prune_trim_settings",
    "test_an_expired_key_is_absent_to_every_reader",
    # fenced writes inside transaction(), snapshot(): blocks that cannot span HTTP calls
    "test_a_fenced_write_fails_its_whole_transaction", "test_a_snapshot_sees_one_state",
    "test_a_caught_lease_lost_still_dooms_its_transaction",
    "test_writes_inside_a_snapshot_are_usage_errors", "test_remote_snapshot_is_a_usage_error",
    # SQLite's instruction counter, on a file of its own
    "test_once_lookup_costs_the_same_at_any_run_length",
    # asyncio timing of the local worker threads (the remote twins are the same code)
    "test_async_twins_never_block_the_event_loop",
    "test_awatch_from_another_process_without_blocking_the_loop",
}
for _name in [n for n in list(globals()) if n in LEFT_OUT or n.startswith("Test")
              or n.endswith("_model") or n.endswith("Model")]:
    del globals()[_name]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Server(uvicorn.Server):
    """uvicorn's server, stopped at once: its own loop looks at should_exit every 0.1 s
    (with the 0.1 s its shutdown sleeps, most of a test's time here: 195 tests)."""

    async def main_loop(self) -> None:
        self.stopping, self.loop = asyncio.Event(), asyncio.get_running_loop()
        await self.stopping.wait()

    def stop(self) -> None:
        self.should_exit = True
        if hasattr(self, "loop"):
            self.loop.call_soon_threadsafe(self.stopping.set)


@pytest.fixture
def db(db_path):
    local = agentstate.open(db_path)
    token = local.tokens.create("ops", admin=True)
    port = _free_port()
    server = _Server(uvicorn.Config(create_app(local), host="127.0.0.1", port=port,
                                    log_level="error", access_log=False, lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    remote = agentstate.connect(f"http://127.0.0.1:{port}", token=token)
    remote.served = local  # what conftest's digest(), target() and RawSQL() look at
    remote.callworker_target = f"http://127.0.0.1:{port}#{token}"  # tests/callworkers.py
    yield remote
    remote.close()
    server.stop()

    def close() -> None:  # uvicorn's shutdown sleeps 0.1 s: the next test need not wait
        thread.join(30)
        local.close()

    threading.Thread(target=close, daemon=True).start()


def test_the_fixture_is_remote(db):
    assert db.path.startswith("http://127.0.0.1:") and db.durability == "server"
    assert db.check() == [] and db.info()["schema_version"] == agentstate.backends.sqlite.schema.SCHEMA_VERSION  # admins ask the server
    for local_only in (lambda: db.backup("x.db"), db.vacuum, lambda: db.tokens.create("x"),
                       db.tokens.create_first_admin):
        with pytest.raises(agentstate.UsageError):
            local_only()


def test_sql_through_the_remote_client_is_a_usage_error(db):
    """db.sql() is for local stores: through connect() it is refused, and nothing is sent."""
    db.scope("app", "a").put("k", 1)
    for query in ("SELECT 1", "DELETE FROM kv"):
        with pytest.raises(agentstate.UsageError, match="local stores"):
            db.sql(query)
    assert db.scope("app", "a").get("k") == 1


def test_open_refuses_an_http_url(tmp_path, monkeypatch):
    """A URL is never taken for a file name: open() of an http URL says to use connect()."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(agentstate.UsageError, match="connect"):
        agentstate.open("http://127.0.0.1:8765")
    assert list(tmp_path.iterdir()) == []


def test_a_client_s_threads_take_turns_updating_one_key(db, monkeypatch):
    """8 threads of one client increment one key: each update's function runs once,
    with no compare-and-set lost to a sibling thread and retried (19 s for 800 before).
    (TURN_WAIT made long: on a loaded machine 7 updates ahead may take over a second.)"""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    s = db.scope("agent", "a")
    assert increment_from_threads(s, 8, 25) == 200  # noqa: F405 (test_scope's helper)
    assert s.get_versioned("n") == (200, 200)


def test_an_unrelated_key_never_waits_for_a_client_s_slow_update(db, monkeypatch):
    """A thread's slow update() (an LLM call in its function) holds its key's turn only:
    another thread's update of another key goes at once. (Striped over 64 locks, a key
    whose hash shared the slow one's stripe waited for it; this test uses such a key.)"""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    s = db.scope("agent", "slow")
    other = next(f"counter{i}" for i in range(100_000)
                 if hash(("agent", "slow", f"counter{i}")) % 64 == hash(("agent", "slow", "summary")) % 64)
    started = threading.Event()

    def summarise(text):
        started.set()
        time.sleep(2)
        return "summary"

    slow = threading.Thread(target=s.update, args=("summary", summarise), kwargs={"default": ""})
    slow.start()
    assert started.wait(10)
    t0 = time.monotonic()
    s.update(other, lambda n: n + 1, default=0)
    took = time.monotonic() - t0
    slow.join(30)
    assert took < 1.5 and s.get(other) == 1 and s.get("summary") == "summary"


def test_updates_nested_across_keys_never_wait_for_each_other(db, monkeypatch):
    """Thread A updates x and, inside, y; thread B updates y and, inside, x. Both hold
    their outer key's turn when they reach the inner update: neither may wait for the
    other's turn, and no increment is lost. (TURN_WAIT made longer than the test's wait:
    the bound on a turn must not be what saves this case.)"""
    monkeypatch.setattr(agentstate._turns, "TURN_WAIT", 120.0)
    s = db.scope("agent", "a")
    both_inside = threading.Barrier(2)
    errors, runs = [], {"x": 0, "y": 0}

    def crossing(outer, inner):
        def fn(n):
            runs[outer] += 1
            if runs[outer] == 1:  # the function runs again if its write lost a race
                both_inside.wait(10)
            s.update(inner, lambda m: m + 1, default=0)
            return n + 1

        def work():
            try:
                s.update(outer, fn, default=0)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)
        return threading.Thread(target=work, daemon=True)

    threads = [crossing("x", "y"), crossing("y", "x")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "two updates waited for each other"
    assert errors == []
    # each key: its outer update once, and the other's inner one once per run of its function
    assert (s.get("x"), s.get("y")) == (1 + runs["y"], 1 + runs["x"])


def test_an_update_whose_function_waits_for_another_thread_s_update_does_not_hang(db):
    """update()'s function hands an update of the same key to another thread and waits
    for it: that thread cannot have the key's turn, so it goes without after a second
    (before, it waited for ever and so did the first). Both increments land."""
    s = db.scope("agent", "a")
    inner: list[str] = []

    def fn(n):
        if not inner:  # the first run only: the function runs again after a lost race
            inner.append("started")
            t = threading.Thread(target=lambda: (s.update("x", lambda m: m + 1, default=0),
                                                 inner.append("done")))
            t.start()
            t.join(10)
        return n + 1

    began = time.monotonic()
    assert s.update("x", fn, default=0) == 2
    assert inner == ["started", "done"] and time.monotonic() - began < 8


def test_a_get_is_one_request_and_bytes_that_are_not_json_one_more(db, monkeypatch):
    """A get is one request; only stored bytes that the server will not parse are fetched
    again, as bytes, to raise the local json.JSONDecodeError (SPEC §2, §5)."""
    import json

    s = db.scope("thread", "t")
    s.put("j", {"a": 1})
    s.put_bytes("b", b"not json")
    sent = []
    request = db._ops._http.request
    monkeypatch.setattr(db._ops._http, "request",
                        lambda method, path, **kw: sent.append((method, path)) or request(method, path, **kw))
    assert s.get("j") == {"a": 1} and s.get_versioned("absent") == (None, 0)
    assert len(sent) == 2
    with pytest.raises(json.JSONDecodeError):
        s.get("b")
    assert len(sent) == 4


def _connect_as(db, name, admin=False):
    """Another client of the same server, with a token of its own."""
    return agentstate.connect(db.path, token=db.served.tokens.create(name, admin=admin))


def _answer(call):
    """What a session call answered, comparable between the remote and the local API."""
    try:
        r = call()
    except agentstate.AgentStateError as e:
        return type(e)
    if isinstance(r, list):
        return [x.id for x in r]
    return r.list() if isinstance(r, agentstate.Scope) else r.id


SESSION_READS = {
    "get": lambda d, s, t, p: d.sessions.get(s, p),
    "list": lambda d, s, t, p: d.sessions.list(p),
    "turns": lambda d, s, t, p: d.sessions.turns(s, p),
    "get_turn": lambda d, s, t, p: d.sessions.get_turn(t, p),
    "turns_by_status": lambda d, s, t, p: d.sessions.turns_by_status(p),
    "state": lambda d, s, t, p: d.sessions.state(s, p),
}


def test_a_session_call_acts_for_the_principal_it_names(db):
    """SPEC §4 and §12: a remote session call acts for the Principal it is given, as the
    local API does (naming it in X-Agentstate-Principal, which an admin token may do for
    any non-admin name, its own included), or is refused with Forbidden; it never answers
    as someone else. (svc's admin token read alice's session for Principal("svc"), and
    listed nothing for Principal("ops", admin=True), acting as a plain "ops".)"""
    local = db.served
    s = db.sessions.create(Principal("alice"))
    t = db.sessions.start_turn(s.id, Principal("alice"))
    db.sessions.state(s.id, Principal("alice")).put("k", 1)
    local.sessions.create(Principal("svc"))
    svc, alice = _connect_as(db, "svc", admin=True), _connect_as(db, "alice")
    acts = {  # client -> principals it acts for, as locally
        db: [Principal("ops", admin=True), Principal("ops"), Principal("alice"), Principal("svc")],
        svc: [Principal("svc", admin=True), Principal("svc"), Principal("alice"), Principal("bob")],
        alice: [Principal("alice")],
    }
    refused = {  # client -> principals it may not act for: Forbidden, whatever the call
        db: [Principal("svc", admin=True)],
        svc: [Principal("ops", admin=True), Principal("alice", admin=True)],
        alice: [Principal("alice", admin=True), Principal("ops", admin=True), Principal("bob"),
                Principal("svc")],
    }
    try:
        for client, principals in acts.items():
            for p in principals:
                for name, call in SESSION_READS.items():
                    want = _answer(lambda: call(local, s.id, t.id, p))
                    assert _answer(lambda: call(client, s.id, t.id, p)) == want, (name, p)
        for client, principals in refused.items():
            for p in principals:
                for name, call in SESSION_READS.items():
                    assert _answer(lambda: call(client, s.id, t.id, p)) is agentstate.Forbidden, (name, p)
        # writes: as the principal named, or refused
        assert svc.sessions.create(Principal("svc")).owner == "svc"
        assert svc.sessions.create(Principal("carol")).owner == "carol"
        with pytest.raises(agentstate.Forbidden):
            alice.sessions.create(Principal("bob"))
        with pytest.raises(agentstate.NotFound):  # svc without admin rights: not its session
            svc.sessions.release(s.id, Principal("svc"))
        with pytest.raises(agentstate.Forbidden):
            svc.sessions.prune(Principal("ops", admin=True), idle_for=0)
        as_alice = svc.sessions.get_turn(t.id, Principal("alice"))
        assert as_alice.heartbeat(30).lease == 30  # a turn acts for the principal that got it
        with pytest.raises(agentstate.NotFound):
            svc.sessions.decide(t.id, Principal("svc"), "yes")
        assert svc.sessions.release(s.id, Principal("svc", admin=True)).status == "failed"
    finally:
        svc.close()
        alice.close()


def test_an_admin_token_naming_itself_acts_without_its_admin_rights(db):
    """SPEC §12: X-Agentstate-Principal names a principal without admin rights, even the
    admin token's own name; without the header the token acts as itself (an admin)."""
    import httpx

    other = db.served.sessions.create(Principal("alice"))
    token = db.served.tokens.create("svc", admin=True)
    with httpx.Client(base_url=db.path, headers={"authorization": f"Bearer {token}"}) as http:
        assert [x["id"] for x in http.get("/v1/sessions").json()["sessions"]] == [other.id]
        assert http.get("/v1/sessions", headers={"x-agentstate-principal": "svc"}).json()["sessions"] == []
        r = http.get(f"/v1/sessions/{other.id}", headers={"x-agentstate-principal": "svc"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert http.get("/v1/whoami").json() == {"name": "svc", "admin": True, "grants": None}
        assert http.get("/v1/whoami", headers={"x-agentstate-principal": "svc"}).json() == \
            {"name": "svc", "admin": False, "grants": None}


@pytest.mark.parametrize("how", ["watch", "awatch"])
def test_a_watch_goes_on_from_where_the_server_read(db, monkeypatch, how):
    """SPEC §9: a watch waits past changes it may not see (here another principal's
    session) from the ``last`` seq the server read, as the local watch goes on from the
    head; it asked again from its first cursor, which the feed no longer had (here: the
    feed turned off after the first poll), and raised CursorExpired."""
    monkeypatch.setattr(agentstate.backends.remote, "LONG_POLL", 0.2)
    alice = _connect_as(db, "alice")
    since = db.last_change()
    bob = db.sessions.create(Principal("bob"))  # changes alice may not see
    db.sessions.state(bob.id, Principal("bob")).put("k", 1)
    first_poll_done, feed_off, second_poll_done = (threading.Event() for _ in range(3))
    polls = []

    def after_a_poll():
        polls.append(1)
        if len(polls) == 1:
            first_poll_done.set()
            assert feed_off.wait(30)
        elif len(polls) == 2:
            second_poll_done.set()

    if how == "watch":
        call = alice._ops._call

        def hooked(method, path, **kw):
            try:
                return call(method, path, **kw)
            finally:
                if path == "/v1/changes":
                    after_a_poll()

        monkeypatch.setattr(alice._ops, "_call", hooked)
        run = lambda: alice.watch(since, timeout=60)  # noqa: E731
    else:
        poll = alice._ops._apoll

        async def ahooked(http, params):
            try:
                return await poll(http, params)
            finally:
                await asyncio.to_thread(after_a_poll)

        monkeypatch.setattr(alice._ops, "_apoll", ahooked)

        async def first():
            async for change in alice.awatch(since):
                return [change]

        run = lambda: asyncio.run(asyncio.wait_for(first(), 60))  # noqa: E731
    got: list = []
    watcher = threading.Thread(target=lambda: got.append(_answer_or_error(run)), daemon=True)
    watcher.start()
    try:
        assert first_poll_done.wait(30)
        db.set_setting("feed_retention", 0)  # only the head is a valid cursor now
        feed_off.set()
        assert second_poll_done.wait(30)
        db.set_setting("feed_retention", 3600)
        alice.scope("app", "a").put("k", 1)  # a change alice sees ends the watch
        watcher.join(60)
    finally:
        feed_off.set()
        alice.close()
    assert [(c.topic, c.scope_id, c.key) if isinstance(c, agentstate.Change) else c
            for c in got[0]] == [("kv", "a", "k")]


def _answer_or_error(call):
    try:
        return call()
    except Exception as e:  # reported by the assertion on the answer
        return [e]


@pytest.mark.parametrize("answer", [
    {"status_code": 502, "text": "<html>Bad Gateway</html>"},  # a proxy in between
    {"status_code": 500, "json": {"error": {"code": "error", "message": "internal error"}}},
])
def test_a_write_answered_by_no_store_error_may_have_been_done(db, monkeypatch, answer):
    """SPEC §6: a write whose answer is a 5xx that is not one of the store's refusals (a
    proxy, a server crash) is a StorageError with outcome_unknown: it may have been done
    (it was a StorageError or an AgentStateError that read as nothing written)."""
    import httpx

    request = db._ops._http.request

    def failing(method, path, **kw):
        if method == "GET":
            return request(method, path, **kw)
        return httpx.Response(**answer, request=httpx.Request(method, db.path + path))

    monkeypatch.setattr(db._ops._http, "request", failing)
    s = db.scope("app", "a")
    for write in (lambda: s.put("k", 1), lambda: s.append("l", [1]), lambda: s.delete("k"),
                  lambda: db.sessions.create(Principal("ops", admin=True))):
        with pytest.raises(agentstate.StorageError) as e:
            write()
        assert e.value.outcome_unknown is True
    monkeypatch.setattr(db._ops._http, "request", lambda method, path, **kw: httpx.Response(
        **answer, request=httpx.Request(method, db.path + path)))
    with pytest.raises(agentstate.AgentStateError) as e:
        s.get("k")
    assert getattr(e.value, "outcome_unknown", False) is False  # a read changes nothing


def test_changes_pages_past_what_the_token_may_not_see(db):
    """A page of changes() skips changes the token may not see (another principal's
    session) without coming back empty while visible ones follow: the client asks on
    from the server's ``last``."""
    alice = _connect_as(db, "alice")
    since = db.last_change()
    bob = db.sessions.create(Principal("bob"))
    for i in range(12):  # a page's worth of changes alice may not see
        db.sessions.state(bob.id, Principal("bob")).put(f"k{i}", i)
    db.scope("app", "shared").put("seen", 1)
    got = alice.changes(since, limit=5)
    assert [(c.kind, c.key) for c in got] == [("app", "seen")]
    assert alice.changes(got[-1].seq, limit=5) == []


def test_raw_entries_are_the_stored_text_however_it_was_written(db):
    """entries(raw=True) through the client gives the text the store holds, as locally, also
    for an entry sent in a spelling of its own (the store writes every entry's text itself,
    so decoding and encoding it again in the client gives that same text)."""
    db.runs.write("r", [], None, create=True)
    db.served.runs.write("r", [{"seq": 0, "n": 1e2, "s": "é", "big": 2**62}], None)
    local = db.served.runs.entries("r", raw=True)
    assert db.runs.entries("r", raw=True) == local
    assert db.runs.entries("r", 0, 1, raw=True) == local and db.runs.entries("r") == [
        {"seq": 0, "n": 100.0, "s": "é", "big": 2**62}]
    http = db._ops._http
    body = b'{"entries": [{"seq": 1, "n": 1E2, "s": "\\u00e9"}], "snapshot": null}'
    assert http.post("/v1/runs/r/write", content=body).status_code == 200
    local = db.served.runs.entries("r", 1, raw=True)
    assert db.runs.entries("r", 1, raw=True) == local
    assert db.runs.tail("r", 1) == db.served.runs.tail("r", 1)


@pytest.mark.parametrize("token", ["a\nb" + "x" * 30, "secret token", "sécret", "tok\x01en", " "])
def test_connect_refuses_a_token_no_header_can_carry_without_repeating_it(token):
    """A token with a line break, a space inside, a non-ASCII or control character is
    Unauthorized at connect(), before anything is sent, and the error does not repeat it."""
    with pytest.raises(agentstate.Unauthorized) as e:
        agentstate.connect("http://127.0.0.1:1", token=token)
    assert token.strip() not in str(e.value) or not token.strip()


@pytest.mark.parametrize("url", ["http://user:pa55word@127.0.0.1:8765", "http://user@127.0.0.1:8765",
                                 "http://127.0.0.1:8765/?x=1", "http://127.0.0.1:8765#f",
                                 "ftp://127.0.0.1", "http://", "127.0.0.1:8765"])
def test_connect_refuses_a_url_with_credentials_or_a_query_without_repeating_a_password(url):
    """A URL with user:password (which would be kept in db.path and in every error), a query
    or a fragment, or no http(s) server, is InvalidValue at connect()."""
    with pytest.raises(agentstate.InvalidValue) as e:
        agentstate.connect(url, token="t" * 20)
    assert "pa55word" not in str(e.value)


def test_a_redirect_is_never_followed_and_a_write_is_not_taken_for_done(db, monkeypatch):
    """An agentstate server never redirects: a 3xx answer (a proxy, a wrong URL) is a
    StorageError naming only the other origin, the write not taken for done (a 303 turned a
    PUT into a GET whose answer looked like success) and nothing sent to the other host."""
    import http.server

    hits = []

    class Other(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.headers.get("authorization"))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"version": 42, "value": 1}')

        do_PUT = do_POST = do_GET
        def log_message(self, *a): pass

    class Redirect(http.server.BaseHTTPRequestHandler):
        def _go(self):
            self.send_response(self.server.code)
            self.send_header("location", f"http://u:pw@127.0.0.1:{other.server_port}/steal?t=1")
            self.send_header("content-length", "0")
            self.end_headers()

        do_GET = do_PUT = do_POST = _go
        def log_message(self, *a): pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Other)
    redirect = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    for s in (other, redirect):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        for code in (301, 302, 303, 307, 308):
            redirect.code = code
            r = agentstate.connect(f"http://127.0.0.1:{redirect.server_port}", token="t" * 20)
            for call in (lambda: r.scope("app", "a").put("k", 1), lambda: r.scope("app", "a").get("k")):
                with pytest.raises(agentstate.StorageError) as e:
                    call()
                assert not e.value.outcome_unknown and str(code) in str(e.value)
                assert "pw" not in str(e.value) and "steal" not in str(e.value)
            r.close()
    finally:
        for s in (other, redirect):
            s.shutdown()
    assert hits == []


def test_a_token_with_grants_reads_the_past_of_what_its_rules_cover(db):
    """db.as_of() through a token with grants: its check of the seq needs no scope the token
    may not read (it read the keys of app:- and was 403 for every past read), and a past
    read outside the grants is Forbidden."""
    s = db.scope("user", "u-1")
    s.put("k", 1)
    then = db.last_change()
    s.put("k", 2)
    db.scope("user", "u-2").put("k", 1)
    carol = agentstate.connect(db.path, token=db.served.tokens.create("carol", grants=["user:u-1=r"]))
    with carol.as_of(then) as past:
        assert past.scope("user", "u-1").get("k") == 1
        with pytest.raises(agentstate.Forbidden):
            past.scope("user", "u-2").get("k")
    with pytest.raises(agentstate.InvalidValue):
        with carol.as_of(db.last_change() + 1):
            pass
    assert [d.key for d in carol.diff(then)] == ["k"]  # u-1's only
    assert [r.value for r in carol.scope("user", "u-1").history("k")] == [2, 1]
    with pytest.raises(agentstate.Forbidden):
        carol.scope("user", "u-1").restore(then)


def test_a_long_history_comes_back_whole_across_the_server_s_pages(db):
    """The server's history pages end at a byte budget (and at most history_page
    revisions); the client follows ``next`` until the end, or up to its limit."""
    from agentstate.server._limits import LIMITS

    s = db.scope("agent", "a")
    for i in range(30):
        s.append("log", [i])
    with LIMITS.override(history_bytes=40, history_page=7):
        revs = s.history("log")
        assert [len(r.value) for r in revs] == list(range(30, 0, -1))
        assert [len(r.value) for r in s.history("log", limit=9)] == list(range(30, 21, -1))
        assert s.history("log", before=revs[-3].seq) == revs[-2:]
