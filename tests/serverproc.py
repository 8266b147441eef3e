"""A real ``agentstate serve`` process for the tests: started on a free loopback port, stopped after."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    url: str
    token: str  # the admin token serve made
    db: str
    proc: subprocess.Popen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(20)


def serve(db: str, timeout: float = 60.0, args: tuple[str, ...] = ()) -> Served:
    """Serve ``db``, a path with no tokens yet: serve makes an admin token and prints it.
    ``args``: more options of serve."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentstate", "--db", db, "serve", "--port", str(port),
                             *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "AGENTSTATE_DB"})
    line = proc.stdout.readline()  # "No token existed: ..." then the token
    assert line.startswith("No token existed"), line
    token = proc.stdout.readline().strip()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:  # the port taken meanwhile, say
            raise RuntimeError(f"serve exited: {proc.stderr.read()}")
        try:  # ours, not whatever took the port: it knows the token it printed
            if httpx.get(url + "/v1/changes/head", timeout=2,
                         headers={"authorization": f"Bearer {token}"}).status_code == 200:
                return Served(url, token, db, proc)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("serve did not answer in time")
