"""Who may use a thread's open transaction: the code inside its block (both backends).

A thread's connection carries one transaction, but asyncio tasks on one thread
interleave, and an async twin runs in a worker thread: a call from code that
did not open the transaction must neither join it (and vanish with its
rollback) nor wait for it (forever). ``txn`` is the store's context variable
holding the token of the transaction the running code is inside of
(``[True]`` while open); ``local`` is the thread's state (``depth``, ``owner``).
"""

from __future__ import annotations

import contextvars
from typing import Any

from .errors import Busy, UsageError


def check_owner(txn: contextvars.ContextVar[list[bool] | None], local: Any) -> None:
    """Refuse a call from code that is not inside this thread's open transaction."""
    if local.depth:
        if txn.get() is not local.owner:
            raise Busy(
                "another task on this thread has an open transaction() on this database; "
                "a call from outside its block would join it (and be lost if it rolls back): "
                "await its end, or run this call in another thread (the async twins do)"
            )
    else:
        tok = txn.get()
        if tok is not None and tok[0]:
            raise UsageError(
                "this call runs in another thread than the transaction() it is inside of "
                "(an async twin, or a thread started in the block), so it cannot join it "
                "and would wait for it forever: use the plain calls inside transaction()"
            )
