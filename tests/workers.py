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
