"""Two copies of SQLite in one process: Python's ``sqlite3`` beside agentstate (issue 26, item 28).

    python -m benchmarks.two_sqlites inprocess [--runs 5] [--seconds 30] [--shim S]
    python -m benchmarks.two_sqlites processes [--runs 3] [--seconds 20] [--shim S]
    python -m benchmarks.two_sqlites reopen [--runs 2] [--seconds 15] [--shim S]
    python -m benchmarks.two_sqlites cost [--runs 5] [--shim S]
    python -m benchmarks.two_sqlites sitecustomize DIR --shim S   # then PYTHONPATH=DIR:... pytest

- inprocess: a thread writes through agentstate while the main thread loops
  ``sqlite3.connect(path)``, a SELECT, ``close()``. Stops at the first failure of
  either side: how (SIGBUS, malformed, Damaged) and when.
- processes: the same in process A, while two other processes (plain agentstate,
  no ``sqlite3``) increment counters with ``update()``; then a fresh process
  checks that every acknowledged value is there and runs ``PRAGMA integrity_check``.
- reopen: one ``sqlite3`` connection kept open, reading a counter, while a thread
  opens agentstate, writes and closes it again and again: stale reads, SIGBUS.
- cost: puts and gets per second, one thread and four, CPU microseconds per call.

``--shim`` changes how agentstate's SQLite (apsw) locks, in every process of the run:
``none``; ``ofd``: its fcntl() replaced (``xSetSystemCall``) by a C function that
turns F_SETLK/F_SETLKW/F_GETLK into Linux's open-file-description locks (needs a C
compiler); ``ofd-py``: the same as a ctypes callback, in Python; ``guard``: agentstate's
locks unchanged, plus OFD read locks of our own on the database's SHARED range and
the -shm's DMS byte, held while it is open. See TWO-SQLITES.md.
"""

from __future__ import annotations

import argparse
import ctypes
import fcntl
import multiprocessing as mp
import os
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time

import agentstate

SHIM_ENV = "AGENTSTATE_TWO_SQLITES_SHIM"
_keep: list[object] = []

OFD_C = r"""
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdarg.h>
int ofd_fcntl(int fd, int cmd, ...) {
    va_list ap; va_start(ap, cmd); void *arg = va_arg(ap, void *); va_end(ap);
    if (cmd == F_GETLK || cmd == F_SETLK || cmd == F_SETLKW) {
        struct flock *fl = arg;
        fl->l_pid = 0;  /* OFD locks require it */
        return fcntl(fd, cmd == F_GETLK ? F_OFD_GETLK : cmd == F_SETLK ? F_OFD_SETLK : F_OFD_SETLKW, fl);
    }
    return fcntl(fd, cmd, arg);
}
"""


def install_shim(kind: str) -> None:
    """Replace the fcntl() of apsw's SQLite (one table for every unix VFS of the process)."""
    import apsw

    if kind in ("none", "guard"):
        return
    vfs = apsw.VFS("two-sqlites-shim", base="unix")
    if kind == "ofd":
        folder = tempfile.mkdtemp()
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", f"{folder}/ofd.so", "-x", "c", "-"],
                       input=OFD_C.encode(), check=True)
        lib = ctypes.CDLL(f"{folder}/ofd.so")
        pointer = ctypes.cast(lib.ofd_fcntl, ctypes.c_void_p).value
        _keep.append(lib)
    elif kind == "ofd-py":
        libc = ctypes.CDLL(None, use_errno=True)
        real = libc.fcntl
        real.argtypes, real.restype = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p], ctypes.c_int
        errno_at = libc.__errno_location
        errno_at.restype = ctypes.POINTER(ctypes.c_int)
        ofd = {fcntl.F_GETLK: fcntl.F_OFD_GETLK, fcntl.F_SETLK: fcntl.F_OFD_SETLK,
               fcntl.F_SETLKW: fcntl.F_OFD_SETLKW}

        def shim(fd: int, cmd: int, arg: int) -> int:
            if cmd in ofd:
                ctypes.c_int.from_address(arg + 24).value = 0  # struct flock's l_pid (x86-64)
                cmd = ofd[cmd]
            r = real(fd, cmd, arg)
            if r == -1:
                errno_at()[0] = ctypes.get_errno()
            return r

        callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p)(shim)
        pointer = ctypes.cast(callback, ctypes.c_void_p).value
        _keep.append(callback)
    else:
        raise SystemExit(f"unknown shim {kind!r}")
    _keep.append(vfs)
    if not vfs.xSetSystemCall("fcntl", pointer):
        raise SystemExit("cannot replace fcntl")


def guard(path: str) -> None:
    """With --shim guard: OFD read locks on the db's SHARED range and the -shm's DMS byte."""
    if os.environ.get(SHIM_ENV) != "guard":
        return
    # SQLite's SHARED range (PENDING_BYTE + 2, 510 bytes) and UNIX_SHM_DMS ((22 + 8) * 4 + 8).
    for name, start, length in ((path, 0x40000002, 510), (path + "-shm", 128, 1)):
        fd = os.open(name, os.O_RDWR | os.O_CLOEXEC)
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_RDLCK, 0, start, length, 0))
        _keep.append(fd)


install_shim(os.environ.get(SHIM_ENV, "none"))


# -- one run each, in a process of its own (a SIGBUS ends only that run) ----------------

def run_inprocess(path: str, seconds: float) -> None:
    db = agentstate.open(path)
    guard(path)
    stop, failed, writes = threading.Event(), [], [0]
    t0 = time.monotonic()

    def writer() -> None:
        kv, i = db.scope("app", "x"), 0
        try:
            while not stop.is_set():
                i += 1
                kv.put(f"k{i % 100}", {"i": i, "pad": "x" * 200})
                writes[0] = i
        except agentstate.AgentStateError as e:
            failed.append(f"agentstate {type(e).__name__} after {time.monotonic() - t0:.2f} s: {e}")

    t = threading.Thread(target=writer)
    t.start()
    loops = 0
    try:
        while time.monotonic() - t0 < seconds and not failed:
            c = sqlite3.connect(path)
            c.execute("SELECT count(*), max(version) FROM kv").fetchone()
            c.close()
            loops += 1
    except sqlite3.Error as e:
        failed.append(f"sqlite3 {type(e).__name__} after {time.monotonic() - t0:.2f} s: {e}")
    stop.set()
    t.join()
    print(f"{failed[0] if failed else 'no failure'}; {loops} sqlite3 loops, {writes[0]} writes",
          flush=True)


def _counter(path: str, name: str, seconds: float, out) -> None:
    db = agentstate.open(path)
    kv, acked, err, t0 = db.scope("app", name), 0, None, time.monotonic()
    try:
        while time.monotonic() - t0 < seconds:
            v = kv.update("n", lambda n: n + 1, default=0)
            if v != acked + 1:
                err = f"update returned {v} after {acked}"
                break
            acked = v
    except agentstate.AgentStateError as e:
        err = f"{type(e).__name__}: {e}"
    out.put((name, acked, err))


def run_processes(path: str, seconds: float) -> None:
    db = agentstate.open(path)
    guard(path)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    others = [ctx.Process(target=_counter, args=(path, f"b{i}", seconds, out)) for i in range(2)]
    for p in others:
        p.start()
    stop, acked, errors = threading.Event(), [0], []

    def writer() -> None:
        kv = db.scope("app", "a")
        try:
            while not stop.is_set():
                kv.put("n", acked[0] + 1)
                acked[0] += 1
        except agentstate.AgentStateError as e:
            errors.append(f"A: {type(e).__name__}: {e}")

    t = threading.Thread(target=writer)
    t.start()
    t0, sqlite_errors = time.monotonic(), 0
    while time.monotonic() - t0 < seconds and not errors:
        try:
            c = sqlite3.connect(path)
            c.execute("SELECT count(*) FROM kv").fetchone()
            c.close()
        except sqlite3.Error:
            sqlite_errors += 1
    stop.set()
    t.join()
    results = [out.get(timeout=300) for _ in others] + [("a", acked[0], errors[0] if errors else None)]
    for p in others:
        p.join()
    db.close()
    check = ("import agentstate, sys, json\n"
             "db = agentstate.open(sys.argv[1])\n"
             "got = {}\n"
             "for name in ('a', 'b0', 'b1'):\n"
             "    try: got[name] = db.scope('app', name).get('n')\n"
             "    except agentstate.AgentStateError as e: got[name] = type(e).__name__\n"
             "ic = db._store.conn().execute('PRAGMA integrity_check').fetchall()\n"
             "lines = [line for row in ic for line in row[0].splitlines()]\n"
             "print(json.dumps([got, lines[0] if lines == ['ok'] else f'{len(lines)} lines, {lines[-1]}']))\n")
    import json

    r = subprocess.run([sys.executable, "-c", check, path], capture_output=True, text=True,
                       env={**os.environ, SHIM_ENV: "none"})
    try:
        got, integrity = json.loads(r.stdout)
    except ValueError:
        got, integrity = {}, f"the check itself failed: {r.stderr.strip().splitlines()[-1:]}"
    lost = [f"{n} acked {a} stored {got.get(n)}" for n, a, _ in results
            if not isinstance(got.get(n), int) or got[n] < a]
    print(f"errors: {[e for _, _, e in results if e] or 'none'}; sqlite3 errors {sqlite_errors}; "
          f"lost: {lost or 'none'}; integrity_check: {integrity}", flush=True)


def run_reopen(path: str, seconds: float) -> None:
    agentstate.open(path).close()
    stop, done, errors = threading.Event(), [0], []

    def cycle() -> None:
        i = 0
        try:
            while not stop.is_set():
                with agentstate.open(path) as db:
                    guard(path)
                    for _ in range(10):
                        i += 1
                        db.scope("app", "x").put("n", i)
                done[0] = i
        except agentstate.AgentStateError as e:
            errors.append(f"{type(e).__name__}: {e}")

    t = threading.Thread(target=cycle)
    t.start()
    c, stale, worst, t0 = sqlite3.connect(path), 0, 0, time.monotonic()
    while time.monotonic() - t0 < seconds and not errors:
        before = done[0]
        row = c.execute("SELECT value FROM state WHERE scope_id = 'x' AND key = 'n'").fetchone()
        behind = before - (int(row[0]) if row else 0)
        if behind > 0:
            stale, worst = stale + 1, max(worst, behind)
    stop.set()
    t.join()
    print(f"agentstate errors: {errors or 'none'}; stale reads {stale} (up to {worst} commits behind)",
          flush=True)


def run_cost(path: str, threads: int, n: int = 3000) -> None:
    db = agentstate.open(path, durability="normal")

    def work(k: int) -> None:
        kv = db.scope("app", f"t{k}")
        for i in range(n):
            kv.put(f"k{i % 50}", i)

    c0, w0 = time.process_time(), time.perf_counter()
    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    put_cpu = (time.process_time() - c0) / (n * threads) * 1e6
    kv = db.scope("app", "t0")
    c0 = time.process_time()
    for i in range(n * 3):
        kv.get(f"k{i % 50}")
    get_cpu = (time.process_time() - c0) / (n * 3) * 1e6
    print(f"threads {threads}: put {put_cpu:.1f} us CPU, get {get_cpu:.2f} us CPU "
          f"({(time.perf_counter() - w0):.1f} s)", flush=True)


# -- the driver ------------------------------------------------------------------------------

def one(mode: str, shim: str, seconds: float, extra: str = "") -> str:
    folder = tempfile.mkdtemp()
    r = subprocess.run([sys.executable, "-m", "benchmarks.two_sqlites", "_one", mode,
                        os.path.join(folder, "a.db"), str(seconds), extra],
                       capture_output=True, text=True, env={**os.environ, SHIM_ENV: shim},
                       timeout=seconds * 10 + 300)
    if r.returncode < 0:
        return f"killed by signal {-r.returncode} ({'SIGBUS' if -r.returncode == 7 else ''})"
    if r.returncode:
        return f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}"
    return r.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("mode", choices=["inprocess", "processes", "reopen", "cost", "sitecustomize", "_one"])
    p.add_argument("args", nargs="*")
    p.add_argument("--shim", default="none", choices=["none", "ofd", "ofd-py", "guard"])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20)
    a = p.parse_args()
    if a.mode == "_one":
        mode, path, seconds = a.args[0], a.args[1], float(a.args[2])
        if mode == "cost":
            run_cost(path, int(a.args[3]))
        else:
            {"inprocess": run_inprocess, "processes": run_processes, "reopen": run_reopen}[mode](
                path, seconds)
        return
    if a.mode == "sitecustomize":
        folder = a.args[0]
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "sitecustomize.py"), "w") as f:
            f.write(f"import os\nos.environ.setdefault({SHIM_ENV!r}, {a.shim!r})\n"
                    f"import sys\nsys.path.insert(0, {os.getcwd()!r})\n"
                    "import benchmarks.two_sqlites  # installs the shim\n")
        print(f"PYTHONPATH={folder}:$PYTHONPATH python -m pytest ...  (shim {a.shim} in every process)")
        return
    print(f"{a.mode}, shim {a.shim}: SQLite {__import__('apsw').sqlite_lib_version()} (apsw) "
          f"beside {sqlite3.sqlite_version} (sqlite3)")
    for i in range(a.runs):
        if a.mode == "cost":
            for threads in (1, 4):
                print(f"  run {i + 1}: {one('cost', a.shim, 0, str(threads))}", flush=True)
        else:
            print(f"  run {i + 1}: {one(a.mode, a.shim, a.seconds)}", flush=True)


if __name__ == "__main__":
    main()
