"""The backends: where the store's operations run.

``base.py`` states what every backend supplies (the ``Ops`` seam, the store and
repository interfaces) and the rules they share; ``local.py`` runs the
operations on a store this process holds, ``sqlite/`` or ``postgres/`` (the
same module names in each); ``remote.py`` sends them to ``agentstate serve``.
``agentstate.open()`` is the only place a target picks one.
"""
