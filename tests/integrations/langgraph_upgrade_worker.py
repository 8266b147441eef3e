"""A LangGraph graph on AgentStateSaver, and a dump of what a saver returns, for
test_langgraph_upgrade.py: run as a script under agentstate 0.2 (PYTHONPATH=<the
0.2 package>) it stores threads in 0.2's layout and dumps what 0.2's saver gives;
imported by the test, the same functions run on the current saver.

    python langgraph_upgrade_worker.py <store> <runs file> <out.json> <expected agentstate dir> [<copy>...]

Each ``<copy>`` is ``<op>=<store>``: a copy of the store (made by the caller after
this wrote it) on which 0.2 runs the operation ``op`` of ``OPS``, and dumps.
"""

from __future__ import annotations

import base64
import json
import operator
import os
import sys
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

BIG = 6000  # bytes of a pending write: over the saver's INLINE, so stored in x. keys
THREADS = ("t-1", "t-2")


class State(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    big: str
    answer: str


def build(saver: Any, runs_file: str) -> Any:
    """START -> first -> sub (a subgraph: its own namespace) -> big | ask -> last.
    ``ask`` interrupts; ``big`` (which notes each run in ``runs_file``) finishes in the
    same step, so its large write is a pending write of the interrupted checkpoint."""

    def inner(state: State) -> State:
        return {"log": ["inner"]}

    sub = StateGraph(State).add_node("inner", inner).add_edge(START, "inner").compile(
        checkpointer=True)

    def first(state: State) -> State:
        return {"log": ["first"]}

    def big(state: State) -> State:
        with open(runs_file, "a") as f:
            f.write("big\n")
        return {"big": "x" * BIG, "log": ["big"]}

    def ask(state: State) -> State:
        return {"answer": interrupt("proceed?"), "log": ["ask"]}

    def last(state: State) -> State:
        return {"log": ["last"]}

    g = StateGraph(State)
    for name, fn in [("first", first), ("sub", sub), ("big", big), ("ask", ask), ("last", last)]:
        g.add_node(name, fn)
    g.add_edge(START, "first").add_edge("first", "sub").add_edge("sub", "big")
    g.add_edge("sub", "ask").add_edge(["big", "ask"], "last").add_edge("last", END)
    return g.compile(checkpointer=saver)


def config(thread: str, run: str | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"configurable": {"thread_id": thread}}
    if run:
        conf["metadata"] = {"run_id": run}  # in each checkpoint's metadata
    return conf


def store_threads(saver: Any, runs_file: str) -> None:
    """t-1 stops at the interrupt (pending writes: big's large one, the interrupt);
    t-2 is resumed to its end (two runs)."""
    graph = build(saver, runs_file)
    graph.invoke({"log": []}, config("t-1", "00000000-0000-4000-8000-000000000001"))
    graph.invoke({"log": []}, config("t-2", "00000000-0000-4000-8000-000000000002"))
    graph.invoke(Command(resume="no"), config("t-2", "00000000-0000-4000-8000-000000000003"))


# -- what a saver returns --------------------------------------------------------------


def dump(saver: Any) -> dict[str, Any]:
    """What the saver's reads return for every thread it has, comparably (values as
    the serde's bytes)."""

    def canonical(value: Any) -> Any:  # a set's order changes with the process's str hashes
        if isinstance(value, (set, frozenset)):
            return ("set", sorted((canonical(v) for v in value), key=repr))
        if isinstance(value, (list, tuple)):
            return type(value)(canonical(v) for v in value)
        if isinstance(value, dict):
            return {k: canonical(v) for k, v in value.items()}
        return value

    def enc(value: Any) -> list[str]:
        t, data = saver.serde.dumps_typed(canonical(value))
        return [t, base64.b64encode(data).decode("ascii")]

    def tup(t: Any) -> dict[str, Any] | None:
        if t is None:
            return None
        checkpoint = {k: v for k, v in t.checkpoint.items() if k != "channel_values"}
        checkpoint["channel_values"] = {ch: enc(v) for ch, v in t.checkpoint["channel_values"].items()}
        return json.loads(json.dumps({
            "config": t.config, "checkpoint": checkpoint, "metadata": t.metadata,
            "parent": t.parent_config,
            "writes": [[task, ch, enc(v)] for task, ch, v in t.pending_writes or []]}))

    def lst(conf: Any, **kw: Any) -> list[Any]:
        return [tup(t) for t in saver.list(conf, **kw)]

    out: dict[str, Any] = {"all": lst(None), "all limit 3": lst(None, limit=3),
                           "all loop": lst(None, filter={"source": "loop"})}
    threads = sorted({t["config"]["configurable"]["thread_id"] for t in out["all"]})
    for thread in threads:
        conf = config(thread)
        every = lst(conf)
        spaces = sorted({t["config"]["configurable"]["checkpoint_ns"] for t in every})
        out[thread] = {
            "list": every,
            "namespaces": spaces,
            "limit 2": lst(conf, limit=2),
            "filter": lst(conf, filter={"source": "loop", "step": 1}),
            "before": lst(conf, before=every[2]["config"] if len(every) > 2 else None),
            "latest": {ns: tup(saver.get_tuple({"configurable": {"thread_id": thread,
                                                                 "checkpoint_ns": ns}}))
                       for ns in spaces},
            "each": [tup(saver.get_tuple(t["config"])) for t in every],
            "by ns": {ns: lst({"configurable": {"thread_id": thread, "checkpoint_ns": ns}})
                      for ns in spaces},
        }
    return out


RUNS = ["00000000-0000-4000-8000-000000000002"]
OPS = {
    "delete_thread": lambda saver: saver.delete_thread("t-1"),
    "delete_for_runs": lambda saver: saver.delete_for_runs(RUNS),
    "prune": lambda saver: saver.prune(list(THREADS)),
    "copy_thread": lambda saver: saver.copy_thread("t-1", "t-3"),
}


def main() -> None:
    store, runs_file, out_file, expected, *copies = sys.argv[1:]
    import agentstate
    from agentstate.integrations.langgraph import AgentStateSaver

    here = os.path.dirname(os.path.abspath(agentstate.__file__))
    if not here.startswith(os.path.abspath(expected)):
        raise SystemExit(f"imported agentstate from {here}, not from {expected}")
    result: dict[str, Any] = {"agentstate": here}
    if not copies:
        with agentstate.open(store) as db:
            store_threads(AgentStateSaver(db), runs_file)
            result["dump"] = dump(AgentStateSaver(db))
    for item in copies:
        op, path = item.split("=", 1)
        with agentstate.open(path) as db:
            OPS[op](AgentStateSaver(db))
            result[op] = dump(AgentStateSaver(db))
    with open(out_file, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
