"""Reading the documentation's code blocks and running them (used by tests/test_docs.py).

The conventions are written down once, at the top of tests/test_docs.py.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .conftest import REPO, sigint_as_in_a_terminal

DOCS = REPO / "docs"
RUN = {"python": "python", "py": "python", "sh": "sh", "bash": "sh", "console": "console"}
MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<kind>[a-z-]+)\s*(?::\s*(?P<why>.*?))?\s*-->\s*$")
BLOCK_KINDS = ("skip", "background")
PAGE_KINDS = ("postgres",)
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)(?P<rest>.*)$")
PORT = "8765"  # an example's port: the test puts a free one in its place
PG_PLACEHOLDER = re.compile(r"postgresql://agents@db\.internal/agents(\?[^\s\"')]*)?")
SHELL_OWN = {"_", "SHLVL", "PWD", "OLDPWD"}  # bash's own variables, not the page's
WAIT = 60.0  # seconds a background command may take to start, or to print what it must


class DocsError(AssertionError):
    pass


def rel(path: Path) -> str:
    """A page's name in messages: relative to the repository when inside it."""
    try:
        return path.relative_to(REPO).as_posix()
    except ValueError:
        return str(path)


@dataclass
class Block:
    page: Path
    line: int  # of the first line of code, 1-based
    lang: str
    code: str
    marker: str | None = None  # skip, background
    why: str = ""
    title: str = ""  # title="agents.py": a script, saved under that name and run on its own

    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}"


@dataclass
class Page:
    path: Path
    blocks: list[Block] = field(default_factory=list)
    needs: set[str] = field(default_factory=set)  # page markers: postgres


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def parse(path: Path) -> Page:
    """The page's fenced blocks, each with the docs-test marker just above it (if any)."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    pending: tuple[int, str, str] | None = None  # a block marker waiting for its block
    i = 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            kind, why = m.group("kind"), (m.group("why") or "").strip()
            if kind in PAGE_KINDS:
                page.needs.add(kind)
            elif kind in BLOCK_KINDS:
                if not why:
                    raise DocsError(f"{rel(path)}:{i + 1}: a docs-test {kind} marker "
                                    "must say why (<!-- docs-test: skip: why -->)")
                if pending:
                    raise DocsError(f"{rel(path)}:{pending[0]}: marker without a block")
                pending = (i + 1, kind, why)
            else:
                raise DocsError(f"{rel(path)}:{i + 1}: unknown docs-test marker {kind!r}")
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            indent, fence, lang = f.group("indent"), f.group("fence"), f.group("lang").lower()
            end = i + 1
            close = re.compile(rf"^{re.escape(indent)}{fence[0]}{{{len(fence)},}}\s*$")
            while end < len(lines) and not close.match(lines[end]):
                end += 1
            if end == len(lines):
                raise DocsError(f"{rel(path)}:{i + 1}: unclosed code block")
            body = "\n".join(ln[len(indent):] if ln.startswith(indent) else ln.lstrip()
                             for ln in lines[i + 1:end])
            block = Block(path, i + 2, lang, textwrap.dedent(body) + "\n")
            title = re.search(r'title="([^"]*)"', f.group("rest"))
            block.title = title.group(1) if title else ""
            if pending:
                block.marker, block.why = pending[1], pending[2]
                pending = None
            page.blocks.append(block)
            i = end + 1
            continue
        if pending and line.strip():
            raise DocsError(f"{rel(path)}:{pending[0]}: a docs-test marker must stand "
                            "right above its code block")
        i += 1
    if pending:
        raise DocsError(f"{rel(path)}:{pending[0]}: marker without a block")
    for b in page.blocks:
        if b.marker is None and b.lang not in RUN:
            raise DocsError(
                f"{b.where()}: a ```{b.lang or '(no language)'} block the test cannot run: make it "
                "python, sh or console, or mark it <!-- docs-test: skip: why -->")
        if b.marker == "background" and RUN.get(b.lang) != "sh":
            raise DocsError(f"{b.where()}: only a sh block can run in the background")
    return page


# -- console blocks: "$ command" lines, each followed by its expected output ------------------

def console_steps(block: Block) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    lines = block.code.rstrip("\n").splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if not steps:
                raise DocsError(f"{block.where()}: a console block starts with a '$ ' line")
            steps[-1][1].append(line)
            i += 1
            continue
        cmd = line[2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd + "\n" + lines[i]
        steps.append((cmd, []))
        i += 1
    return steps


def output_matches(expected: list[str], actual: str) -> bool:
    """Line by line; '...' inside a line matches any text, a line of only '...' any lines."""
    pattern = ""
    expected = list(expected)
    while expected and not expected[-1].strip():  # blank lines before the next $ line
        expected.pop()
    for line in expected:
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += re.escape(line.rstrip()).replace(re.escape("..."), r"[^\n]*") + r"[ \t]*\n"
    text = "\n".join(ln.rstrip() for ln in actual.rstrip("\n").splitlines())
    return re.fullmatch(pattern, text + "\n" if text else "") is not None


# -- the runner ------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PageRun:
    """Runs one page's blocks in order, in ``workdir``, with ``$AGENTSTATE_DB`` there (or the
    PostgreSQL URL), the ``agentstate`` command on PATH and one free port for 8765."""

    def __init__(self, page: Page, workdir: Path, db: str) -> None:
        self.page, self.workdir, self.db = page, workdir, db
        self.port = str(free_port())
        bindir = workdir / ".bin"
        bindir.mkdir()
        cmd = bindir / "agentstate"  # this checkout's code, without a shim's start-up cost
        cmd.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m agentstate "$@"\n')
        cmd.chmod(0o755)
        pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        self.env = {**os.environ, "AGENTSTATE_DB": db, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": pythonpath, "COLUMNS": "100"}
        for name in ("AGENTSTATE_TOKEN", "AGENTSTATE_THREAD_ID"):
            self.env.pop(name, None)
        self.namespace: dict[str, Any] = {"__name__": "__docs__"}
        self.background: list[tuple[Block, subprocess.Popen[bytes], Path]] = []
        self.saved_environ: dict[str, str | None] = {}

    def code(self, block: Block) -> str:
        text = block.code.replace(f":{PORT}", f":{self.port}").replace(f"--port {PORT}", f"--port {self.port}")
        if "postgres" in self.page.needs:
            text = PG_PLACEHOLDER.sub(self.db, text)
        return text

    def run(self) -> None:
        # A Python block that starts the command (an MCP client, a subprocess) starts this
        # checkout's too, as a shell block does
        for name in ("PATH", "PYTHONPATH"):
            self.saved_environ.setdefault(name, os.environ.get(name))
            os.environ[name] = self.env[name]
        try:
            for block in self.page.blocks:
                if block.marker == "skip":
                    continue
                kind = RUN[block.lang]
                if block.marker == "background":
                    self.start(block)
                elif kind == "python":
                    self.python(block)
                elif kind == "sh":
                    self.sh(block)
                else:
                    self.console(block)
            self.stop_background(check=True)
        finally:
            self.stop_background(check=False)
            self.close_databases()
            for name, value in self.saved_environ.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value

    def python(self, block: Block) -> None:
        if block.title.endswith(".py"):  # a script: its own process, as a reader would run it
            (self.workdir / block.title).write_text(self.code(block))
            self._bash(f'"{sys.executable}" {block.title}', block, timeout=300)
            return
        source = "\n" * (block.line - 1) + self.code(block)
        exec(compile(source, str(block.page), "exec", dont_inherit=True), self.namespace)

    @property
    def env_file(self) -> Path:
        return self.workdir / ".env"

    def shell_env(self) -> dict[str, str]:
        """The environment of the next shell block: what the page's earlier ones left."""
        if not self.env_file.exists():
            return self.env
        return dict(item.split("=", 1) for item in self.env_file.read_text().split("\0") if "=" in item)

    def _bash(self, script: str, block: Block, timeout: float = 120) -> str:
        full = f"set -a\n{script}\nenv -0 > {self.env_file}\n"
        r = subprocess.run(["bash", "-c", full], cwd=self.workdir, env=self.shell_env(),
                           capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise DocsError(f"{block.where()}: exit {r.returncode}\n--- block:\n{block.code}"
                            f"--- stdout:\n{r.stdout[-3000:]}\n--- stderr:\n{r.stderr[-3000:]}")
        self.export_to_python()
        return r.stdout

    def export_to_python(self) -> None:
        """Variables the shell blocks set (T=..., AGENTSTATE_TOKEN=...) are seen by the page's
        Python blocks too, in os.environ (restored when the page ends)."""
        for name, value in self.shell_env().items():
            if name not in SHELL_OWN and self.env.get(name) != value:
                self.saved_environ.setdefault(name, os.environ.get(name))
                os.environ[name] = value

    def sh(self, block: Block) -> None:
        self._bash("set -euo pipefail\n" + self.code(block), block)

    def console(self, block: Block) -> None:
        steps = console_steps(block)
        script = "set -uo pipefail\n"
        for n, (cmd, _) in enumerate(steps):
            cmd = self.code(Block(block.page, block.line, "sh", cmd))
            script += (f"{{\n{cmd}\n}} 2>&1\nrc=$?\nprintf '\\n\\036%d %d\\n' {n} $rc\n"
                       "[ $rc -eq 0 ] || exit 99\n")
        out = self._bash(script, block) if steps else ""
        parts = re.split(r"\n\x1e(\d+) (\d+)\n", out)
        for n, (cmd, expected) in enumerate(steps):
            if 3 * n + 2 >= len(parts):
                raise DocsError(f"{block.where()}: `{cmd}` did not run\n{out[-3000:]}")
            actual, rc = parts[3 * n], int(parts[3 * n + 2])
            if rc != 0:
                raise DocsError(f"{block.where()}: `{cmd}` exited {rc}:\n{actual}")
            if not output_matches(expected, actual):
                raise DocsError(f"{block.where()}: `{cmd}` printed\n{actual}\n--- the page says\n"
                                + "\n".join(expected))

    def start(self, block: Block) -> None:
        """A command that runs until Ctrl-C: started now, stopped (SIGINT) at the end of the page."""
        log = self.workdir / f".background-{block.line}.log"
        command = self.code(block).strip()
        if "\n" in command:
            raise DocsError(f"{block.where()}: a background block is one command")
        with open(log, "wb") as out:
            # exec: the signal reaches the command itself, as Ctrl-C would
            # PYTHONFAULTHANDLER: a command that does not stop on Ctrl-C prints its threads'
            # stacks on the SIGABRT it then gets (stop_background), into the log the error shows.
            with sigint_as_in_a_terminal():  # it is stopped by Ctrl-C
                proc = subprocess.Popen(["bash", "-c", "exec " + command], cwd=self.workdir,
                                        env={**self.shell_env(), "PYTHONFAULTHANDLER": "1"},
                                        stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.background.append((block, proc, log))
        deadline = time.monotonic() + WAIT
        port = int(self.port) if re.search(rf"(:|--port ){self.port}\b", command) else None
        while True:
            if proc.poll() is not None:
                raise DocsError(f"{block.where()}: exited {proc.returncode} at once:\n"
                                f"{log.read_text(errors='replace')[-3000:]}")
            ready = log.stat().st_size > 0
            if ready and port is not None:
                with socket.socket() as s:
                    ready = s.connect_ex(("127.0.0.1", port)) == 0
            if ready:
                return
            if time.monotonic() > deadline:
                raise DocsError(f"{block.where()}: not started after {WAIT:g} s")
            time.sleep(0.05)

    def stop_background(self, check: bool) -> None:
        while self.background:
            block, proc, log = self.background.pop()
            expect = re.findall(r'"([^"]+)"', block.why)
            deadline = time.monotonic() + WAIT
            while check and proc.poll() is None and time.monotonic() < deadline and \
                    not all(e in log.read_text(errors="replace") for e in expect):
                time.sleep(0.05)
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(WAIT)
                except subprocess.TimeoutExpired:
                    proc.send_signal(signal.SIGABRT)  # its stacks, into the log (see start)
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        pass
                    with contextlib.suppress(ProcessLookupError):  # gone on the SIGABRT
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            if not check:
                continue
            text = log.read_text(errors="replace")
            if proc.returncode != 0:
                raise DocsError(f"{block.where()}: exited {proc.returncode} on Ctrl-C:\n{text[-8000:]}")
            missing = [e for e in expect if e not in text]
            if missing:
                raise DocsError(f"{block.where()}: never printed {missing}:\n{text[-3000:]}")

    def close_databases(self) -> None:
        import agentstate

        for value in list(self.namespace.values()):
            if isinstance(value, agentstate.Database):
                value.close()
