"""The async twin of a method: the same call in a worker thread, so the event loop never
waits on the store (a lock, an fsync, a round trip)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any


def async_twin(fn: Callable[..., Any]) -> Callable[..., Coroutine[Any, Any, Any]]:
    """``a<name>`` for the method ``fn``: awaits ``fn(self, ...)`` run in a worker thread."""

    @functools.wraps(fn)
    async def twin(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(fn, self, *args, **kwargs)

    twin.__name__ = "a" + fn.__name__
    twin.__qualname__ = fn.__qualname__.rpartition(".")[0] + "." + twin.__name__ \
        if "." in fn.__qualname__ else twin.__name__
    twin.__doc__ = f"Async twin of ``{fn.__name__}``: the same, in a worker thread.\n\n{fn.__doc__}"
    return twin
