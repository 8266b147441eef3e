"""An openai-agents function tool wrapped with ``db.runs.once`` keyed by the framework's
tool-call id runs at most once across a crash (SPEC §14, issue 29): a real process is
killed with SIGKILL inside the tool, and the run resumed from its saved ``RunState``
(the approval gate) makes no second effect."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, RunState, function_tool, set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.tool_context import ToolContext
from agents.usage import Usage
from openai.types.responses import (ResponseFunctionToolCall, ResponseOutputMessage,
                                    ResponseOutputText)

import agentstate
from agentstate.integrations.openai_agents import AgentStateSession

from ..callworkers import run_spawned

SID = "chat-1"
RUN = f"tools:{SID}"  # the run that keeps the session's tool calls
LEASE = 1.0  # seconds a claim stays "in progress" (the test waits it out after the kill)


class StubModel(Model):
    """Asks for one ``charge`` under a fresh call id, as a model does each time it is
    asked; answers once the tool's output is in its input."""

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> ModelResponse:
        outputs = [i for i in input if isinstance(i, dict)
                   and i.get("type") == "function_call_output"]
        if outputs:
            out: Any = ResponseOutputMessage(
                id="msg_1", type="message", role="assistant", status="completed",
                content=[ResponseOutputText(text=f"done: {outputs[-1]['output']}",
                                            type="output_text", annotations=[])])
        else:
            out = ResponseFunctionToolCall(
                type="function_call", call_id=f"call_{uuid.uuid4().hex}", name="charge",
                arguments=json.dumps({"cents": 500}), id="fc_1", status="completed")
        return ModelResponse(output=[out], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


def worker(db_path: str, ledger: str, crash: str, resume: bool) -> None:
    """One process: the Runner with a ``charge`` tool that needs approval and appends to
    ``ledger`` (the outside effect) under ``once``; ``crash`` names where it dies."""
    set_tracing_disabled(True)
    session = AgentStateSession(SID, db_path=db_path)
    db = session.db

    def charged(call_id: str) -> bool:
        return Path(ledger).is_file() and call_id in Path(ledger).read_text().split()

    @function_tool(needs_approval=True)
    async def charge(ctx: ToolContext[Any], cents: int) -> str:
        """Charge the customer's card."""
        call_id = ctx.tool_call_id  # the model's id, kept in the saved RunState

        def effect() -> str:
            if crash == "before-effect":
                os.kill(os.getpid(), signal.SIGKILL)
            with open(ledger, "a") as f:  # the payment provider, keyed by the call id
                f.write(call_id + "\n")
                f.flush()
                os.fsync(f.fileno())
            if crash == "after-effect":
                os.kill(os.getpid(), signal.SIGKILL)
            return f"charged {cents}"

        def reconcile(call_id: str, claim: dict[str, Any]) -> Any:
            return f"charged {cents}" if charged(call_id) else agentstate.NOT_RUN

        return await db.runs.aonce(RUN, call_id, effect, reconcile=reconcile,
                                   call={"name": "charge", "cents": cents}, lease=LEASE)

    agent = Agent(name="till", model=StubModel(), tools=[charge])
    pending = db.scope("session", SID)

    async def main() -> None:
        if resume:  # the run the crash interrupted, from the state saved at the gate
            state = await RunState.from_string(agent, pending.get("run-state"))
        else:
            db.runs.write(RUN, [], {"task": f"tool calls of session {SID}"}, create=True)
            result = await Runner.run(agent, "charge me 5 dollars", session=session)
            state = result.to_state()
            pending.put("run-state", state.to_string())  # the approval gate: saved first
        for item in state.get_interruptions():
            state.approve(item)
        result = await Runner.run(agent, state, session=session)
        pending.put("answer", result.final_output)

    asyncio.run(main())
    session.close()


def run(*args: Any) -> int | None:
    return run_spawned(worker, *args)


@pytest.mark.parametrize("crash", ["after-effect", "before-effect"])
def test_tool_killed_mid_call_resumes_without_a_second_effect(tmp_path: Path,
                                                               crash: str) -> None:
    """A function tool killed between its claim and its effect, or between its effect
    and its result, resumes from the saved RunState with its effect made exactly once
    and its result recorded and given to the model."""
    db_path, ledger = str(tmp_path / "agents.db"), str(tmp_path / "ledger")
    assert run(db_path, ledger, crash, False) == -signal.SIGKILL
    with agentstate.open(db_path) as db:
        calls = db.runs.read(RUN).entries
        assert [e["type"] for e in calls] == ["tool_call"]  # claimed, no result
    time.sleep(LEASE)  # past the claim's lease: the call is in doubt, not in progress
    assert run(db_path, ledger, "", True) == 0

    call_id = calls[0]["call_id"]
    assert call_id.startswith("call_")
    assert Path(ledger).read_text().split() == [call_id]  # one effect, under the model's id
    with agentstate.open(db_path) as db:
        entries = db.runs.read(RUN).entries
        assert entries[-1]["type"] == "tool_result" and entries[-1]["result"] == "charged 500"
        assert db.scope("session", SID).get("answer") == "done: charged 500"
