"""Who may read what of the store, in SQL (SPEC §15): the rules of a token with grants as
one condition of a backend's query. Written once for both backends (``GrantSQL``); each
backend supplies only how its SQL spells a parameter, a membership test and "not an id
of a session's form"."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from .._grants import RUNS, Rule

# The only ids the store gives sessions (LocalOps.session_create: "s-" and a uuid4's hex).
# They are random, so no id of this form names a plain scope by accident.
SESSION_ID: Final = re.compile(r"s-[0-9a-f]{32}")


@dataclass(frozen=True)
class Readable:
    """What a token with grants may read of the change feed (SPEC §15): ``feed_scan``'s
    filter ``readable``, applied by the store's own query. The changes of ``owner``'s
    sessions (their turns and session-scope keys), and those of the scopes and runs one of
    ``rules`` covers; a rule of kind ``session`` never covers an id of a session's form
    (``SESSION_ID``): a session is its owner's only, whatever the grants."""

    owner: str
    rules: tuple[Rule, ...]

    def runs(self) -> list[Rule]:
        return [r for r in self.rules if r.kind == RUNS]

    def scopes(self) -> list[Rule]:
        return [r for r in self.rules if r.kind != RUNS]


class GrantSQL:
    """How a backend writes the SQL of SPEC §15's rules: a parameter's placeholder, "the
    column is one of these texts" (a list parameter), and "not an id of a session's form".
    The rules themselves are written once, below (``readable_sql``, ``runs_sql``), for both
    backends.

    However many rules a token has (up to 1,000), the SQL has a bounded number of terms:
    the rules of one kind become one membership test of their exact ids and one per
    prefix length (``substr(id, 1, n)`` among the prefixes of that length), joined by a
    balanced OR (SQLite refuses an expression nested 1,000 deep, which a chain of 1,000
    ORs is: "Expression tree is too large")."""

    true: str = "true"

    def param(self, name: str) -> str:
        raise NotImplementedError

    def one_of(self, expr: str, name: str) -> str:
        """SQL true where ``expr`` is one of the texts of the list parameter ``name``."""
        raise NotImplementedError

    def texts(self, values: list[str]) -> Any:
        """A list of texts as ``one_of``'s parameter takes it."""
        return values

    def not_a_session(self, column: str) -> str:
        raise NotImplementedError

    def ids_match(self, rules: list[Rule], column: str, params: dict[str, Any],
                  name: str) -> str:
        """SQL true where ``column`` is an id one of ``rules`` (all of one kind) covers."""
        if any(r.prefix and not r.id for r in rules):
            return self.true
        exact = sorted({r.id for r in rules if not r.prefix})
        by_length: dict[int, set[str]] = {}
        for r in rules:
            if r.prefix:
                by_length.setdefault(len(r.id), set()).add(r.id)
        terms = []
        if exact:
            params[name] = self.texts(exact)
            terms.append(self.one_of(column, name))
        for n, prefixes in sorted(by_length.items()):  # ids are ASCII: chars are bytes
            params[f"{name}_{n}"] = self.texts(sorted(prefixes))
            terms.append(self.one_of(f"substr({column}, 1, {n})", f"{name}_{n}"))
        return any_of(terms)

    def readable_sql(self, r: Readable, params: dict[str, Any]) -> str:
        """The changes a token with grants may read (``Readable``), as one condition."""
        params["owner"] = r.owner
        terms = ["(topic = 'session' OR (topic = 'kv' AND kind = 'session')) AND scope_id IN "
                 f"(SELECT id FROM session WHERE owner = {self.param('owner')})"]
        runs = r.runs()
        if runs:
            terms.append(f"topic = 'run' AND {self.ids_match(runs, 'scope_id', params, 'runs')}")
        for i, kind in enumerate(sorted({rule.kind for rule in r.scopes()})):
            params[f"k{i}"] = kind
            match = self.ids_match([x for x in r.rules if x.kind == kind], "scope_id", params,
                                   f"g{i}")
            terms.append(f"topic = 'kv' AND kind = {self.param(f'k{i}')} AND {match}" + (
                f" AND {self.not_a_session('scope_id')}" if kind == "session" else ""))
        return any_of([f"({t})" for t in terms])

    def runs_sql(self, grants: tuple[Rule, ...], params: dict[str, Any]) -> str | None:
        """The runs a token with ``grants`` may list, as one condition; None when no
        ``runs`` rule covers any."""
        rules = [r for r in grants if r.kind == RUNS]
        if not rules:
            return None
        return "(" + self.ids_match(rules, "id", params, "runs") + ")"


def any_of(terms: list[str]) -> str:
    """``terms`` joined by OR as a balanced tree (its depth grows with log2 of their count)."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return f"({any_of(terms[:half])} OR {any_of(terms[half:])})"
