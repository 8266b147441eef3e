"""LangGraph's tool node with a tool wrapped in ``db.runs.once`` keyed by LangGraph's
tool-call id (docs/frameworks.md, SPEC §14): a process killed with SIGKILL in the middle
of the tool resumes the graph without a second effect."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import agentstate

from .langgraph_tool_worker import build, effects_of

ROOT = Path(__file__).resolve().parents[2]
LEASE = 0.5  # seconds the killed worker's claim stays in progress


def worker(db_path: str, effects: str, thread: str, crash: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(agentstate.__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "tests.integrations.langgraph_tool_worker", db_path, effects,
         thread, crash, str(LEASE)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("crash", ["after_effect", "before_effect"])
def test_a_tool_killed_mid_call_resumes_without_a_second_effect(tmp_path, crash):
    """A worker killed between its claim and the effect, or between the effect and its
    result, resumes the graph; the tool's effect happens exactly once."""
    db_path, effects = str(tmp_path / "graph.db"), str(tmp_path / "effects.txt")
    killed = worker(db_path, effects, "order-7", crash)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert effects_of(effects) == (["order-7:call_Xk81"] if crash == "after_effect" else [])
    time.sleep(LEASE + 0.5)  # the dead worker's claim lapses: the call is in doubt
    resumed = worker(db_path, effects, "order-7", "none")
    assert resumed.returncode == 0, resumed.stderr
    assert effects_of(effects) == ["order-7:call_Xk81"]
    assert resumed.stdout.splitlines()[-1] == "done (charged 500: order-7:call_Xk81)"
    with agentstate.open(db_path) as db:
        entries = db.runs.read("order-7").entries
    calls = [(e["type"], e.get("retry"), e.get("status")) for e in entries]
    # the killed claim, then (the effect not found) a new claim that ran it, or (found) the
    # result reconcile gave
    assert calls == ([("tool_call", None, None), ("tool_result", None, "ok")]
                     if crash == "after_effect" else
                     [("tool_call", None, None), ("tool_call", 1, None), ("tool_result", None, "ok")])


def test_a_finished_tool_call_is_not_run_again_by_a_replay(tmp_path):
    """Run to the end, then the tool's step is replayed from the checkpoint before it
    (LangGraph's time travel): the recorded result is returned, nothing runs again."""
    db_path, effects = str(tmp_path / "graph.db"), str(tmp_path / "effects.txt")
    assert worker(db_path, effects, "order-8", "none").returncode == 0
    with agentstate.open(db_path) as db:
        graph = build(db, effects, "none", LEASE)
        config = {"configurable": {"thread_id": "order-8"}}
        before_tool = next(s for s in graph.get_state_history(config) if s.next == ("tools",))
        replayed = graph.invoke(None, before_tool.config, durability="sync")
    assert replayed["messages"][-1].content == "done (charged 500: order-8:call_Xk81)"
    assert effects_of(effects) == ["order-8:call_Xk81"]
