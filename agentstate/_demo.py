"""``agentstate demo``: two agent processes sharing one database."""

from __future__ import annotations

import multiprocessing as mp
from typing import Any

from ._database import open

SESSION, AGENT, TURNS = "demo-session", "demo-agent", 25


def worker(path: str, name: str, start: Any) -> None:
    """One agent process: append to the shared history, count visits."""
    start.wait()
    with open(path) as db:
        st = db.state(session=SESSION, agent=AGENT)
        for i in range(TURNS):
            st.session.append("history", [{"role": "assistant", "agent": name, "turn": i}])
            st.agent.update("visits", lambda n: n + 1, default=0)


def run(path: str, echo: Any) -> dict[str, Any]:
    with open(path) as db:
        st = db.state(session=SESSION, agent=AGENT)
        before_len, before_visits = st.session.length("history"), st.agent.get("visits", 0)
        real_path = db.path
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=worker, args=(real_path, f"agent-{n}", start)) for n in (1, 2)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join()
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    with open(path) as db:
        st = db.state(session=SESSION, agent=AGENT)
        history = st.session.slice("history", before_len)
        visits = st.agent.get_versioned("visits")
    per_agent = {f"agent-{n}": sum(1 for h in history if h["agent"] == f"agent-{n}") for n in (1, 2)}
    return {
        "path": real_path,
        "processes": len(procs),
        "failed_processes": len(failed),
        "appended": len(history),
        "history_length": before_len + len(history),
        "per_agent": per_agent,
        "visits_before": before_visits,
        "visits": visits.value,
        "visits_version": visits.version,
        "expected": 2 * TURNS,
    }
