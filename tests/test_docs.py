"""The documentation site (docs/, mkdocs.yml): it builds strictly, and every example in it runs.

How the examples are run — the conventions a page's author follows:

- Each page's fenced code blocks run in order, in a fresh temporary directory
  that is their working directory, with ``$AGENTSTATE_DB`` naming
  ``agentstate.db`` there (so ``agentstate.open()``, ``agentstate.open("agentstate.db")``
  and the command all reach one store) and the ``agentstate`` command of this
  checkout first on PATH.
- ```` ```python ```` blocks run in this process, one namespace per page (a
  later block sees an earlier block's names). Use ``assert`` to show a result:
  a wrong claim then fails the test. Databases left open are closed afterwards.
  A python block titled ``NAME.py`` (```` ```python title="agents.py" ````) is
  a script instead: saved under that name and run as ``python NAME.py`` in its
  own process (for multiprocessing: ``if __name__ == "__main__":``).
- ```` ```sh ```` blocks run with ``bash`` under ``set -euo pipefail``: every
  command must succeed. Variables a block sets are seen by the page's later
  blocks: shell blocks, and Python blocks through ``os.environ``.
- ```` ```console ```` blocks are ``$ command`` lines (a line ending in ``\\``
  continues), each followed by the output it must print (stdout and stderr
  together). In that output ``...`` stands for any text within a line, and a
  line of only ``...`` for any number of lines. Every command must exit 0:
  show a failing one as ``$ agentstate get session:s-1 nope || echo "exit $?"``.
- The port ``8765`` in an example (``:8765``, ``--port 8765``) is replaced by a
  free loopback port, one per page, so examples may say
  ``http://127.0.0.1:8765`` and ``agentstate serve --port 8765``.
- A block the test must not run, or must run specially, has a marker comment
  right above it, which says why (readers of the Markdown see it; the site
  does not show it):
  ``<!-- docs-test: skip: WHY -->`` — not run (``pip install`` lines, other
  languages, a layout shown as text);
  ``<!-- docs-test: background: WHY -->`` — a ``sh`` command that runs until
  Ctrl-C (``agentstate serve``, ``agentstate changes --follow``): started when
  reached, the page goes on once it has printed its first line (and, if it
  names port 8765, once that port accepts connections); at the end of the
  page it gets SIGINT and must exit 0. Any "double-quoted text" in WHY must
  have been printed by then (the test waits up to a minute for it).
- A page that needs PostgreSQL says ``<!-- docs-test: postgres -->`` anywhere:
  it then runs against a fresh store on the test run's PostgreSQL server (the
  ``pg_url`` fixture of conftest.py): ``$AGENTSTATE_DB`` holds its URL, and
  the example URL ``postgresql://agents@db.internal/agents`` (with any
  ``?query``) is replaced by it.
- Any other block (```` ```text ````, ```` ```toml ````, no language) without
  a skip marker fails the test, as does a marker without a reason or a block.

To add a page: write ``docs/NAME.md``, add it to ``nav`` in mkdocs.yml (the
strict build fails on a page left out), and run
``python -m pytest tests/test_docs.py -k NAME``: its examples run as above.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest

import agentstate

from . import docs_examples as dx
from .conftest import REPO

PAGES = dx.pages()


def _id(p: Path) -> str:
    return p.relative_to(dx.DOCS).as_posix()


@pytest.mark.filterwarnings("error::RuntimeWarning")  # a coroutine never awaited is a wrong example
@pytest.mark.parametrize("path", PAGES, ids=[_id(p) for p in PAGES])
def test_docs_page_examples_run(path, tmp_path, monkeypatch, request):
    """Every code block of the page runs as written and shows what it claims."""
    page = dx.parse(path)
    db = str(tmp_path / "agentstate.db")
    if "postgres" in page.needs:
        db = request.getfixturevalue("pg_url")
    run = dx.PageRun(page, tmp_path, db)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AGENTSTATE_DB", db)
    for name in ("AGENTSTATE_TOKEN", "AGENTSTATE_THREAD_ID"):
        monkeypatch.delenv(name, raising=False)
    run.run()


# -- the harness can fail -----------------------------------------------------------------------

def test_docs_an_unmarked_block_the_test_cannot_run_fails_the_page(tmp_path):
    """A code block that is neither runnable nor marked with a reason is refused."""
    page = tmp_path / "p.md"
    page.write_text("# P\n\n```toml\n[x]\n```\n")
    with pytest.raises(dx.DocsError, match="cannot run"):
        dx.parse(page)
    page.write_text("# P\n\n<!-- docs-test: skip -->\n```toml\n[x]\n```\n")
    with pytest.raises(dx.DocsError, match="must say why"):
        dx.parse(page)
    page.write_text("# P\n\n<!-- docs-test: skip: a layout -->\n\nText.\n\n```toml\n[x]\n```\n")
    with pytest.raises(dx.DocsError, match="right above"):
        dx.parse(page)
    page.write_text("# P\n\n<!-- docs-test: skip: a layout, not code -->\n```toml\n[x]\n```\n")
    assert dx.parse(page).blocks[0].marker == "skip"


def test_docs_console_output_must_match_what_the_command_prints():
    """A console block's expected output is compared line by line, with ... as a wildcard."""
    assert dx.output_matches(["version 1"], "version 1\n")
    assert not dx.output_matches(["version 2"], "version 1\n")
    assert dx.output_matches(["database: .../a.db", "...", "end"], "database: /tmp/x/a.db\nx\ny\nend\n")
    assert not dx.output_matches(["a"], "a\nb\n")
    assert dx.output_matches([], "")


# -- the site builds ----------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _site_build(request, tmp_path_factory):
    """Starts ``mkdocs build --strict`` with the module's first test, so that it runs while the
    pages' examples do (when a test that needs the site is selected)."""
    if not any("site" in getattr(item, "fixturenames", ()) for item in request.session.items):
        yield None
        return
    out = tmp_path_factory.mktemp("site")
    log = open(out.parent / f"{out.name}.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                            cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    yield out, proc, log
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    log.close()


@pytest.fixture(scope="module")
def site(_site_build):
    """The site, built with ``mkdocs build --strict`` (a broken link or reference fails)."""
    out, proc, log = _site_build
    proc.wait(timeout=300)
    log.seek(0)
    assert proc.returncode == 0, log.read()[-6000:]
    return out


def test_docs_site_builds_strictly(site):
    """mkdocs build --strict succeeds: no broken link, anchor, reference or page left out."""
    assert (site / "index.html").exists()
    assert (site / "api" / "index.html").exists()


def _text(path: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", path.read_text(encoding="utf-8")))


def test_docs_api_reference_shows_every_public_name(site):
    """Every name agentstate exports has its entry in the generated reference, and every
    public method of those classes is either there or named on its page (the async twins)."""
    pages = list((site / "api").rglob("index.html"))
    ids = set()
    text = ""
    for p in pages:
        raw = p.read_text(encoding="utf-8")
        ids |= set(re.findall(r'id="(agentstate\.[A-Za-z0-9_.]+)"', raw))
        text += _text(p)
    missing = []
    for name in agentstate.__all__:
        obj = getattr(agentstate, name)
        where = f"agentstate.errors.{name}" if isinstance(obj, type) and issubclass(
            obj, agentstate.AgentStateError) else f"agentstate.{name}"
        if where not in ids:
            missing.append(where)
            continue
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            for member in dir(obj):
                if member.startswith("_") or member in ("count", "index"):  # tuple's own
                    continue
                if f"{where}.{member}" not in ids and not re.search(rf"\b{member}\b", text):
                    missing.append(f"{where}.{member}")
    assert not missing, f"not in the API reference: {missing}"


# -- the command's page: every command, and only those ----------------------------------------

def _commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(cmd, click.Group):
            out |= _commands(cmd, path + " ")
        else:
            out[path] = cmd
    return out


def _cli_sections() -> dict[str, str]:
    """The command page's sections: a heading `agentstate PATH ARGS` -> its text."""
    text = (dx.DOCS / "cli.md").read_text(encoding="utf-8")
    sections: dict[str, str] = {}
    parts = re.split(r"^#{2,4} `agentstate ([^`]*)`[^\n]*\n", text, flags=re.M)
    for head, body in zip(parts[1::2], parts[2::2]):
        words = []
        for w in head.split():
            if not re.fullmatch(r"[a-z][a-z-]*", w):
                break
            words.append(w)
        path = " ".join(words)
        assert path not in sections, f"cli.md documents `agentstate {path}` twice"
        sections[path] = re.split(r"^#{2,3} ", body, flags=re.M)[0]
    return sections


def test_docs_cli_page_documents_every_command_and_only_those():
    """cli.md has a section per subcommand of agentstate.cli.cli, naming each of its options;
    a section for a command that does not exist fails."""
    from agentstate.cli import cli

    commands = _commands(cli)
    sections = _cli_sections()
    assert sorted(set(commands) - set(sections)) == [], "commands cli.md does not document"
    assert sorted(set(sections) - set(commands)) == [], "cli.md documents commands that do not exist"
    for path, cmd in commands.items():
        for param in cmd.params:
            for opt in param.opts:
                if opt.startswith("--") and opt != "--help":
                    assert opt in sections[path], f"`agentstate {path}`: cli.md does not mention {opt}"
    head = (dx.DOCS / "cli.md").read_text(encoding="utf-8").split("\n## ", 1)[0]
    for opt in ("--db", "--json", "--version", "--help"):
        assert opt in head, f"cli.md's introduction does not mention {opt}"


# -- the HTTP page: every route of the OpenAPI document, and only those --------------------------

ROUTE = re.compile(r"\b(GET|PUT|POST|DELETE|PATCH|HEAD) (/[^\s`?|]*)")


def _openapi_routes(tmp_path) -> set[tuple[str, str]]:
    from starlette.testclient import TestClient

    from agentstate.server import create_app

    with agentstate.open(str(tmp_path / "openapi.db")) as db, TestClient(create_app(db)) as c:
        doc = c.get("/openapi.json").json()
    return {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops
            if m in ("get", "put", "post", "delete", "patch", "head")}


def _matches(path: str, template: str) -> bool:
    """A path as a page writes it (/v1/turns/{turn_id}/hold) fits a template of the document."""
    a, b = path.rstrip("/").split("/"), template.split("/")
    return len(a) == len(b) and all(x == y or y.startswith("{") for x, y in zip(a, b))


def test_docs_http_page_documents_every_route_of_the_openapi_document(tmp_path):
    """http-api.md documents every method and path of /openapi.json (a heading, or the first cell
    of a table row, `METHOD PATH`), and every route any page names exists in the document."""
    routes = _openapi_routes(tmp_path)
    text = (dx.DOCS / "http-api.md").read_text(encoding="utf-8")
    documented = set()
    for line in text.splitlines():
        m = re.match(r"^(?:#{2,4} |\| )`(GET|PUT|POST|DELETE|PATCH|HEAD) (/[^`]*)`", line)
        if m:
            documented.add((m.group(1), m.group(2)))
    assert sorted(routes - documented) == [], "routes of /openapi.json that http-api.md does not document"
    assert sorted(documented - routes) == [], "routes http-api.md documents that /openapi.json lacks"
    unknown = []
    for page in PAGES:
        for m in ROUTE.finditer(page.read_text(encoding="utf-8")):
            method, path = m.group(1), m.group(2).rstrip(".,:;)")
            if not path.startswith(("/v1", "/openapi")):
                continue
            if not any(method == rm and _matches(path, rp) for rm, rp in routes):
                unknown.append(f"{_id(page)}: {method} {path}")
    assert not unknown, f"routes named in the docs that the server does not have: {unknown}"


# -- errors and limits ----------------------------------------------------------------------------

def test_docs_errors_page_lists_every_error_class_with_its_code_and_status():
    """errors.md has a table row per error class: `Name` | code | status, matching the class."""
    text = (dx.DOCS / "errors.md").read_text(encoding="utf-8")
    rows = {}
    for m in re.finditer(r"^\| `(\w+)` \| [^|]*\| `(\w+)` \| (\d{3}) \|", text, flags=re.M):
        rows[m.group(1)] = (m.group(2), int(m.group(3)))
    classes = {n: getattr(agentstate, n) for n in agentstate.__all__
               if isinstance(getattr(agentstate, n), type)
               and issubclass(getattr(agentstate, n), agentstate.AgentStateError)}
    assert sorted(set(classes) - set(rows)) == [], "error classes errors.md does not list"
    assert sorted(set(rows) - set(classes)) == [], "errors.md lists classes that do not exist"
    for name, cls in classes.items():
        assert rows[name] == (cls.code, cls.status), f"{name}: errors.md says {rows[name]}"
