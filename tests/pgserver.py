"""A throwaway PostgreSQL server for the tests, or the caller's (``$DATABASE_URL``).

``Server.start()`` runs ``initdb`` and ``pg_ctl start`` in a new folder under
the system temp dir, on a free loopback port (as the ``postgres`` user when
running as root: PostgreSQL refuses root), in about a second. Each folder
records the pid of the test run that made it, so a server left behind by a
killed run is stopped and removed by the next one (``sweep``). ``url(schema)``
gives a URL whose connections use that schema: one store per test.

Run by hand: ``python -m tests.pgserver`` starts one and prints its URL until Ctrl-C.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

PREFIX = "agentstate-pg-"
DURABLE = "-c listen_addresses=127.0.0.1 -c max_connections=300"  # the defaults otherwise
# Fast and safe for tests: a clean shutdown (or a killed client) loses nothing
# without fsync; the server is deleted afterwards anyway.
SETTINGS = f"{DURABLE} -c fsync=off -c full_page_writes=off -c shared_buffers=64MB"


def bindir() -> str | None:
    """The folder of initdb and pg_ctl: $PG_BINDIR, the PATH, or Debian's newest version."""
    if os.environ.get("PG_BINDIR"):
        given = os.environ["PG_BINDIR"]
        return given if os.path.exists(os.path.join(given, "initdb")) else None
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(p.split("/")[-3]) if p.split("/")[-3].isdigit() else 0)
    return os.path.dirname(versions[-1]) if versions else None


def _as_postgres() -> list[str]:
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(bin_dir: str) -> None:
    """Stop and remove the servers of test runs that are no longer running."""
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), PREFIX + "*")):
        try:
            owner = int(Path(folder, "owner.pid").read_text())
        except (OSError, ValueError):
            owner = 0
        if owner and _alive(owner):
            continue
        try:
            if not owner and time.time() - os.path.getmtime(folder) < 600:
                continue  # another test run (a pytest-xdist worker) is making it right now
        except OSError:
            continue  # gone already
        data = os.path.join(folder, "data")
        if os.path.exists(os.path.join(data, "postmaster.pid")):
            subprocess.run([*_as_postgres(), os.path.join(bin_dir, "pg_ctl"), "-D", data, "-m",
                            "immediate", "-w", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


class Server:
    """A server this test run started, and stops."""

    def __init__(self, bin_dir: str, settings: str = SETTINGS) -> None:
        self.bin = bin_dir
        self.settings = settings
        self.folder = tempfile.mkdtemp(prefix=PREFIX)
        self.data = os.path.join(self.folder, "data")
        self.log = os.path.join(self.folder, "server.log")
        self.port = 0

    def _run(self, tool: str, *args: str, timeout: float = 120) -> None:
        done = subprocess.run([*_as_postgres(), os.path.join(self.bin, tool), *args],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> Server:
        Path(self.folder, "owner.pid").write_text(str(os.getpid()))
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        self._run("initdb", "-D", self.data, "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8",
                  "-U", "postgres")
        for attempt in range(5):  # a free port may be taken before the server binds it
            self.port = _free_port()
            try:
                self._pg_ctl("start")
                return self
            except RuntimeError:
                if attempt == 4:
                    raise
        return self

    def _pg_ctl(self, action: str, *more: str) -> None:
        self._run("pg_ctl", "-D", self.data, "-l", self.log, "-w", "-t", "60", *more,
                  "-o", f"{self.settings} -p {self.port} -k {self.folder}", action)

    def restart(self) -> None:
        """A fast restart: every client connection is cut, nothing committed is lost."""
        self._pg_ctl("restart", "-m", "fast")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop", timeout=60)
        except (RuntimeError, subprocess.TimeoutExpired):
            pass
        shutil.rmtree(self.folder, ignore_errors=True)

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


def schema_url(base: str, schema: str) -> str:
    """``base`` with its connections' search_path set to ``schema`` alone."""
    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options=-csearch_path%3D{schema}"


def new_schema(admin_url: str) -> str:
    """A new empty schema; its name."""
    import psycopg

    name = "t_" + uuid.uuid4().hex[:16]
    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {name}")
    return name


def drop_schema(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as c:
        c.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def wait_until_up(url: str, timeout: float = 30) -> None:
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


if __name__ == "__main__":  # pragma: no cover - a manual helper
    b = bindir()
    if b is None:
        raise SystemExit("no PostgreSQL binaries found (apt-get install postgresql)")
    sweep(b)
    srv = Server(b).start()
    print(srv.admin_url, flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
