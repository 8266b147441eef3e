"""One connection as the repositories see it (``Conn``), and a lone write in one round trip.

Modes: AUTO (a write not yet begun: each statement its own transaction, either one
prepared statement that does the whole write (``lean``, see lean.py) or sent as
``BEGIN; stmt; COMMIT; SELECT feed_notify(...)`` with its parameters written in as
literals), TXN (a write transaction), READ (a read, or a snapshot).
"""

from __future__ import annotations

import re
import select
from typing import Any

import psycopg
from psycopg import errors as pgerr

from .errors import is_fallback

RETRIES = 3  # a lone statement that lost a deadlock did nothing: it is run again
_RETRY = (pgerr.DeadlockDetected, pgerr.SerializationFailure)

AUTO, TXN, READ = "auto", "txn", "read"
# What opens a write transaction; set_config(..., true) lasts until its end, and
# tells feed_add() to leave the changes without a ticket until feed_close() at COMMIT.
BEGIN_WRITE = ("BEGIN", "SELECT set_config('agentstate.block', 'on', true)")
CLOSE = "SELECT feed_close()"  # a write transaction's last statement before its COMMIT
BEGIN_SNAPSHOT = ("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",)
# Before a read of the feed: number the committed changes, and commit that,
# before the read's snapshot is taken (sent in the same round trip).
SEQUENCE = ("BEGIN ISOLATION LEVEL READ COMMITTED", "SELECT feed_sequence()", "COMMIT")
# What follows a write's COMMIT, in the same round trip: the wake-up if someone watches,
# and (true: every 16th write of a store) the purge if it is due.
AFTER_COMMIT = {True: "SELECT feed_notify(true)", False: "SELECT feed_notify(false)"}
# What follows a lean write's COMMIT when it said someone watches, or the purge is due.
AFTER_LEAN = "SELECT feed_after(%s, %s)"
SAVEPOINT, RELEASE = "SAVEPOINT w", "RELEASE SAVEPOINT w"


# -- a lone write and its wake-up in one round trip --------------------------------

_PLACEHOLDER = re.compile(r"%(?:\((\w+)\))?s|%%")
_SPLIT: dict[str, list[str | tuple[str | int]]] = {}  # query -> text pieces and placeholders
_FLOATS = {float("inf"): "'Infinity'::float8", float("-inf"): "'-Infinity'::float8"}


class AfterCommit(psycopg.Cursor):
    """The cursor of ``...; COMMIT; SELECT feed_notify(...)``: the wake-up sent after a
    COMMIT may fail (a lock timeout waiting for the server's NOTIFY lock, a full
    notification queue) without making the committed write an error: its error is
    dropped and the results before it stand (watchers look again within RECHECK
    seconds). An error before the COMMIT skips it, so a COMMIT result means committed.
    (Overrides psycopg's private check of a query's results.)"""

    def _check_results(self, results: list[Any]) -> None:
        if (len(results) >= 2 and results[-1].status == psycopg.pq.ExecStatus.FATAL_ERROR
                and results[-2].command_status == b"COMMIT"):
            del results[-1]
        super()._check_results(results)


class _NotInline(Exception):
    """A parameter this module does not write as a literal: sent the ordinary way."""


def _split(query: str) -> list[str | tuple[str | int]]:
    parts = _SPLIT.get(query)
    if parts is None:
        parts, pos, n = [], 0, 0
        for m in _PLACEHOLDER.finditer(query):
            parts.append(query[pos:m.start()])
            if m.group(0) == "%%":
                parts.append("%")
            else:
                parts.append((m.group(1) if m.group(1) else n,))
                n += 1
            pos = m.end()
        parts.append(query[pos:])
        if len(_SPLIT) < 1000:
            _SPLIT[query] = parts
    return parts


def _literal(v: Any) -> str:
    if v is None:
        return "NULL"
    t = type(v)
    if t is str:
        if "\x00" in v:
            raise _NotInline
        return "'" + v.replace("'", "''") + "'"
    if t is bool:
        return "true" if v else "false"
    if t is int:
        return str(v)
    if t is float:
        if v != v:
            return "'NaN'::float8"
        return _FLOATS.get(v) or f"'{v!r}'::float8"
    if t is bytes or t is bytearray or t is memoryview:
        return "'\\x" + bytes(v).hex() + "'::bytea"
    if t is list:
        if not v:
            return "'{}'"
        if all(type(x) is str for x in v):
            return "ARRAY[" + ",".join(map(_literal, v)) + "]::text[]"
        if all(type(x) is int for x in v):
            return "ARRAY[" + ",".join(map(str, v)) + "]::int8[]"
    raise _NotInline


def inline(query: Any, params: Any) -> str | None:
    """The statement with its parameters written in as literals (standard_conforming_strings
    is on), or None for a parameter it does not know (then it is sent the ordinary way)."""
    if type(query) is not str:
        return None
    if params is None:
        return query
    try:
        out = []
        for part in _split(query):
            if type(part) is str:
                out.append(part)
            else:
                out.append(_literal(params[part[0]]))
        return "".join(out)
    except (_NotInline, KeyError, IndexError, TypeError):
        return None


class Conn:
    """A checked-out connection: ``execute`` and, for several statements, ``begin``.

    Modes: AUTO (a write not yet begun: each statement is its own transaction,
    retried when it lost a deadlock), TXN (a write transaction), READ (a read,
    or a snapshot). Statements that open something (BEGIN, SAVEPOINT) or close
    a savepoint wait in ``pending`` until a statement needs them, and then go
    out together in one simple query: a savepoint that saw no statement costs
    nothing, and a RELEASE rides with the next SAVEPOINT (or COMMIT drops it).
    (psycopg's pipeline mode would send them with the statement itself, but
    costs more client time than a round trip to a local server.)
    """

    __slots__ = ("raw", "mode", "ran", "pending", "open", "flushes", "fence", "tidy")

    def __init__(self, raw: psycopg.Connection, mode: str, pending: tuple[str, ...] = (),
                 tidy: bool = False) -> None:
        self.raw = raw
        self.mode = mode
        self.ran = False  # AUTO: a statement has run (and committed on its own)
        self.pending = list(pending)
        self.open = False  # a BEGIN has been sent
        self.flushes = 0
        self.fence: str | None = None  # AUTO: the turn's check to run first (fence_first)
        self.tidy = tidy  # this write asks whether the feed has work due (Store.write)

    @property
    def alone(self) -> bool:
        """Whether the next statement is a write of its own: no transaction, no fence
        (lean.py's statements then do the whole write)."""
        return self.mode is AUTO and not self.ran and self.fence is None and not self.pending

    def lean(self, query: str, params: Any) -> Any:
        """A write as one prepared statement in a transaction of its own (``alone``): its
        row without the two flags at its end, or None when the statement did nothing (no
        row, or it raised agentstate:Fallback, which undid it) and the write is left to
        the server's functions. After its COMMIT, when it said someone watches or the
        feed has work due, ``feed_after`` in a transaction of its own: its failure leaves
        the committed write as it is (watchers look again within RECHECK seconds)."""
        raw = self.raw
        self.ran = True
        for attempt in range(RETRIES):
            try:
                row = raw.execute(query, params, prepare=True).fetchone()
                break
            except _RETRY:
                if attempt == RETRIES - 1:
                    raise
            except pgerr.RaiseException as e:
                if not is_fallback(e):
                    raise
                row = None
                break
        if row is None:
            self.ran = False
            return None
        watched, due = row[-2], row[-1]
        if watched or due:
            try:
                raw.execute(AFTER_LEAN, (watched, due), prepare=True)
            except psycopg.Error:
                pass
        return row[:-2]

    def execute(self, query: Any, params: Any = None) -> Any:
        """The statement's cursor (rows are whatever it returns: typed loosely, as a
        repository's connection is in base.py)."""
        if self.pending:
            return self._with_pending(query, params)
        if self.mode is not AUTO:
            return self.raw.execute(query, params)
        self.ran = True
        text = inline(query, params)
        if text is None and self.fence is not None:  # its check needs the same transaction
            self.ran = False
            self.begin()
            return self._with_pending(query, params)
        if text is not None:
            check = "" if self.fence is None else f"{self.fence}; "
            text = f"BEGIN; {check}{text}; COMMIT; {AFTER_COMMIT[self.tidy]}"
        for attempt in range(RETRIES):
            try:
                return self._lone(query, params, text)
            except _RETRY:
                if attempt == RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def execute_all(self, texts: list[str]) -> Any:
        """Statements with their parameters written in (``inline``), in order, in one
        round trip; the cursor at the first one's result (``nextset()`` for the next).
        A write of its own sends them as one transaction, with its BEGIN and COMMIT."""
        if self.mode is not AUTO:
            return self._together(self._take_pending(), "; ".join(texts), None)
        if len(texts) == 1:
            return self.execute(texts[0])
        if self.ran:
            raise AssertionError("execute_all() after a statement already committed on its own")
        self.ran = True
        head = [*BEGIN_WRITE, *([] if self.fence is None else [self.fence])]
        text = "; ".join([*head, *texts, f"{CLOSE}; COMMIT; {AFTER_COMMIT[self.tidy]}"])
        for attempt in range(RETRIES):
            try:
                cur = self._send(text)
                break
            except _RETRY:
                if attempt == RETRIES - 1:
                    raise
        for _ in head:
            cur.nextset()
        return cur

    def _lone(self, query: Any, params: Any, text: str | None) -> Any:
        """One statement in a transaction of its own, then the wake-up (feed_notify)."""
        raw = self.raw
        if text is None:  # two round trips: a parameter not written as a literal
            cur = raw.execute(query, params)
            try:
                raw.execute(AFTER_COMMIT[self.tidy])
            except psycopg.Error:
                pass  # committed: the watchers look again within RECHECK seconds
            return cur
        try:
            cur = self._send(text)
        except UnicodeEncodeError:  # not UTF-8 (lone surrogates): let psycopg say so
            return self._lone(query, params, None)
        cur.nextset()  # past BEGIN: the statement's rows
        if self.fence is not None:
            cur.nextset()  # past the fence's check
        return cur

    def _send(self, text: str) -> Any:
        """``BEGIN; ...; COMMIT; ...`` in one round trip. A refusal before the COMMIT is
        rolled back; an error at or after it leaves the outcome unknown (said on it)."""
        raw = self.raw
        try:
            return raw.execute(text, prepare=False)
        except psycopg.Error as e:
            status = raw.info.transaction_status
            if status == psycopg.pq.TransactionStatus.INERROR:  # refused before its COMMIT
                quiet_rollback(raw)
            elif status == psycopg.pq.TransactionStatus.IDLE:
                # Refused at or after its COMMIT: whether it committed is not known here.
                e.agentstate_outcome_unknown = True  # type: ignore[attr-defined]
            raise

    def _with_pending(self, query: Any, params: Any) -> Any:
        """What waits in ``pending``, then the statement: one round trip when its
        parameters can be written in (a simple query of several statements)."""
        return self._together(self._take_pending(), query, params)

    def _take_pending(self) -> list[str]:
        pending, self.pending = self.pending, []
        if pending:
            self.flushes += 1
        for p in pending:  # open: a BEGIN without its COMMIT
            if p.startswith("BEGIN"):
                self.open = True
            elif p == "COMMIT":
                self.open = False
        return pending

    def _together(self, before: list[str], query: Any, params: Any) -> Any:
        """Statements without results, then ``query``'s cursor, in one round trip when
        ``query``'s parameters can be written in, else two. (READ COMMITTED gives each
        statement of a simple query a snapshot of its own, taken when it starts.) Not
        after a COMMIT (the feed's SEQUENCE): the cursor drops an error that follows a
        COMMIT (``AfterCommit``), which must stay true of the wake-up alone."""
        text = None if "COMMIT" in before else inline(query, params)
        if text is not None:
            try:
                cur = self.raw.execute("; ".join([*before, text]), prepare=False)
            except UnicodeEncodeError:  # not UTF-8 (lone surrogates): let psycopg say so
                pass
            else:
                for _ in before:
                    cur.nextset()
                return cur
        if before:
            self.raw.execute("; ".join(before))
        return self.raw.execute(query, params)

    def execute_after(self, first: str, query: Any, params: Any = None) -> Any:
        """``first`` (a statement without parameters or results, e.g. a lock), then
        ``query``: in one round trip with anything pending (a write transaction only)."""
        if self.mode is not TXN:
            raise AssertionError("execute_after() outside a write transaction")
        return self._together([*self._take_pending(), first], query, params)

    def begin(self) -> None:
        """Make the statements from here on one transaction (a no-op if they are)."""
        if self.mode is AUTO:
            if self.ran:
                raise AssertionError("begin() after a statement already committed on its own")
            self.pending[:0] = BEGIN_WRITE + (() if self.fence is None else (self.fence,))
            self.fence = None
            self.mode = TXN

    def fence_first(self, turn_id: str, owner: str | None = None) -> None:
        """Check the turn's lease first in this write (SPEC §14): a lone write sends the
        check with itself, in its one round trip; a transaction with its BEGIN, or now."""
        check = f"SELECT turn_fence({_literal(turn_id)}, {_literal(owner)})"
        if self.mode is AUTO and not self.ran:
            self.fence = check
            return
        self.begin()
        self.execute(check)


def readable(raw: psycopg.Connection) -> bool:
    try:
        return bool(select.select([raw.fileno()], [], [], 0)[0])
    except (OSError, ValueError, psycopg.Error):
        return True


def quiet_rollback(raw: psycopg.Connection) -> None:
    try:
        if raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            raw.execute("ROLLBACK")
    except psycopg.Error:
        pass


def first(cur: Any) -> Any:
    """The first column of the one row a statement returns (a query that always has one)."""
    row = cur.fetchone()
    if row is None:
        raise psycopg.ProgrammingError("the statement returned no row")
    return row[0]
