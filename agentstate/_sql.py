"""``db.sql()``: the rules every backend shares (arguments, refusals, the first keyword).

It exists because the obvious alternative is unsafe. Python's ``sqlite3``
module links a second copy of SQLite (the system's), and two copies in one
process do not see each other's locks: POSIX advisory locks belong to the
process, so each copy's locks are invisible to the other, and closing *any*
descriptor of the file drops *all* the process's locks on it. A writer thread
plus a loop of ``sqlite3.connect(path)``, a SELECT and ``close()`` ends in
SIGBUS or "database disk image is malformed" within seconds, and with other
processes writing, in a corrupt file (benchmarks/TWO-SQLITES.md, which also
says why Linux's open-file-description locks do not fix it). So reads from
Python go through the connection agentstate already holds: each backend's
``admin.sql`` runs the statement, read-only, in one snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import InvalidValue, UsageError


def check(query: Any, params: Any) -> tuple[Any, ...] | dict[str, Any]:
    """The parameters as the drivers take them; bad arguments are InvalidValue."""
    if type(query) is not str:
        raise InvalidValue(f"sql() takes the query as a str, got {type(query).__name__}")
    if not query.strip():
        raise InvalidValue("sql() needs a statement: the query is empty")
    if isinstance(params, Mapping):
        return dict(params)
    if isinstance(params, Sequence) and not isinstance(params, (str, bytes, bytearray)):
        return tuple(params)
    raise InvalidValue("sql() takes params as a sequence (positional placeholders) or a "
                       f"mapping (named ones), got {type(params).__name__}")


def refused(what: str) -> UsageError:
    return UsageError(f"db.sql() reads only: {what} (write through the API; for anything else "
                      "use the sqlite3 shell or psql in another process)")


def several() -> InvalidValue:
    return InvalidValue("db.sql() runs one statement per call")


def first_word(sql: str) -> str:
    """The statement's first keyword, upper case, past comments and opening parentheses."""
    rest = sql.strip()
    while rest.startswith(("--", "/*", "(")):
        if rest.startswith("("):
            rest = rest[1:].strip()
            continue
        end = rest.find("\n") if rest.startswith("--") else rest.find("*/")
        rest = "" if end < 0 else rest[end + (1 if rest.startswith("--") else 2):].strip()
    word = rest.split(None, 1)[0] if rest else ""
    return "".join(ch for ch in word if ch.isalpha()).upper()
