"""The README's HTTP section, run as written against a real `agentstate serve`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess


import pytest

from .conftest import REPO
from .serverproc import serve

SECTION = (REPO / "README.md").read_text().split("## Over HTTP", 1)[1].split("\n## ", 1)[0]


def test_readme_curl_lines_work(tmp_path):
    assert shutil.which("curl"), "curl is needed to run the README's curl lines"
    db = str(tmp_path / "agentstate.db")
    srv = serve(db)
    try:
        block = re.search(r"```sh\n(.*?)```", SECTION, re.S).group(1)
        lines = [ln for ln in block.replace("\\\n", " ").splitlines() if ln.strip()]
        assert lines[0].startswith("agentstate serve")  # started above, on a free port
        env = {**os.environ, "AGENTSTATE_DB": db}
        token = subprocess.run(["bash", "-c", lines[1] + ' && echo "$T"'], env=env, text=True,
                               capture_output=True, check=True).stdout.strip()
        env["T"] = token
        port = srv.url.rsplit(":", 1)[1]
        outputs = []
        for line in lines[2:]:
            cmd = line.split("  #")[0].replace("localhost:8765", f"localhost:{port}")
            outputs.append(subprocess.run(["bash", "-c", cmd], env=env, text=True,
                                          capture_output=True, check=True).stdout)
        assert json.loads(outputs[0]) == {"version": 1}
        changes = json.loads(outputs[1])["changes"]
        assert [(c["op"], c["key"]) for c in changes] == [("put", "settings")]
    finally:
        srv.stop()


def test_readme_typescript_fetch_works(tmp_path):
    node = shutil.which("node")
    if node is None and os.environ.get("CI"):
        pytest.fail("node is needed to run the README's fetch snippet")
    if node is None:
        pytest.skip("node is not installed here: the README's fetch snippet was not run")
    srv = serve(str(tmp_path / "agentstate.db"))
    try:
        snippet = re.search(r"```ts\n(.*?)```", SECTION, re.S).group(1)
        script = ("const token = process.argv[1];\n"
                  + snippet.replace("http://host:8765", srv.url)
                  + "\nconsole.log(JSON.stringify({length, version}));\n")
        out = subprocess.run([node, "--input-type=module", "-e", script, srv.token],
                             capture_output=True, text=True, check=True, timeout=60).stdout
        assert json.loads(out) == {"length": 1, "version": 1}
    finally:
        srv.stop()

