"""LangGraph on agentstate: ``pip install 'agentstate-db[langgraph]'``.

``AgentStateSaver(db)`` is a checkpointer (where ``SqliteSaver`` stood) and
``AgentStateStore(db)`` a long-term memory store (where ``SqliteStore`` stood);
both keep their data in one agentstate file that many processes share.
"""

from .checkpoint import AgentStateSaver
from .store import AgentStateStore

__all__ = ["AgentStateSaver", "AgentStateStore"]
