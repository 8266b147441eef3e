"""Child processes of the at-most-once and fencing tests (importable for spawn).

A target is what ``open_target`` opens: a file path, a ``postgresql://`` URL, or
``http://...#TOKEN`` for a store behind ``agentstate serve``.
"""

from __future__ import annotations

import os
from typing import Any

import agentstate


def open_target(target: str) -> agentstate.Database:
    if target.startswith("http"):
        url, _, token = target.partition("#")
        return agentstate.connect(url, token=token)
    return agentstate.open(target)


def effect(path: str, line: str) -> str:
    """The outside effect of a tool call: one line appended to a file (O_APPEND: whole)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return line


def effects(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def race_once(target: str, run_id: str, call_ids: list[str], out: str, barrier, results) -> None:
    """Call once() for each call id at the same moment as the other processes; put how
    each call ended here (ran, done, in_progress)."""
    ended = []
    with open_target(target) as db:
        for call_id in call_ids:
            barrier.wait()
            ran = []

            def fn(call_id: str = call_id) -> str:
                ran.append(1)
                return effect(out, call_id)

            try:
                db.runs.once(run_id, call_id, fn)
                ended.append("ran" if ran else "done")
            except agentstate.CallInProgress:
                ended.append("in_progress")
    results.put(ended)


def once_loop(target: str, run_id: str, n: int, out: str) -> None:
    """once() for calls 0..n-1 in order, each with a reconcile that looks at the outside
    effect: killed at any moment, a rerun of this loop does every effect exactly once."""
    with open_target(target) as db:
        db.runs.head(run_id)  # connected
        print("started", flush=True)
        for i in range(n):
            call_id = f"c{i}"

            def reconcile(cid: str, entry: dict) -> object:
                return cid if cid in effects(out) else agentstate.NOT_RUN

            db.runs.once(run_id, call_id, lambda cid=call_id: effect(out, cid),
                         reconcile=reconcile, lease=0.5)


def fenced_worker(target: str, session_id: str, lease: float, ready, resume, results) -> None:
    """Start a turn with a short lease and write fenced by it; signal ready; stop (the test
    SIGSTOPs it past its lease, another worker takes over, then SIGCONTs it); then try
    to write again with the same fence. Puts which later writes landed."""
    try:
        _fenced_worker(target, session_id, lease, ready, resume, results)
    except BaseException as e:  # the test says what went wrong instead of waiting
        results.put({"worker failed": f"{type(e).__name__}: {e}"})
        raise


def _fenced_worker(target: str, session_id: str, lease: float, ready, resume, results) -> None:
    with open_target(target) as db:
        p = agentstate.Principal("worker")
        turn = db.sessions.start_turn(session_id, p, lease=lease)
        st = db.state(session=session_id, fence=turn)
        st.session.put("owner", "first")
        ready.set()
        resume.wait()
        outcome = {}
        for name, write in (
            ("put", lambda: st.session.put("owner", "stale")),
            ("append", lambda: st.session.append("log", ["stale"])),
            ("delete", lambda: st.session.delete("owner")),
            ("update", lambda: st.session.update("n", lambda v: v + 1, default=0)),
            ("run", lambda: db.runs.write("r", [{"seq": 0, "by": "stale"}], None, create=True,
                                          fence=turn)),
            ("claim", lambda: db.runs.claim("shared", "x", fence=turn)),
        ):
            try:
                write()
                outcome[name] = "landed"
            except agentstate.LeaseLost:
                outcome[name] = "lease_lost"
        results.put(outcome)


def run_spawned(target: Any, *args: Any, timeout: float = 120) -> int | None:
    """target(*args) in a spawned process; its exit code (-9: it SIGKILLed itself)."""
    import multiprocessing as mp

    p = mp.get_context("spawn").Process(target=target, args=args)
    p.start()
    p.join(timeout)
    assert not p.is_alive(), "the worker hung"
    return p.exitcode
