"""Repository of API tokens (SPEC §12) on PostgreSQL: the functions of ``_tokens``."""

from __future__ import annotations

from typing import Any

from .statements import Conn


def create(c: Conn, digest: str, name: str, admin: bool) -> None:
    c.execute("INSERT INTO token (hash, name, admin, created_at) VALUES (%s, %s, %s, clock_timestamp())",
              (digest, name, admin))


def find(c: Conn, digest: str) -> tuple[Any, ...] | None:
    """(hash, name, admin) of a token, or None."""
    return c.execute("SELECT hash, name, admin FROM token WHERE hash = %s", (digest,)).fetchone()


def names(c: Conn) -> list[tuple[Any, ...]]:
    """(name, admin, tokens, first created_at) per principal."""
    return c.execute("""SELECT name, bool_or(admin), count(*), iso_utc(min(created_at)) FROM token
                        GROUP BY name ORDER BY name""").fetchall()


def revoke(c: Conn, name: str) -> int:
    return len(c.execute("DELETE FROM token WHERE name = %s RETURNING hash", (name,)).fetchall())
