"""``db.sql()``: one read-only SQL statement, run by the store's own SQLite.

It exists because the obvious alternative is unsafe. Python's ``sqlite3``
module links a second copy of SQLite (the system's), and two copies in one
process do not see each other's locks: POSIX advisory locks belong to the
process, so each copy's locks are invisible to the other, and closing *any*
descriptor of the file drops *all* the process's locks on it. A writer thread
plus a loop of ``sqlite3.connect(path)``, a SELECT and ``close()`` ends in
SIGBUS or "database disk image is malformed" within seconds, and with other
processes writing, in a corrupt file (benchmarks/TWO-SQLITES.md, which also
says why Linux's open-file-description locks do not fix it). So reads from
Python go through the connection agentstate already holds.

Read-only is enforced before anything runs: an authorizer that lets a
statement only read tables and views and call functions (SQLite asks it while
compiling the statement, so a refused one never starts), then SQLite's own
verdict on the compiled statement (``sqlite3_stmt_readonly``: REINDEX passes
the authorizer but not this), and one statement per call. The statement runs
in a read transaction (``Store.snapshot``): one consistent state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import apsw

from ._connection import translate
from .errors import InvalidValue, UsageError

# What a statement that only reads asks for: reading columns, SELECT itself,
# calling a function, a recursive CTE.
_READS = frozenset({apsw.SQLITE_SELECT, apsw.SQLITE_READ, apsw.SQLITE_FUNCTION,
                    apsw.SQLITE_RECURSIVE})
# Pragmas that describe the schema whatever their argument (``PRAGMA table_info(kv)``,
# ``SELECT * FROM pragma_table_info('kv')``); every other pragma is refused.
_SCHEMA_PRAGMAS = frozenset({"table_info", "table_xinfo", "table_list", "index_list",
                             "index_info", "index_xinfo", "foreign_key_list"})


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


def read(store: Any, query: str, params: tuple[Any, ...] | dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one read-only statement, on this thread's connection, in one snapshot."""
    with store.snapshot() as c:
        return _run(c, query, params)


def _authorize(op: int, a: str | None, b: str | None, db: str | None, trigger: str | None) -> int:
    if op in _READS or (op == apsw.SQLITE_PRAGMA and (a or "").lower() in _SCHEMA_PRAGMAS):
        return apsw.SQLITE_OK
    return apsw.SQLITE_DENY


class _Guard:
    """The cursor's execution tracer: called after each statement is compiled, before it
    runs; returning False stops it. Counts the statements and asks SQLite whether the
    compiled one writes."""

    __slots__ = ("statements", "why")

    def __init__(self) -> None:
        self.statements = 0
        self.why: str | None = None

    def __call__(self, cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
        if _only_comments(sql):  # a comment after the last ';' compiles to nothing
            return True
        self.statements += 1
        if self.statements > 1:
            self.why = "several"
            return False
        if not cursor.is_readonly:
            self.why = "writes"
            return False
        return True


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


def _only_comments(sql: str) -> bool:
    return not first_word(sql)


def _run(c: apsw.Connection, query: str, params: Any) -> list[dict[str, Any]]:
    guard = _Guard()
    # Setting an authorizer expires every statement this connection has compiled: the
    # store's own recompile once, without it, when they next run.
    c.authorizer = _authorize
    cursor = c.cursor()
    cursor.exec_trace = guard
    try:
        names: list[str] | None = None
        rows = []
        for row in cursor.execute(query, params, can_cache=False):
            if names is None:
                names = [d[0] for d in cursor.get_description()]
            rows.append(dict(zip(names, row)))
        return rows
    except apsw.ExecTraceAbort:
        if guard.why == "several":
            raise several() from None
        raise refused(f"{_head(query)} writes") from None
    except apsw.AuthError as e:
        if guard.statements:  # refused while compiling the statement after the first
            raise several() from None
        raise refused(f"{_head(query)} was not authorized ({e}): only SELECT, and the schema "
                      "pragmas (table_info, index_list, ...)") from None
    except (apsw.SQLError, apsw.BindingsError, apsw.MismatchError, apsw.RangeError, apsw.TooBigError,
            KeyError, TypeError, ValueError, OverflowError) as e:
        raise InvalidValue(f"db.sql(): {type(e).__name__}: {e}") from None
    except apsw.Error as e:
        raise translate(e) from None
    finally:
        try:
            cursor.close(True)
            c.authorizer = None
        except apsw.Error:  # closed meanwhile (db.close() from another thread)
            pass


def _head(query: str) -> str:
    words = query.split()
    return repr(" ".join(words[:4]) + (" ..." if len(words) > 4 else ""))
