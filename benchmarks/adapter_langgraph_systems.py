"""The systems benchmarks/adapter_langgraph.py compares, and its end-to-end graph.

A ``Pair`` is one comparison: agentstate's saver and store beside LangGraph's own, on
one backend, each on its own file (SQLite) or schema (PostgreSQL), with the same
durability: SQLite in WAL mode with synchronous=FULL (LangGraph's SqliteStore is put
in WAL mode too: its default, the rollback journal, would flatter us), PostgreSQL with
the server's defaults (fsync on, synchronous_commit on) for both.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

import agentstate
from agentstate.integrations.langgraph import AgentStateSaver, AgentStateStore

MESSAGE = "The quick brown fox jumps over the lazy dog. " * 4 + "1234567890ab"  # 200 characters


class Pair:
    """agentstate's and LangGraph's saver (sync and async) and store on one backend."""

    theirs = "LangGraph"

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.sync: dict[str, Any] = {}
        self.aio: dict[str, Any] = {}
        self.stores: dict[str, Any] = {}
        self._exits: list[Callable[[], Any]] = []

    def _enter(self, cm: Any) -> Any:
        got = cm.__enter__()
        self._exits.append(lambda: cm.__exit__(None, None, None))
        return got

    def _aenter(self, cm: Any) -> Any:
        got = self.loop.run_until_complete(cm.__aenter__())
        self._exits.append(lambda: self.loop.run_until_complete(cm.__aexit__(None, None, None)))
        return got

    def settle(self) -> None:
        """After a bulk load, before timing: what the database would have done by itself
        a little later (PostgreSQL's autovacuum gathers the new tables' statistics)."""

    def close(self) -> None:
        for fn in reversed(self._exits):
            fn()
        self.loop.close()


class SqlitePair(Pair):
    theirs = "LangGraph SQLite"

    def __init__(self, folder: str) -> None:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
        from langgraph.store.sqlite import SqliteStore

        super().__init__()
        db = agentstate.open(os.path.join(folder, "agentstate.db"))
        self._exits.append(db.close)
        conn = sqlite3.connect(os.path.join(folder, "langgraph.db"), check_same_thread=False)
        conn.execute("PRAGMA synchronous=FULL")
        self._exits.append(conn.close)
        aio = self._aenter(AsyncSqliteSaver.from_conn_string(os.path.join(folder, "langgraph.db")))
        self.loop.run_until_complete(aio.setup())
        self.loop.run_until_complete(aio.conn.execute("PRAGMA synchronous=FULL"))
        store = self._enter(SqliteStore.from_conn_string(os.path.join(folder, "store-langgraph.db")))
        store.conn.execute("PRAGMA journal_mode=WAL")
        store.conn.execute("PRAGMA synchronous=FULL")
        store.setup()
        self.sync = {"agentstate": AgentStateSaver(db), "langgraph": SqliteSaver(conn)}
        self.aio = {"agentstate": self.sync["agentstate"], "langgraph": aio}
        self.stores = {"agentstate": AgentStateStore(db), "langgraph": store}


class PostgresPair(Pair):
    theirs = "LangGraph PostgreSQL"

    def __init__(self, fresh: Callable[[], str]) -> None:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        from langgraph.store.postgres import PostgresStore
        from psycopg.rows import dict_row

        super().__init__()
        self.urls = [fresh(), fresh(), fresh()]
        db = agentstate.open(self.urls[0])
        self._exits.append(db.close)
        theirs = self.urls[1]
        conn = psycopg.connect(theirs, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        self._exits.append(conn.close)
        saver = PostgresSaver(conn)
        saver.setup()
        aio = self._aenter(AsyncPostgresSaver.from_conn_string(theirs))
        store = self._enter(PostgresStore.from_conn_string(self.urls[2]))
        store.setup()
        self.sync = {"agentstate": AgentStateSaver(db), "langgraph": saver}
        self.aio = {"agentstate": self.sync["agentstate"], "langgraph": aio}
        self.stores = {"agentstate": AgentStateStore(db), "langgraph": store}

    def settle(self) -> None:
        """ANALYZE every table of the three schemas: until autovacuum has, a table filled
        a moment ago has no statistics and the planner may scan where it would probe."""
        import psycopg

        for url in self.urls:
            with psycopg.connect(url, autocommit=True) as c:
                for (table,) in c.execute("SELECT tablename FROM pg_tables "
                                          "WHERE schemaname = current_schema()").fetchall():
                    c.execute(f'ANALYZE "{table}"')


# -- a graph step end to end ---------------------------------------------------------------


class ChatState(TypedDict):
    messages: Annotated[list, add_messages]
    turn: int


def _listen(state: ChatState) -> dict[str, Any]:
    return {"turn": state.get("turn", 0) + 1}


def _remember(state: ChatState) -> dict[str, Any]:
    """Keeps a memory of the turn and reads the newest few back, as an agent's memory node."""
    store = get_store()
    ns = ("memories", "user-1")
    store.put(ns, f"turn-{state['turn']}", {"text": MESSAGE, "turn": state["turn"]})
    store.search(ns, limit=5)
    return {}


def _reply(state: ChatState) -> dict[str, Any]:
    return {"messages": [AIMessage(MESSAGE, id=f"a{state['turn']}")]}


def graph(saver: Any, store: Any) -> Any:
    """Three nodes in a row (listen, remember, reply), with a checkpointer and a store."""
    b = StateGraph(ChatState)
    b.add_node("listen", _listen)
    b.add_node("remember", _remember)
    b.add_node("reply", _reply)
    b.add_edge(START, "listen")
    b.add_edge("listen", "remember")
    b.add_edge("remember", "reply")
    b.add_edge("reply", END)
    return b.compile(checkpointer=saver, store=store)


class Chat:
    """One conversation: each turn is one ``invoke`` (three node steps, four checkpoints)
    with a new human message; the history grows as a chat's does."""

    def __init__(self, compiled: Any) -> None:
        self.graph = compiled
        self.config = {"configurable": {"thread_id": f"chat-{uuid.uuid4().hex[:8]}"}}
        self.n = 0

    def _input(self) -> dict[str, Any]:
        self.n += 1
        return {"messages": [HumanMessage(MESSAGE, id=f"h{self.n}")]}

    def turn(self) -> float:
        t = time.perf_counter()
        self.graph.invoke(self._input(), self.config)
        return time.perf_counter() - t

    def aturn(self, loop: asyncio.AbstractEventLoop) -> float:
        async def run() -> float:
            t = time.perf_counter()
            await self.graph.ainvoke(self._input(), self.config)
            return time.perf_counter() - t

        return loop.run_until_complete(run())
