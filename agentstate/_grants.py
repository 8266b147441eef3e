"""Grants (SPEC §15): which scopes and runs a token may use, written as rules.

A rule is ``KIND:ID[=r|rw]``: KIND a scope kind or ``runs``; ID an id, a prefix
ending in ``*``, or ``*`` alone (every id); ``r`` reads only, ``rw`` (the
default) reads and writes. Ids follow the key rules (SPEC §2: A-Z a-z 0-9 . _ :
-), so neither ``*`` nor ``=`` can be part of one and a rule reads one way only.

The rules are parsed here and nowhere else: ``db.tokens.create`` and ``agentstate
tokens create`` both call ``parse``, and a token keeps its rules in their
canonical text (``str(rule)``). A token without grants (None) is not limited by
them; an empty list of rules is refused, as a token that may use nothing is
easier to make by mistake (an empty list computed somewhere) than on purpose.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ._encoding import SCOPE_KINDS, is_key, prefix_ok
from .errors import InvalidValue

RUNS = "runs"
KINDS = (*SCOPE_KINDS, RUNS)
MAX_RULES = 1000  # rules of one token: each is checked on every request and in the feed's SQL


@dataclass(frozen=True)
class Rule:
    """One rule: ``kind`` a scope kind or ``runs``; ``id`` an id, or with ``prefix`` the
    start of the ids it covers (empty: every id); ``write``: rw, else r."""

    kind: str
    id: str
    prefix: bool
    write: bool

    def covers(self, kind: str, id: str, write: bool) -> bool:
        return (kind == self.kind and (self.write or not write)
                and (id.startswith(self.id) if self.prefix else id == self.id))

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}{'*' if self.prefix else ''}={'rw' if self.write else 'r'}"


def parse_rule(text: Any) -> Rule:
    """One rule from its text; InvalidValue naming what is wrong with it."""
    if type(text) is not str:
        raise InvalidValue(f"a grant is a string KIND:ID[=r|rw], got {text!r}")
    shown = text if len(text) <= 250 else text[:250] + "..."
    kind, sep, rest = text.partition(":")
    if not sep:
        raise InvalidValue(f"grant {shown!r}: write it KIND:ID[=r|rw] (e.g. thread:t-1, "
                           "user:u-7=r, agent:*, runs:team-a-*)")
    if kind not in KINDS:
        raise InvalidValue(f"grant {shown!r}: the kind must be one of {', '.join(KINDS)}, "
                           f"got {kind!r}")
    ident, eq, mode = rest.rpartition("=") if "=" in rest else (rest, "", "rw")
    if eq and mode not in ("r", "rw"):
        raise InvalidValue(f"grant {shown!r}: after '=' comes r (read) or rw (read and write), "
                           f"got {mode!r}")
    prefix = ident.endswith("*")
    if prefix:
        ident = ident[:-1]
    if not (prefix_ok(ident) if prefix else is_key(ident)):
        raise InvalidValue(
            f"grant {shown!r}: the id must be an id (1-200 of A-Z a-z 0-9 . _ : -), a prefix "
            "of one ending in '*', or '*' alone")
    return Rule(kind, ident, prefix, mode == "rw")


def parse(rules: Iterable[str] | None) -> tuple[Rule, ...] | None:
    """A token's rules (None: a token without grants), checked: InvalidValue for the first
    one that does not parse, or for no rules at all."""
    if rules is None:
        return None
    if isinstance(rules, str):
        raise InvalidValue("grants is a list of rules, not one string: grants=[" + repr(rules) + "]")
    if not isinstance(rules, Iterable) or isinstance(rules, (bytes, dict)):
        raise InvalidValue(f"grants must be a list of rules KIND:ID[=r|rw], got {rules!r}")
    out = tuple(dict.fromkeys(parse_rule(r) for r in rules))  # each rule once, in order
    if not out:
        raise InvalidValue("grants=[] would let the token use no scope and no run: give at least "
                           "one rule, or grants=None for a token without grants")
    if len(out) > MAX_RULES:
        raise InvalidValue(f"{len(out)} grants, over the limit of {MAX_RULES}")
    return out


def dumps(rules: tuple[Rule, ...] | None) -> str | None:
    """What the store keeps: the rules' canonical texts as a JSON array; NULL for none."""
    return None if rules is None else json.dumps([str(r) for r in rules])


def loads(text: str | None) -> tuple[Rule, ...] | None:
    """The rules a token was given, from what the store keeps."""
    return None if text is None else tuple(parse_rule(r) for r in json.loads(text))


def allows(rules: tuple[Rule, ...] | None, kind: str, id: str, write: bool) -> bool:
    """Whether ``rules`` let a token read (or with ``write``, write) the scope ``kind:id``
    (kind ``runs``: the run ``id``). None (no grants) allows everything."""
    return rules is None or any(r.covers(kind, id, write) for r in rules)
