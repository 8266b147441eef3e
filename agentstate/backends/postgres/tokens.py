"""Repository of API tokens (SPEC §12, §15) and of the pages' sign-ins on PostgreSQL: the
functions of ``sqlite/tokens.py``. Times are the server's clock."""

from __future__ import annotations

from typing import Any

from .statements import Conn

_LEFT = "extract(epoch FROM {} - clock_timestamp())::float8"  # seconds until a time


def create(c: Conn, digest: str, name: str, admin: bool, grants: str | None,
           expires_in: float | None, first: bool = False) -> bool:
    """Whether it was made: ``first`` makes it only if there is no token at all."""
    if first:
        # Two servers starting on an empty store: the lock (which conflicts with itself and
        # with inserts) makes the second wait for the first's commit; its insert's snapshot,
        # taken after, then sees that token.
        c.execute("LOCK TABLE token IN SHARE ROW EXCLUSIVE MODE")
    return c.execute(
        "INSERT INTO token (hash, name, admin, created_at, grants, expires_at) "
        "SELECT %s, %s, %s, clock_timestamp(), %s, clock_timestamp() + %s * interval '1 second' "
        "WHERE NOT %s OR NOT EXISTS (SELECT 1 FROM token) RETURNING 1",
        (digest, name, admin, grants, expires_in, first)).fetchone() is not None


def find(c: Conn, digest: str) -> tuple[Any, ...] | None:
    """(hash, name, admin, grants, seconds until it expires or None) of a live token, or None."""
    return c.execute(f"SELECT hash, name, admin, grants, {_LEFT.format('expires_at')} FROM token "
                     "WHERE hash = %s AND (expires_at IS NULL OR expires_at > clock_timestamp())",
                     (digest,)).fetchone()


def tokens(c: Conn) -> list[tuple[Any, ...]]:
    """(hash, name, admin, grants, created_at, expires_at) of every token, expired ones too,
    by name and age."""
    return c.execute("SELECT hash, name, admin, grants, iso_utc(created_at), iso_utc(expires_at) "
                     "FROM token ORDER BY name, created_at, hash").fetchall()


def revoke(c: Conn, name: str, prefix: str = "") -> int:
    """Delete the tokens of ``name`` (those whose hash starts with ``prefix``) and, by the
    foreign key, their sign-ins; how many tokens."""
    return len(c.execute("DELETE FROM token WHERE name = %s AND starts_with(hash, %s) "
                         "RETURNING hash", (name, prefix)).fetchall())


# -- sign-ins of the pages -----------------------------------------------------------------

def signin_create(c: Conn, digest: str, token: str, lifetime: float) -> bool:
    """A sign-in for the live token whose hash is ``token``; False if there is none. A few
    lapsed sign-ins are deleted on the way."""
    c.begin()
    c.execute("DELETE FROM signin WHERE hash IN (SELECT hash FROM signin "
              "WHERE expires_at <= clock_timestamp() ORDER BY expires_at LIMIT 16)")
    return c.execute(
        "INSERT INTO signin (hash, token, expires_at) "
        "SELECT %s, hash, clock_timestamp() + %s * interval '1 second' FROM token "
        "WHERE hash = %s AND (expires_at IS NULL OR expires_at > clock_timestamp()) "
        "RETURNING hash", (digest, lifetime, token)).fetchone() is not None


def signin_find(c: Conn, digest: str) -> tuple[Any, ...] | None:
    """(token hash, name, admin, grants, seconds until the token expires or None, seconds
    until the sign-in lapses) of a live sign-in of a live token, or None."""
    return c.execute(
        f"SELECT t.hash, t.name, t.admin, t.grants, {_LEFT.format('t.expires_at')}, "
        f"{_LEFT.format('s.expires_at')} FROM signin s JOIN token t ON t.hash = s.token "
        "WHERE s.hash = %s AND s.expires_at > clock_timestamp() "
        "AND (t.expires_at IS NULL OR t.expires_at > clock_timestamp())", (digest,)).fetchone()


def signin_extend(c: Conn, digest: str, lifetime: float) -> None:
    c.execute("UPDATE signin SET expires_at = clock_timestamp() + %s * interval '1 second' "
              "WHERE hash = %s", (lifetime, digest))


def signin_end(c: Conn, digest: str) -> None:
    c.execute("DELETE FROM signin WHERE hash = %s", (digest,))
