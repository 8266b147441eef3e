"""Repository of API tokens (SPEC §12, §15) and of the pages' sign-ins: hashes only, one
function per operation. Times of expiry are unix times (this machine's clock)."""

from __future__ import annotations

import time
from typing import Any

from ..base import Conn, iso, now_iso


def create(c: Conn, digest: str, name: str, admin: bool, grants: str | None,
           expires_in: float | None, first: bool = False) -> bool:
    """Whether it was made: ``first`` makes it only if there is no token at all (the write
    transaction holds the file's write lock, so two first tokens cannot both see none)."""
    c.execute("INSERT INTO token (hash, name, admin, created_at, grants, expires_at) "
              "SELECT ?, ?, ?, ?, ?, ? WHERE NOT ? OR NOT EXISTS (SELECT 1 FROM token)",
              (digest, name, int(admin), now_iso(), grants,
               None if expires_in is None else time.time() + expires_in, int(first)))
    return c.changes() > 0


def find(c: Conn, digest: str) -> tuple[Any, ...] | None:
    """(hash, name, admin, grants, seconds until it expires or None) of a live token, or None."""
    now = time.time()
    row = c.execute("SELECT hash, name, admin, grants, expires_at FROM token "
                    "WHERE hash = ? AND (expires_at IS NULL OR expires_at > ?)",
                    (digest, now)).fetchone()
    return None if row is None else (*row[:4], None if row[4] is None else row[4] - now)


def tokens(c: Conn) -> list[tuple[Any, ...]]:
    """(hash, name, admin, grants, created_at, expires_at) of every token, expired ones too,
    by name and age."""
    return [(h, n, a, g, t, None if e is None else iso(e)) for h, n, a, g, t, e in c.execute(
        "SELECT hash, name, admin, grants, created_at, expires_at FROM token "
        "ORDER BY name, created_at, hash").fetchall()]


def revoke(c: Conn, name: str, prefix: str = "") -> int:
    """Delete the tokens of ``name`` (those whose hash starts with ``prefix``) and their
    sign-ins; how many tokens."""
    gone = [h for (h,) in c.execute(
        "DELETE FROM token WHERE name = ? AND substr(hash, 1, length(?)) = ? RETURNING hash",
        (name, prefix, prefix)).fetchall()]
    for h in gone:  # the foreign key does it too; this does not depend on the pragma
        c.execute("DELETE FROM signin WHERE token = ?", (h,))
    return len(gone)


# -- sign-ins of the pages -----------------------------------------------------------------

def signin_create(c: Conn, digest: str, token: str, lifetime: float) -> bool:
    """A sign-in for the live token whose hash is ``token``; False if there is none. A few
    lapsed sign-ins are deleted on the way (the table holds only live ones, give or take)."""
    now = time.time()
    c.execute("DELETE FROM signin WHERE hash IN (SELECT hash FROM signin WHERE expires_at <= ? "
              "ORDER BY expires_at LIMIT 16)", (now,))
    return c.execute(
        "INSERT INTO signin (hash, token, expires_at) SELECT ?, hash, ? FROM token "
        "WHERE hash = ? AND (expires_at IS NULL OR expires_at > ?) RETURNING hash",
        (digest, now + lifetime, token, now)).fetchone() is not None


def signin_find(c: Conn, digest: str) -> tuple[Any, ...] | None:
    """(token hash, name, admin, grants, seconds until the token expires or None, seconds
    until the sign-in lapses) of a live sign-in of a live token, or None."""
    now = time.time()
    row = c.execute(
        "SELECT t.hash, t.name, t.admin, t.grants, t.expires_at, s.expires_at "
        "FROM signin s JOIN token t ON t.hash = s.token "
        "WHERE s.hash = ? AND s.expires_at > ? AND (t.expires_at IS NULL OR t.expires_at > ?)",
        (digest, now, now)).fetchone()
    if row is None:
        return None
    return (*row[:4], None if row[4] is None else row[4] - now, row[5] - now)


def signin_extend(c: Conn, digest: str, lifetime: float) -> None:
    c.execute("UPDATE signin SET expires_at = ? WHERE hash = ?", (time.time() + lifetime, digest))


def signin_end(c: Conn, digest: str) -> None:
    c.execute("DELETE FROM signin WHERE hash = ?", (digest,))
