"""The distribution's name and version (SPEC §16): ``agentstate-db`` on PyPI, the import
name and the command ``agentstate``, the release's version everywhere it is printed."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import agentstate

from .conftest import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def test_the_distribution_is_agentstate_db_at_the_release_version():
    """The project is named agentstate-db (agentstate on PyPI is someone else's) and its
    version is the release's, the one the package and the command report."""
    assert PROJECT["name"] == "agentstate-db"
    assert PROJECT["version"] == agentstate.__version__ == "0.4.0"
    out = subprocess.run([sys.executable, "-m", "agentstate", "--version"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"agentstate, version {PROJECT['version']}"


def test_extras_that_name_the_project_name_this_project():
    """An extra that pulls in other extras names agentstate-db: a bare ``agentstate[...]``
    would install the unrelated package of that name from PyPI."""
    for extra, reqs in PROJECT["optional-dependencies"].items():
        for req in reqs:
            name = req.split("[")[0].split(">")[0].split("=")[0].strip()
            assert name != "agentstate", f"extra {extra!r} names the unrelated 'agentstate': {req}"


def test_docs_tell_users_to_install_agentstate_db():
    """No page, README or message tells a user to ``pip install 'agentstate[...]'`` or
    ``npm install agentstate``: both would install someone else's code."""
    bad = []
    for path in [*REPO.glob("*.md"), *REPO.glob("docs/**/*.md"), *REPO.glob("agentstate/**/*.py"),
                 *REPO.glob("clients/typescript/*.md")]:
        text = path.read_text()
        for needle in ("pip install 'agentstate[", 'pip install "agentstate[', "pip install agentstate ",
                       "npm install agentstate\n", "npm install agentstate "):
            if needle in text:
                bad.append(f"{path.relative_to(REPO)}: {needle.strip()}")
    assert not bad, bad
