"""The README's two commands are the ones that work, on a clean copy of the project."""

from __future__ import annotations

import os
import shutil
import subprocess
import venv
from pathlib import Path

import pytest

from .conftest import REPO


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_starts_with_two_commands_and_ci_runs_the_test_one():
    cmds = readme_commands()
    assert len(cmds) == 2
    assert "agentstate demo" in cmds[0] and "pytest" in cmds[1]
    ci = (REPO / ".ci" / "run").read_text()
    assert cmds[1] in ci.splitlines()


@pytest.mark.timeout(900)  # pip's own bound is 600 s
def test_readme_install_and_demo_on_a_clean_copy(tmp_path):
    """`pip install . && agentstate demo` as written, in a new venv on a copy of the tree."""
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "__pycache__", ".pytest_cache", ".hypothesis", "*.db*", "build", "dist", "*.egg-info",
        ".cache"))  # the frameworks' sdists the suites fetch: 37 MB, and one may be unpacking
    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    env = {k: v for k, v in os.environ.items() if k not in ("AGENTSTATE_DB", "PYTHONPATH")}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env["VIRTUAL_ENV"] = str(env_dir)
    r = subprocess.run(["bash", "-c", readme_commands()[0]], cwd=src, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "no update lost" in r.stdout
    assert (src / "agentstate.db").exists()
    # The installed package is the wheel's copy, and it carries the schema.
    r2 = subprocess.run(
        [str(env_dir / "bin" / "python"), "-c",
         "import agentstate, agentstate.backends.sqlite.schema as c, pathlib; "
         "print(pathlib.Path(agentstate.__file__).parent); print(c.SCHEMA == open('schema.sql').read())"],
        cwd=src, env={**env, "PYTHONSAFEPATH": "1"}, capture_output=True, text=True, timeout=60)
    assert r2.returncode == 0, r2.stderr
    where, same = r2.stdout.split()
    assert "site-packages" in where and same == "True"
    assert Path(where, "schema.sql").read_text() == (REPO / "schema.sql").read_text()


def test_readme_python_examples_run(tmp_path, monkeypatch):
    """The README's Python example runs as written."""
    import re

    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) == 1
    scope: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), scope)
    db = scope["db"]
    assert db.scope("session", "s-42").get("settings") == {"model": "large"} and scope["visits"] == 1
    assert db.runs.load("run-1").entries[-1]["status"] == "unknown"
    db.close()


def test_readme_links_lead_somewhere():
    """Every relative link of the landing page names a file of the repository."""
    import re

    links = re.findall(r"\]\(([^)#]+)\)", (REPO / "README.md").read_text())
    relative = [link for link in links if "://" not in link]
    assert len(relative) >= 10
    assert [link for link in relative if not (REPO / link).exists()] == []
