"""Python processes beside MCP clients (tests/test_mcp.py): importable for spawn. Each opens
the store, says it is ready, and waits for ``start``: the test sets it once its MCP clients
are connected too, so all of them race."""

from __future__ import annotations

import agentstate


def increment_field(target: str, n: int, ready, start, results) -> None:
    """``n`` increments of ``{"n": ...}`` at agent:shared/counter, by update()."""
    with agentstate.open(target) as db:
        s = db.scope("agent", "shared")
        s.get("counter")  # connected before the race starts
        ready.put(True)
        start.wait()
        for _ in range(n):
            s.update("counter", lambda v: {**(v or {}), "n": (v or {}).get("n", 0) + 1})
    results.put(n)


def claim(target: str, ready, start, results) -> None:
    """One claim of run r-1's call c-1, as a Python worker would make it."""
    with agentstate.open(target) as db:
        db.runs.head("r-1")
        ready.put(True)
        start.wait()
        results.put(db.runs.claim("r-1", "c-1", lease=300.0).status)
