"""The pages at /ui in a real browser: Debian's headless Chromium driven by Selenium,
against a real ``agentstate serve`` process, with other processes writing meanwhile.

Needs the packages ``chromium`` and ``chromium-driver`` (never a browser download)
and the pip package ``selenium``. Without them these tests fail under CI=true
and are skipped elsewhere, saying why. AGENTSTATE_UI_SCREENSHOTS=DIR also saves
the screenshots there (docs/ keeps the README's copies: docs/ui-overview.png,
docs/ui-run.png).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

import agentstate

from .conftest import REPO
from .serverproc import serve

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
WAIT = 20.0  # seconds a page may take to show a change: the claim is 1-2 s; the margin is for a loaded machine


def _missing() -> str | None:
    for path, pkg in ((CHROMIUM, "chromium"), (DRIVER, "chromium-driver")):
        if not os.path.exists(path):
            return f"{path} is missing: apt-get install {pkg}"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "the pip package selenium is missing: pip install selenium"
    return None


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    why = _missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests cannot run in CI: {why}")
        pytest.skip(f"no headless Chromium here ({why}); CI runs these tests")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", "--window-size=1280,900",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def served(tmp_path_factory, browser):
    s = serve(str(tmp_path_factory.mktemp("ui") / "ui.db"))
    yield s
    browser.get("about:blank")  # close the page's event stream before the server stops
    s.stop()


def sign_in(driver, served):
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(served.url + "/ui")
    assert "/ui/login" in driver.current_url
    driver.find_element(By.ID, "token").send_keys(served.token)
    driver.find_element(By.ID, "signin").click()
    wait_for(driver, lambda d: d.current_url.rstrip("/").endswith("/ui"))
    assert served.token not in driver.current_url
    assert driver.find_element(By.TAG_NAME, "h1").text == "Overview"


def wait_for(driver, cond, timeout: float = WAIT):
    from selenium.common.exceptions import (
        NoSuchElementException,
        StaleElementReferenceException,
        WebDriverException,
    )
    from selenium.webdriver.support.ui import WebDriverWait

    def check(d):
        try:
            return cond(d)
        except StaleElementReferenceException:
            raise
        except WebDriverException as e:
            # Chromium's other word for a stale element: replaced between find and read
            if "does not belong to the document" in (e.msg or ""):
                return False
            raise

    # the live parts replace the page's content: an element read a moment ago may be gone
    return WebDriverWait(driver, timeout, poll_frequency=0.1, ignored_exceptions=(
        NoSuchElementException, StaleElementReferenceException)).until(check)


def wait_live(driver):
    from selenium.webdriver.common.by import By

    wait_for(driver, lambda d: d.find_element(By.ID, "live").text == "live")


def in_other_process(db: str, code: str) -> None:
    """Run ``code`` (with ``db`` open as ``db``) in a process of its own: another agent."""
    prog = "import agentstate\nwith agentstate.open(%r) as db:\n%s" % (db, textwrap.indent(code, "    "))
    subprocess.run([sys.executable, "-c", prog], check=True, timeout=60, cwd=REPO)


def png_colors(data: bytes) -> int:
    """How many different RGB colours a PNG (8-bit RGB or RGBA, as Chromium writes) holds."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, _height, depth, ctype = struct.unpack(">IIBB", chunk[:10])
            assert depth == 8 and ctype in (2, 6), (depth, ctype)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + n
    raw, stride, colors, prev = zlib.decompress(idat), width * bpp, set(), bytearray(width * bpp)
    for row in range(len(raw) // (stride + 1)):
        f, line = raw[row * (stride + 1)], bytearray(raw[row * (stride + 1) + 1:(row + 1) * (stride + 1)])
        for i in range(stride):  # undo the PNG filters
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        if row % 4 == 0:
            colors.update(bytes(line[i:i + 3]) for i in range(0, stride, bpp * 4))
        prev = line
    return len(colors)


def screenshot(driver, name: str, tmp_path: Path) -> Path:
    path = tmp_path / name
    assert driver.save_screenshot(str(path))
    assert png_colors(path.read_bytes()) >= 8, f"{name} looks blank"
    keep = os.environ.get("AGENTSTATE_UI_SCREENSHOTS")
    if keep:
        shutil.copy(path, Path(keep) / name)
    return path


def text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


# -- the tests ------------------------------------------------------------------------------


def test_sign_in_and_open_every_page(browser, served, tmp_path):
    from selenium.webdriver.common.by import By

    in_other_process(served.db, textwrap.dedent("""\
        ops = agentstate.Principal("admin", admin=True)
        s = db.sessions.create(ops, metadata={"agent": "support"})
        db.sessions.state(s.id, ops).put("cart", {"items": ["tea", "cups"], "total": 12.5})
        t = db.sessions.start_turn(s.id, ops, input={"message": "refund my order"})
        t.hold({"ask": "approve a refund of 12.50?"})
        db.sessions.start_turn(db.sessions.create(ops).id, ops, input={"message": "hi"}, lease=600)
        db.scope("user", "u-7").put("profile", {"name": "Ada", "plan": "pro"})
        db.scope("user", "u-7").append("events", [{"n": i} for i in range(120)])
        entries = [{"seq": 0, "type": "message", "role": "user", "content": "Find flights to Lisbon"},
                   {"seq": 1, "type": "tool_call", "call_id": "c1", "name": "search_flights",
                    "arguments": {"to": "LIS", "date": "2026-12-24"}},
                   {"seq": 2, "type": "tool_result", "call_id": "c1", "content": {"found": 3}},
                   {"seq": 3, "type": "message", "role": "assistant", "content": "Three flights; booking the first."},
                   {"seq": 4, "type": "tool_call", "call_id": "c2", "name": "book_flight",
                    "arguments": {"flight": "TP1351"}}]
        db.runs.write("trip-planner", entries, {"task": "plan a trip", "turn": 2}, create=True)
        """))
    sign_in(browser, served)
    wait_live(browser)
    body = text(browser)
    assert "held turns\n1" in body and "active turns\n1" in body and "trip-planner" in body
    screenshot(browser, "ui-overview.png", tmp_path)

    browser.find_element(By.LINK_TEXT, "trip-planner").click()
    wait_for(browser, lambda d: "Run trip-planner" in d.find_element(By.TAG_NAME, "h1").text)
    unknown = browser.find_elements(By.CSS_SELECTOR, "li.call.unknown")
    assert len(unknown) == 1 and "book_flight" in unknown[0].text and "unknown" in unknown[0].text
    paired = browser.find_element(By.ID, "seq-1")
    assert "search_flights" in paired.text and '"found": 3' in paired.text
    assert "plan a trip" in text(browser)
    screenshot(browser, "ui-run.png", tmp_path)

    for link, heading in (("Sessions", "Sessions"), ("Runs", "Runs"), ("Scopes", "Scopes"),
                          ("Changes", "The change feed")):
        browser.find_element(By.LINK_TEXT, link).click()
        wait_for(browser, lambda d: d.find_element(By.TAG_NAME, "h1").text == heading)
    browser.get(served.url + "/ui/scopes/user/u-7")
    assert "profile" in text(browser) and "events" in text(browser)
    browser.find_element(By.LINK_TEXT, "events").click()
    assert "length\n120" in text(browser)
    browser.find_element(By.LINK_TEXT, "Next items").click()
    wait_for(browser, lambda d: "start=50" in d.current_url)
    assert '"n": 50' in text(browser) and '"n": 49' not in text(browser)
    browser.get(served.url + "/ui/sessions")
    browser.find_elements(By.CSS_SELECTOR, "tbody a")[-1].click()  # the older session: the held turn
    wait_for(browser, lambda d: d.find_element(By.TAG_NAME, "h1").text.startswith("Session"))
    body = text(browser)
    assert "refund my order" in body and "approve a refund" in body and "held" in body and "cart" in body


def test_a_value_written_by_another_process_appears_without_a_reload(browser, served):
    from selenium.webdriver.common.by import By

    in_other_process(served.db, 'db.scope("agent", "bot-1").put("mood", "calm")')
    sign_in(browser, served)
    browser.get(served.url + "/ui/scopes/agent/bot-1/keys/mood")
    wait_live(browser)
    assert '"calm"' in browser.find_element(By.ID, "value").text
    browser.execute_script("window.notReloaded = true")
    in_other_process(served.db, 'db.scope("agent", "bot-1").put("mood", "curious")')
    wait_for(browser, lambda d: '"curious"' in d.find_element(By.ID, "value").text)
    assert browser.find_element(By.ID, "version").text == "2"
    assert browser.execute_script("return window.notReloaded") is True

    browser.get(served.url + "/ui/changes")  # the live tail
    wait_live(browser)
    browser.execute_script("window.notReloaded = true")
    in_other_process(served.db, 'db.scope("agent", "bot-1").put("mood", "sleepy")')
    wait_for(browser, lambda d: "agent:bot-1 mood" in d.find_element(By.CSS_SELECTOR, "#tail tr").text)
    assert browser.execute_script("return window.notReloaded") is True


def test_decide_a_held_turn_and_watch_it_resume(browser, served):
    from selenium.webdriver.common.by import By

    path = Path(served.db).parent / "turn.txt"
    in_other_process(served.db, textwrap.dedent(f"""\
        ops = agentstate.Principal("admin", admin=True)
        s = db.sessions.create(ops)
        t = db.sessions.start_turn(s.id, ops, input={{"message": "delete my account"}})
        t.hold({{"ask": "really delete?"}})
        open({str(path)!r}, "w").write(t.id)
        """))
    turn_id = path.read_text()
    sign_in(browser, served)
    browser.get(f"{served.url}/ui/turns/{turn_id}")
    assert "really delete?" in text(browser) and "held" in text(browser)
    box = browser.find_element(By.ID, "decision")
    box.clear()
    box.send_keys('{"approved": true, "by": "<b>ops</b>"}')
    browser.find_element(By.ID, "decide").click()
    wait_for(browser, lambda d: "decided" in d.find_element(By.TAG_NAME, "h1").text)
    assert '"by": "<b>ops</b>"' in browser.find_element(By.ID, "turn-decision").text
    assert not browser.find_elements(By.ID, "decide")  # decided: no form any more
    wait_live(browser)
    with agentstate.open(served.db) as db:
        assert db.sessions.get_turn(turn_id, agentstate.Principal("admin", admin=True)).decision == \
            {"approved": True, "by": "<b>ops</b>"}
    in_other_process(served.db, textwrap.dedent(f"""\
        ops = agentstate.Principal("admin", admin=True)
        t = db.sessions.resume({turn_id!r}, ops)
        t.finish({{"deleted": True}})
        """))
    wait_for(browser, lambda d: "finished" in d.find_element(By.TAG_NAME, "h1").text)
    assert '"deleted": true' in browser.find_element(By.ID, "turn-result").text


def test_an_injected_script_is_shown_as_text(browser, served):
    from selenium.webdriver.common.by import By

    xss = "<script>document.title='pwned';window.pwned=1</script><img src=x onerror=\"window.pwned=2\">"
    in_other_process(served.db, textwrap.dedent(f"""\
        db.scope("app", "evil").put("note", {xss!r})
        db.runs.write("evil-run", [{{"seq": 0, "type": "message", "role": "user", "content": {xss!r}}}],
                      {{"task": {xss!r}}}, create=True)
        """))
    sign_in(browser, served)
    for path, where in (("/ui/scopes/app/evil/keys/note", "value"), ("/ui/runs/evil-run", "seq-0")):
        browser.get(served.url + path)
        assert xss in browser.find_element(By.ID, where).text.replace('\\"', '"')
        assert browser.execute_script("return window.pwned") is None
        assert "pwned" not in browser.title
    browser.get(served.url + "/ui")
    assert browser.execute_script("return window.pwned") is None


def test_the_readme_screenshots_are_not_blank():
    for name in ("ui-overview.png", "ui-run.png"):
        assert png_colors((REPO / "docs" / name).read_bytes()) >= 8, name


def test_a_failed_refresh_is_retried_and_the_page_says_it_is_not_live(browser, served):
    """Issue 26.23: a refresh that failed was never retried, and the page still said "live"
    while it showed a value that had changed."""
    from selenium.webdriver.common.by import By

    in_other_process(served.db, 'db.scope("agent", "bot-2").put("mood", "calm")')
    sign_in(browser, served)
    browser.get(served.url + "/ui/scopes/agent/bot-2/keys/mood")
    wait_live(browser)
    browser.execute_cdp_cmd("Network.enable", {})
    browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/keys/mood*"]})  # not the stream
    try:
        in_other_process(served.db, 'db.scope("agent", "bot-2").put("mood", "curious")')
        wait_for(browser, lambda d: d.find_element(By.ID, "live").text not in ("", "live"))
        assert '"calm"' in browser.find_element(By.ID, "value").text  # stale, and it says so
    finally:
        browser.execute_cdp_cmd("Network.setBlockedURLs", {"urls": []})
    wait_for(browser, lambda d: '"curious"' in d.find_element(By.ID, "value").text)  # no new write
    wait_live(browser)


def test_a_key_s_history_and_the_store_as_of_a_change_picked_on_the_feed(browser, served):
    """SPEC §17 on the pages: another process changes a key; its page lists each revision
    with what changed; on the feed page, the row of the first write links to the scope and
    the key as they were right after it, and the form shows any scope as of any change."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    in_other_process(served.db, textwrap.dedent("""\
        s = db.scope("user", "u-past")
        s.put("settings", {"theme": "dark", "lang": "en"})
        s.put("settings", {"theme": "light", "lang": "en", "beta": True})
        """))
    sign_in(browser, served)
    browser.get(served.url + "/ui/scopes/user/u-past/keys/settings")
    rows = browser.find_elements(By.CSS_SELECTOR, "#history tbody tr")
    assert len(rows) == 2
    assert '~ theme: "dark" → "light"' in rows[0].text and "+ beta: true" in rows[0].text
    assert "lang" not in rows[0].text
    first = int(rows[1].find_element(By.CSS_SELECTOR, "td.num").text)

    browser.get(served.url + "/ui/changes")
    wait_live(browser)
    in_other_process(served.db, 'db.scope("user", "u-past").put("later", 1)')  # a live row too
    wait_for(browser, lambda d: "user:u-past later" in d.find_element(By.CSS_SELECTOR, "#tail tr").text)
    live_row = browser.find_element(By.CSS_SELECTOR, "#tail tr")
    assert "as_of=" in live_row.find_element(By.LINK_TEXT, "key").get_attribute("href")
    row = next(r for r in browser.find_elements(By.CSS_SELECTOR, "#tail tr")
               if r.find_element(By.CSS_SELECTOR, "td").text == str(first))
    row.find_element(By.LINK_TEXT, "scope").click()
    wait_for(browser, lambda d: f"as_of={first}" in d.current_url)
    assert f"As it was right after change {first}" in browser.find_element(By.ID, "as-of").text
    assert '"dark"' in text(browser) and '"light"' not in text(browser)
    browser.find_element(By.LINK_TEXT, "settings").click()
    wait_for(browser, lambda d: "/keys/settings?as_of=" in d.current_url)
    assert '"dark"' in browser.find_element(By.ID, "value").text
    assert browser.find_element(By.CSS_SELECTOR, "#history tr.then").get_attribute("id") == f"rev-{first}"

    browser.get(served.url + "/ui/changes")
    field = browser.find_element(By.NAME, "as_of")
    field.clear()
    field.send_keys(str(first))
    Select(browser.find_element(By.NAME, "kind")).select_by_visible_text("user")
    browser.find_element(By.NAME, "id").send_keys("u-past")
    browser.find_element(By.CSS_SELECTOR, "form.asof button").click()
    wait_for(browser, lambda d: d.current_url.endswith(f"/ui/scopes/user/u-past?as_of={first}"))
    assert '"dark"' in text(browser)
