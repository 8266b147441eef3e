"""Functions run in child processes by the multi-process tests (importable for spawn)."""

from __future__ import annotations

import agentstate


def increment(path: str, n: int, start, results) -> None:
    start.wait()
    errors = 0
    with agentstate.open(path) as db:
        s = db.scope("agent", "shared")
        for _ in range(n):
            try:
                s.update("counter", lambda v: v + 1, default=0)
            except Exception:
                errors += 1
    results.put(errors)


def append(path: str, who: int, n: int, start, results) -> None:
    start.wait()
    errors = 0
    with agentstate.open(path) as db:
        s = db.scope("session", "shared")
        for i in range(n):
            try:
                s.append("history", [{"who": who, "i": i}])
            except Exception:
                errors += 1
    results.put(errors)


def history_writer(path: str, who: int, n: int, start, results) -> None:
    """Append n entries to one shared run, racing the others for each next seq."""
    start.wait()
    won = gaps = other = 0
    with agentstate.open(path) as db:
        while won < n:
            tail = db.runs.tail("shared", 1)
            seq = tail[0]["seq"] + 1 if tail else 0
            try:
                db.runs.write("shared", [{"seq": seq, "who": who, "k": won}], {"last": who})
                won += 1
            except agentstate.HistoryGap:
                gaps += 1
            except Exception:
                other += 1
    results.put((who, won, other))
