"""Adapters that put agent frameworks' own state interfaces on agentstate.

Each lives in its own module behind an optional extra, so the embedded store
keeps its three dependencies: ``agentstate.integrations.openai_agents``
(``pip install 'agentstate[openai-agents]'``), and so on.
"""
