"""The TypeScript client in a real browser, on a page of another origin (SPEC §16): with
``agentstate serve --cors-origin`` naming the page's origin it works — writes, fenced writes,
errors with their fields, bytes, several subscriptions sharing one stream while calls still
go — and without it the browser refuses the page every answer, so nothing is written.

Debian's headless Chromium driven by Selenium (as tests/test_ui_browser.py), the client as
``npm run build`` makes it (ESM), served by a second loopback server: another origin.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import subprocess
import threading

import pytest

import agentstate

from .serverproc import serve
from . import nodejs
from .test_typescript import PACKAGE
from .test_ui_browser import browser  # noqa: F401  (the fixture: one headless Chromium)

PAGE = """<!doctype html><meta charset="utf-8"><title>agentstate in a page</title>
<script type="module">
import * as agentstate from "/client/index.js";
window.agentstate = agentstate;
document.title = "ready";
</script>"""

# Run in the page (execute_async_script): the client against the API at arguments[0].
SCRIPT = """
const [url, token, done] = arguments;
(async () => {
  const { connect, VersionConflict } = window.agentstate;
  const db = connect(url, { token, timeout: 20 });
  const s = db.scope("app", "browser");
  const out = {};
  out.version = await s.put("k", { from: "page" });
  out.value = await s.get("k");
  const e = await s.put("k", 2, { ifVersion: 0 }).catch((x) => x);
  out.conflict = [e instanceof VersionConflict, e.name, e.currentVersion];
  await s.putBytes("b", new Uint8Array([0, 1, 255]));
  out.bytes = Array.from(await s.getBytes("b"));
  const session = await db.sessions.create();
  const turn = await db.sessions.startTurn(session.id);
  out.fenced = await s.put("f", 1, { fence: turn });  // X-Agentstate-Fence, allowed by the preflight
  // Eight subscriptions (a browser gives a page six connections per host): one stream.
  const head = await db.lastChange();
  const ac = new AbortController();
  const got = Array.from({ length: 8 }, () => []);
  const loops = got.map((seen, i) => (async () => {
    for await (const c of db.subscribe(head, { scopeId: "browser-feed", signal: ac.signal })) {
      seen.push(c.key);
      if (seen.length === 2) return;
    }
  })());
  out.during = await db.scope("app", "browser-feed").put("one", 1);  // a call goes meanwhile
  await db.scope("app", "browser-feed").put("two", 2);
  await Promise.all(loops);
  ac.abort();
  out.subscriptions = got;
  return out;
})().then(done, (e) => done({ error: `${e.name}: ${e.message}`, name: e.name, outcomeUnknown: e.outcomeUnknown }));
"""


@pytest.fixture(scope="module")
def client_dir(tmp_path_factory):
    """The client as the package builds it (dist/, ESM), beside a page that imports it."""
    npm = nodejs.npm("the browser's CORS test")
    nodejs.install(npm, PACKAGE)
    r = subprocess.run([npm, "run", "build"], cwd=PACKAGE, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    site = tmp_path_factory.mktemp("page")
    shutil.copytree(PACKAGE / "dist", site / "client")
    (site / "index.html").write_text(PAGE)
    return site


@pytest.fixture(scope="module")
def page(client_dir):
    """The page's own origin: a second loopback server."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(client_dir))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def run_page(driver, page: str, api: str, token: str) -> dict:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(page + "/index.html")
    WebDriverWait(driver, 30).until(lambda d: d.title == "ready")
    driver.set_script_timeout(90)
    return driver.execute_async_script(SCRIPT, api, token)


def test_a_page_of_a_listed_origin_uses_the_client(browser, page, tmp_path):  # noqa: F811
    served = serve(str(tmp_path / "cors.db"), args=("--cors-origin", page))
    try:
        out = run_page(browser, page, served.url, served.token)
    finally:
        browser.get("about:blank")  # the page's stream closed before the server stops
        served.stop()
    assert "error" not in out, out
    assert out["version"] == 1 and out["value"] == {"from": "page"}
    assert out["conflict"] == [True, "VersionConflict", 1]
    assert out["bytes"] == [0, 1, 255]
    assert out["fenced"] == 1 and out["during"] == 1
    assert out["subscriptions"] == [["one", "two"]] * 8
    with agentstate.open(served.db) as db:
        assert db.scope("app", "browser").get("k") == {"from": "page"}


def test_without_the_option_the_browser_refuses_the_page(browser, page, tmp_path):  # noqa: F811
    served = serve(str(tmp_path / "plain.db"))
    try:
        out = run_page(browser, page, served.url, served.token)
    finally:
        browser.get("about:blank")
        served.stop()
    # The preflight got no CORS answer: the browser sent no PUT, and the client says so.
    assert out["name"] == "StorageError", out
    assert "Failed to fetch" in out["error"], out
    with agentstate.open(served.db) as db:
        assert db.scope("app", "browser").get("k") is None, "nothing was written"
