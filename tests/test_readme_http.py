"""The README's HTTP lines, run as written against a real `agentstate serve` (the TypeScript
client's README is run by tests/test_typescript.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess


from .conftest import REPO
from .serverproc import serve

BLOCK = next(b for b in re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S)
             if b.startswith("agentstate serve"))


def test_readme_curl_lines_work(tmp_path):
    assert shutil.which("curl"), "curl is needed to run the README's curl lines"
    db = str(tmp_path / "agentstate.db")
    srv = serve(db)
    try:
        lines = [ln for ln in BLOCK.replace("\\\n", " ").splitlines() if ln.strip()]
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

