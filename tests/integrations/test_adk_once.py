"""An ADK tool wrapped with ``db.runs.once`` keyed by ADK's function-call id runs at most
once across a crash (SPEC §14, issue 29): a real process is killed with SIGKILL inside the
tool, and the invocation resumed by ADK's own resumability runs no second effect."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from google.adk.agents import LlmAgent
from google.adk.apps import App, ResumabilityConfig
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.tools.tool_context import ToolContext
from google.genai import types

import agentstate
from agentstate.integrations.adk import AgentStateSessionService

from ..callworkers import run_spawned

APP, USER, SID = "shop", "ada", "s-1"
LEASE = 1.0  # seconds a claim stays "in progress" (the test waits it out after the kill)


class StubModel(BaseLlm):
    """Asks for one call of ``charge``, then answers once the tool's result is in."""

    async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
        last = llm_request.contents[-1].parts[0]
        if last.function_response is not None:
            yield LlmResponse(content=types.Content(role="model", parts=[
                types.Part(text=f"done: {last.function_response.response}")]))
        else:
            yield LlmResponse(content=types.Content(role="model", parts=[types.Part(
                function_call=types.FunctionCall(name="charge", args={"cents": 500}))]))


def worker(db_path: str, ledger: str, crash: str, resume: bool) -> None:
    """One process: the Runner, with a ``charge`` tool that appends to ``ledger`` (the
    outside effect) under ``once``; ``crash`` names where it kills itself."""
    service = AgentStateSessionService(db_path)
    db = service.db

    def charged(call_id: str) -> bool:
        return Path(ledger).is_file() and call_id in Path(ledger).read_text().split()

    async def charge(cents: int, tool_context: ToolContext) -> dict[str, Any]:
        run_id = f"adk-tools:{tool_context.session.id}"
        try:
            db.runs.write(run_id, [], {"task": "the session's tool calls"}, create=True)
        except agentstate.RunExists:
            pass
        call_id = tool_context.function_call_id  # ADK's id, kept in the session's events

        def effect() -> dict[str, Any]:
            if crash == "before-effect":
                os.kill(os.getpid(), signal.SIGKILL)
            with open(ledger, "a") as f:  # the payment provider, keyed by the call id
                f.write(call_id + "\n")
                f.flush()
                os.fsync(f.fileno())
            if crash == "after-effect":
                os.kill(os.getpid(), signal.SIGKILL)
            return {"charged": cents}

        def reconcile(call_id: str, claim: dict[str, Any]) -> Any:
            return {"charged": cents} if charged(call_id) else agentstate.NOT_RUN

        return await db.runs.aonce(run_id, call_id, effect, reconcile=reconcile,
                                   call={"name": "charge", "cents": cents}, lease=LEASE)

    async def main() -> None:
        agent = LlmAgent(name="till", model=StubModel(model="stub"), tools=[charge])
        app = App(name=APP, root_agent=agent,
                  resumability_config=ResumabilityConfig(is_resumable=True))
        runner = Runner(app=app, session_service=service)
        if resume:  # the invocation the crash left unfinished, as ADK resumes it
            session = await service.get_session(app_name=APP, user_id=USER, session_id=SID)
            events = runner.run_async(user_id=USER, session_id=SID,
                                      invocation_id=session.events[-1].invocation_id)
        else:
            await service.create_session(app_name=APP, user_id=USER, session_id=SID)
            events = runner.run_async(user_id=USER, session_id=SID, new_message=types.Content(
                role="user", parts=[types.Part(text="charge me 5 dollars")]))
        async for _ in events:
            pass
        await service.close()

    asyncio.run(main())


def run(*args: Any) -> int | None:
    return run_spawned(worker, *args)


@pytest.mark.parametrize("crash", ["after-effect", "before-effect"])
def test_tool_killed_mid_call_resumes_without_a_second_effect(tmp_path: Path,
                                                               crash: str) -> None:
    """A tool killed between its claim and its effect, or between its effect and its
    result, resumes (ADK's resumable invocation, replaying the same function call)
    with its effect made exactly once and its result recorded."""
    db_path, ledger = str(tmp_path / "adk.db"), str(tmp_path / "ledger")
    assert run(db_path, ledger, crash, False) == -signal.SIGKILL
    with agentstate.open(db_path) as db:
        calls = db.runs.read(f"adk-tools:{SID}").entries
        assert [e["type"] for e in calls] == ["tool_call"]  # claimed, no result
    time.sleep(LEASE)  # past the claim's lease: the call is in doubt, not in progress
    assert run(db_path, ledger, "", True) == 0

    call_id = calls[0]["call_id"]
    assert Path(ledger).read_text().split() == [call_id]  # one effect, under ADK's id
    with agentstate.open(db_path) as db:
        entries = db.runs.read(f"adk-tools:{SID}").entries
        assert entries[-1]["type"] == "tool_result" and entries[-1]["result"] == {
            "charged": 500}
        session = asyncio.run(AgentStateSessionService(db).get_session(
            app_name=APP, user_id=USER, session_id=SID))
    parts = [p for e in session.events if e.content for p in e.content.parts]
    assert [(p.function_response.id, p.function_response.response) for p in parts
            if p.function_response] == [(call_id, {"charged": 500})]
    assert parts[-1].text == "done: {'charged': 500}"
