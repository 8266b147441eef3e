"""A LangGraph graph whose tool runs at most once (docs/frameworks.md, issue 29), as a
process of its own for test_langgraph_once.py:

    python -m tests.integrations.langgraph_tool_worker DB EFFECTS THREAD CRASH LEASE

runs (or resumes) the graph on thread THREAD of the agentstate file DB with
``AgentStateSaver``; the tool appends one line to the file EFFECTS (its outside
effect), wrapped in ``db.runs.once`` keyed by LangGraph's tool-call id. CRASH is
``before_effect`` or ``after_effect`` (the process SIGKILLs itself at that point of
the tool, its claim on disk and its result not) or ``none``. Prints the final
messages' text, one per line.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

import agentstate
from agentstate.integrations.langgraph import AgentStateSaver

from ..callworkers import effect, effects as effects_of  # noqa: F401  (the tests read effects_of)


def build(db: agentstate.Database, effects: str, crash: str, lease: float) -> Any:
    @tool
    def charge(cents: int, tool_call_id: Annotated[str, InjectedToolCallId],
               config: RunnableConfig) -> str:
        """Charge the customer."""
        run_id = config["configurable"]["thread_id"]

        def run() -> dict[str, Any]:
            if crash == "before_effect":
                os.kill(os.getpid(), signal.SIGKILL)
            effect(effects, f"{run_id}:{tool_call_id}")
            if crash == "after_effect":
                os.kill(os.getpid(), signal.SIGKILL)
            return {"receipt": f"{run_id}:{tool_call_id}"}

        def reconcile(call_id: str, entry: dict[str, Any]) -> Any:
            """Asks the outside world (the effects file) by the call's idempotency key."""
            key = f"{run_id}:{call_id}"
            return {"receipt": key} if key in effects_of(effects) else agentstate.NOT_RUN

        got = db.runs.once(run_id, tool_call_id, run, call={"name": "charge", "cents": cents},
                           reconcile=reconcile, lease=lease)
        return f"charged {cents}: {got['receipt']}"

    def model(state: MessagesState) -> dict[str, Any]:
        """A stand-in model: asks for the charge, then answers once it has the result."""
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage(f"done ({state['messages'][-1].content})")]}
        return {"messages": [AIMessage("", tool_calls=[
            {"name": "charge", "args": {"cents": 500}, "id": "call_Xk81", "type": "tool_call"}])]}

    b = StateGraph(MessagesState)
    b.add_node("model", model)
    b.add_node("tools", ToolNode([charge]))
    b.add_edge(START, "model")
    b.add_conditional_edges("model", tools_condition)
    b.add_edge("tools", "model")
    return b.compile(checkpointer=AgentStateSaver(db))


def main() -> None:
    path, effects, thread, crash, lease = sys.argv[1:6]
    with agentstate.open(path) as db:
        try:
            db.runs.write(thread, [], {"langgraph_thread": thread}, create=True)
            db.runs.pin(thread)
        except agentstate.RunExists:
            pass
        graph = build(db, effects, crash, float(lease))
        config = {"configurable": {"thread_id": thread}}
        resume = graph.get_state(config).next  # a step left to run: resume it
        start = None if resume else {"messages": [HumanMessage("charge me 5 dollars")]}
        out = graph.invoke(start, config, durability="sync")
        for m in out["messages"]:
            print(m.content)


if __name__ == "__main__":
    main()
