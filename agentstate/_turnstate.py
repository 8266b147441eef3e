"""What a turn's stored status reads as (shared by the backends and the public objects)."""

from __future__ import annotations

import time

LEASED = ("queued", "running", "resuming")  # states that lapse into 'expired'


def effective_status(status: str, lease_until: float | None, now: float | None = None) -> str:
    """A leased state whose lease lapsed reads as 'expired'."""
    if status in LEASED and lease_until is not None and lease_until < (now or time.time()):
        return "expired"
    return status
