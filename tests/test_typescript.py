"""The TypeScript client (clients/typescript, SPEC §13): its own `node --test` suites, run here
so that the README's test command (and CI) proves them.

`npm ci` runs when node_modules is missing or was installed from another package-lock.json;
then `npm test` builds the package and runs the suites against real `agentstate serve`
processes that they start and stop themselves, with this Python (and this checkout's
agentstate first on its path).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import agentstate

from . import nodejs
from .conftest import REPO

PACKAGE = REPO / "clients" / "typescript"


@pytest.mark.timeout(1800)  # npm ci (600 s) then npm test (900 s), each bounded
def test_typescript_client_suites_pass():
    """The TypeScript client passes its node --test suites against a real agentstate serve."""
    npm = nodejs.npm("the TypeScript client's tests")
    nodejs.install(npm, PACKAGE)
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "AGENTSTATE_PYTHON": sys.executable, "PYTHONPATH": path}
    env.pop("AGENTSTATE_DB", None)
    r = subprocess.run([npm, "test"], cwd=PACKAGE, env=env, capture_output=True, text=True,
                       timeout=900)
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"npm test failed (exit {r.returncode}):\n{out[-30000:]}"
    assert "# fail 0" in out or "ℹ fail 0" in out, out[-30000:]


def test_the_npm_package_is_agentstate_db_at_the_release_version():
    """SPEC §16: the npm package is agentstate-db (agentstate on npm is an unrelated project),
    at the version of the release (the Python distribution's), in package.json and its lock."""
    manifest = json.loads((PACKAGE / "package.json").read_text())
    lock = json.loads((PACKAGE / "package-lock.json").read_text())
    assert (manifest["name"], manifest["version"]) == ("agentstate-db", agentstate.__version__)
    assert (lock["name"], lock["version"]) == ("agentstate-db", agentstate.__version__)
    assert (lock["packages"][""]["name"], lock["packages"][""]["version"]) == (
        "agentstate-db", agentstate.__version__)
