"""Repository of API tokens (SPEC §12): hashes only, one function per operation."""

from __future__ import annotations

from typing import Any


from ..base import Conn, now_iso


def create(c: Conn, digest: str, name: str, admin: bool) -> None:
    c.execute("INSERT INTO token (hash, name, admin, created_at) VALUES (?, ?, ?, ?)",
              (digest, name, int(admin), now_iso()))


def find(c: Conn, digest: str) -> tuple[Any, ...] | None:
    """(hash, name, admin) of a token, or None."""
    return c.execute("SELECT hash, name, admin FROM token WHERE hash = ?", (digest,)).fetchone()


def names(c: Conn) -> list[tuple[Any, ...]]:
    """(name, admin, tokens, first created_at) per principal."""
    return c.execute("""SELECT name, max(admin), count(*), min(created_at) FROM token
                        GROUP BY name ORDER BY name""").fetchall()


def revoke(c: Conn, name: str) -> int:
    return len(c.execute("DELETE FROM token WHERE name = ? RETURNING hash", (name,)).fetchall())
