"""Writes of keys as single prepared statements: the common writes of a key, and a batch.

A write outside ``transaction()`` (and not fenced) is first sent as one data-modifying
statement, prepared once per connection and called with bound parameters, in a
transaction of its own: the write, its change row (a CTE of the same statement) and two
flags, whether someone watches the feed and whether the feed has work due (feed_watched,
feed_due in ``schema_postgres.sql``). What it cannot say in one statement it leaves
undone (no row, or the error ``agentstate:Fallback``, which undoes the whole statement):
a list value, an expired row met, a refusal (whose precise error and current version the
function then gives), and the write goes the ordinary way, through the server function
(``kv.py``). So each statement keeps every rule of that function:

- A key's version is in its row, a deleted key's too (a tombstone: expires_at
  '-infinity'), so a create is ``INSERT ... ON CONFLICT DO UPDATE``, which goes on from
  the latest committed row whoever deleted or created it meanwhile: a version is never
  used twice. Its ``WHERE`` is judged on that latest row too (a compare-and-set is an
  ``UPDATE ... WHERE version = n``, which READ COMMITTED also re-judges on the row it
  waited for).
- Every write of a key locks its row, a creation included (ON CONFLICT waits for a
  transaction that inserted or locked the row: a read in a transaction that found the
  key absent inserted and locked a tombstone, kv_read_lock), and the row stays locked
  until the statement's transaction ends.
- The change row goes into change_new in the same statement, with a ticket taken after
  the write (a data-modifying CTE that nothing reads runs after the statement's query,
  which waits for every write): the feed's numbering by readers is unchanged.
- Whether someone watches is read after the write has its transaction id (the query reads
  the write's row first; see waiter.py for why that order matters); the wake-up, and the
  purge when due, go after the COMMIT, in a transaction of their own (feed_after), only
  then.

- Value history (SPEC §17): what a write replaces is the key's row as the statement's
  snapshot reads it (``b``, with its xmin), kept as the change's before-image (in
  kv_history, under an id taken after the write) by a CTE of the same statement. The
  write goes on only while history is off or the row it meets is that very row (the
  same xmin: no write came between, a touch included); else it does nothing, and the
  function, which locks the row before it reads it, does the write. A list value is
  never replaced or deleted here (its items may have to stay for what it was).
"""

from __future__ import annotations

from typing import Any

from ..base import KEEP

# The tests of a live row and of a tombstone, on the row the statement locked (``t``).
LIVE = "(t.expires_at IS NULL OR t.expires_at > clock_timestamp())"
TOMBSTONE = "t.expires_at = '-infinity'"
# Whether the feed is on, and whether history is kept (history_on()), read once.
_ON = ("h AS MATERIALIZED (SELECT coalesce(bool_and(name <> 'feed_retention'), true) AS feed, "
       "count(*) = 0 AS kept FROM setting WHERE name IN ('history_retention', 'feed_retention') "
       "AND value = 0)")
_KEPT_COLUMNS = "version, type, value, data, list_id, length, size, updated_at, expires_at"
# The flags at the end of every statement's row: whether someone watches (read once the
# write has its transaction id: the query reads the write's rows first), whether the
# feed has work due (asked by every 16th write of a store, else false).
_FLAGS = ", (SELECT watched FROM feed_watched), {due}"
_DUE = {True: "(SELECT due FROM feed_due)", False: "false"}
_TEXTS: dict[Any, str] = {}  # statement text by shape


def _key(i: str) -> str:
    return f"t.kind = %(kind{i})s AND t.scope_id = %(sid{i})s AND t.key = %(key{i})s"


def _feed(values: str, source: str, where: str = "") -> str:
    """The CTE that adds a change row (ticket, ord, op, kind, scope id, key, version, start,
    count, id: ``values``) for each row of ``source`` (that passes ``where``)."""
    return ("f AS (INSERT INTO change_new (xid, at, topic, ticket, ord, op, kind, scope_id, key, "
            f"version, start, count, id) SELECT pg_current_xact_id(), clock_timestamp(), 'kv', {values} "
            f"FROM {source}, h WHERE {where + ' AND ' if where else ''}h.feed)")


def _before(i: str) -> str:
    """The CTE ``b{i}``: the key's row as the statement's snapshot reads it, with its
    xmin (what the write replaces, if it meets this very row: ``_same``)."""
    return f"b{i} AS MATERIALIZED (SELECT t.xmin AS x, t.* FROM kv t WHERE {_key(i)})"


def _same(i: str) -> str:
    """The write's condition on the row it meets (``t``): history off, or ``b{i}``'s row."""
    return f"(NOT (SELECT kept FROM h) OR t.xmin = (SELECT x FROM b{i}))"


def _keep(kept: list[tuple[str, str]]) -> str:
    """The CTE that keeps each (id, i): the before-image ``b{i}`` under that id (from the
    CTE ``n``), when the id was taken (history on) and the row was not a tombstone."""
    return ("k AS (INSERT INTO kv_history (change_id, " + _KEPT_COLUMNS + ") "
            + " UNION ALL ".join(
                f"SELECT n.{ident}, {', '.join(f'b.{col}' for col in _KEPT_COLUMNS.split(', '))} "
                f"FROM n, b{i} b WHERE n.{ident} IS NOT NULL AND b.expires_at IS DISTINCT FROM '-infinity'"
                for ident, i in kept) + ")")


def _ident(done: str) -> str:
    """A change's id, taken after its write (``done``: whether it wrote), while history is on."""
    return f"CASE WHEN h.kept AND {done} THEN nextval('change_id') END"


def _upsert(i: str, after: str = "") -> str:
    """A put of a JSON or bytes value that creates the key (or a deleted one again) or,
    ``any``, replaces a live value that is not a list (``if_version`` None; 0: only a
    create); only once the CTE ``after`` has a row, when given. Its row: the key's new
    version."""
    row = (f"%(kind{i})s, %(sid{i})s, %(key{i})s, 1, %(type{i})s, %(value{i})s::json, %(data{i})s::bytea, "
           f"%(size{i})s, clock_timestamp(), clock_timestamp() + %(ttl{i})s::float8 * interval '1 second'")
    return f"""INSERT INTO kv AS t (kind, scope_id, key, version, type, value, data, size, updated_at,
                             expires_at)
    {f"SELECT {row} FROM {after}" if after else f"VALUES ({row})"}
    ON CONFLICT (kind, scope_id, key) DO UPDATE
    SET version = t.version + 1, type = excluded.type, value = excluded.value, data = excluded.data,
        list_id = NULL, length = NULL, size = excluded.size, updated_at = excluded.updated_at,
        expires_at = CASE WHEN %(keep{i})s AND {LIVE} THEN t.expires_at ELSE excluded.expires_at END
    WHERE ({TOMBSTONE} OR (%(any{i})s AND t.type <> 'list' AND {LIVE})) AND {_same(i)}
    RETURNING t.version"""


def _cas(i: str, after: str = "") -> str:
    """A put at ``if_version`` (> 0) of a live value that is not a list (once ``after``
    has a row, when given)."""
    return f"""UPDATE kv t
    SET version = t.version + 1, type = %(type{i})s, value = %(value{i})s::json, data = %(data{i})s::bytea,
        size = %(size{i})s, updated_at = clock_timestamp(),
        expires_at = CASE WHEN %(keep{i})s THEN t.expires_at
                          ELSE clock_timestamp() + %(ttl{i})s::float8 * interval '1 second' END
    {f"FROM {after} " if after else ""}WHERE {_key(i)} AND t.version = %(if_version{i})s AND t.type <> 'list' AND {LIVE}
      AND {_same(i)}
    RETURNING t.version"""


def _delete(i: str) -> str:
    """A delete of a live key that is not a list (at ``if_version``, when given): a
    tombstone. Its row: the version it had."""
    return f"""UPDATE kv t
    SET version = t.version + 1, expires_at = '-infinity', value = NULL, data = NULL, length = NULL,
        size = 0, updated_at = clock_timestamp()
    WHERE {_key(i)} AND {LIVE} AND t.type <> 'list'
      AND (%(if_version{i})s::int8 IS NULL OR t.version = %(if_version{i})s) AND {_same(i)}
    RETURNING t.version - 1 AS version"""


def _left(i: str) -> str:
    """Whether the key has a row that a delete left (live or expired, not a tombstone):
    then the delete was not done here."""
    return f"EXISTS (SELECT FROM kv t WHERE {_key(i)} AND t.expires_at IS DISTINCT FROM '-infinity')"


def _check(i: str, absent: bool) -> str:
    """A batch's check, which locks the key's row until the batch commits: at a version
    (> 0), the live row read FOR UPDATE (READ COMMITTED reads the latest version of a row
    it waited for; a row created after the statement's snapshot has a version above any
    the caller can have seen); absent (0), the key's row locked by an ON CONFLICT that
    updates only a live row (a tombstone of version 0 inserted when it has none), so it
    sees a row created meanwhile. Its row: ``ok`` (False or NULL: refused)."""
    if absent:
        return f"""INSERT INTO kv AS t (kind, scope_id, key, version, type, size, updated_at, expires_at)
    VALUES (%(kind{i})s, %(sid{i})s, %(key{i})s, 0, 'json', 0, clock_timestamp(), '-infinity')
    ON CONFLICT (kind, scope_id, key) DO UPDATE SET version = t.version WHERE {LIVE}
    RETURNING coalesce({TOMBSTONE}, false) AS ok"""
    return f"""SELECT (SELECT t.version FROM kv t WHERE {_key(i)} AND {LIVE} FOR UPDATE)
    = %(if_version{i})s AS ok"""


def _text(shape: Any, due: bool, build: Any) -> str:
    text = _TEXTS.get((shape, due))
    if text is None:
        text = build()
        if len(_TEXTS) < 2000:
            _TEXTS[(shape, due)] = text
    return text


# -- lone writes -------------------------------------------------------------------------

def _put_text(cas: bool, due: bool) -> str:
    return (f"WITH {_ON}, {_before('')}, w AS ({_cas('') if cas else _upsert('')}), "
            f"n AS MATERIALIZED (SELECT {_ident('true')} AS id FROM w, h), {_keep([('id', '')])}, "
            + _feed("nextval('change_ticket'), 1, 'put', %(kind)s, %(sid)s, %(key)s, w.version, NULL, NULL, n.id",
                    "w, n")
            + " SELECT w.version" + _FLAGS.format(due=_DUE[due]) + " FROM w")


def put_params(kind: str, sid: str, key: str, type_: str, value: Any, size: int,
               if_version: int | None, ttl: Any, i: str = "") -> dict[str, Any]:
    keep = ttl == KEEP
    return {f"kind{i}": kind, f"sid{i}": sid, f"key{i}": key, f"type{i}": type_,
            f"value{i}": None if type_ == "bytes" else value,
            f"data{i}": value if type_ == "bytes" else None, f"size{i}": size,
            f"ttl{i}": None if keep or ttl is None else float(ttl), f"keep{i}": keep,
            f"any{i}": if_version is None, f"if_version{i}": if_version}


def put(c: Any, kind: str, sid: str, key: str, type_: str, value: Any, size: int,
        if_version: int | None, ttl: Any) -> int | None:
    """A put of a JSON or bytes value; its version, or None: not done (kv_put's turn)."""
    cas = if_version is not None and if_version > 0
    text = _text(("put", cas), c.tidy, lambda: _put_text(cas, c.tidy))
    row = c.lean(text, put_params(kind, sid, key, type_, value, size, if_version, ttl))
    return None if row is None else row[0]


_APPEND = f"""WITH {_ON}, {_before("")}, w AS (
    INSERT INTO kv AS t (kind, scope_id, key, version, type, list_id, length, size, updated_at, expires_at)
    SELECT %(kind)s, %(sid)s, %(key)s, 1, 'list',
           CASE WHEN EXISTS (SELECT FROM b) THEN 0 ELSE nextval('list_seq') END,
           %(n)s, %(size)s, clock_timestamp(), clock_timestamp() + %(ttl)s::float8 * interval '1 second'
    ON CONFLICT (kind, scope_id, key) DO UPDATE
    SET version = t.version + 1, length = t.length + excluded.length,
        size = t.size + excluded.size - 2 + CASE WHEN t.length > 0 THEN 1 ELSE 0 END,
        updated_at = excluded.updated_at,
        expires_at = CASE WHEN %(ttl)s::float8 IS NULL THEN t.expires_at ELSE excluded.expires_at END
    WHERE t.type = 'list' AND {LIVE} AND {_same("")}
      AND t.size + excluded.size - 2 + CASE WHEN t.length > 0 THEN 1 ELSE 0 END <= 1048576
    RETURNING t.version, t.list_id, t.length),
n AS MATERIALIZED (SELECT {_ident("true")} AS id FROM w, h), {_keep([("id", "")])},
i AS (INSERT INTO list_item (list_id, idx, item)
      SELECT w.list_id, w.length - %(n)s + u.o - 1, u.item
      FROM w, json_array_elements(%(items)s::json) WITH ORDINALITY AS u(item, o)),
"""


def append(c: Any, kind: str, sid: str, key: str, items: list[str], items_size: int,
           ttl: Any) -> tuple[int, int] | None:
    """Items added at the end of a live list, or of a new one; (length, version), or None:
    not done (kv_append's turn: a deleted or expired key, not a list, too large).

    A new list's list_id is taken only when the key has no row at all (a row is never
    removed, so then the INSERT creates it): a refused append takes none."""
    def build() -> str:
        return (_APPEND + _feed("nextval('change_ticket'), 1, 'append', %(kind)s, %(sid)s, %(key)s, "
                                "w.version, w.length - %(n)s, %(n)s, n.id", "w, n")
                + " SELECT w.length, w.version" + _FLAGS.format(due=_DUE[c.tidy]) + " FROM w")

    return c.lean(_text("append", c.tidy, build), {
        "kind": kind, "sid": sid, "key": key, "n": len(items), "size": items_size,
        "items": "[" + ",".join(items) + "]",  # one JSON text: no array of texts to escape
        "ttl": None if ttl == KEEP or ttl is None else float(ttl)})


def delete(c: Any, kind: str, sid: str, key: str, if_version: int | None) -> bool | None:
    """A delete: True (it was live), False (no live key, none expired: without
    ``if_version``), or None: not done (kv_delete's turn: an expired key, whose
    ``expire`` change it records, a list, a row changed meanwhile, or ``if_version``
    given and not matched)."""
    def build() -> str:
        return (f"WITH {_ON}, {_before('')}, w AS ({_delete('')}), "
                f"n AS MATERIALIZED (SELECT {_ident('true')} AS id FROM w, h), {_keep([('id', '')])}, "
                + _feed("nextval('change_ticket'), 1, 'delete', %(kind)s, %(sid)s, %(key)s, w.version, "
                        "NULL, NULL, n.id", "w, n")
                + " SELECT EXISTS (SELECT FROM w)" + _FLAGS.format(due=_DUE[c.tidy])
                + " WHERE EXISTS (SELECT FROM w) OR (%(if_version)s::int8 IS NULL AND NOT "
                + _left("") + ")")

    row = c.lean(_text("delete", c.tidy, build),
                 {"kind": kind, "sid": sid, "key": key, "if_version": if_version})
    return None if row is None else row[0]


# -- a batch -----------------------------------------------------------------------------

# The most ops a batch's one statement holds: each is a few CTEs and a column of its
# results (PostgreSQL allows 1,664 columns; a statement of thousands of CTEs is planned
# slower than the functions run), and each shape is a statement prepared per connection.
MAX_OPS = 64


def batchable(ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]]) -> bool:
    """Whether a batch can go as one statement: up to MAX_OPS checks, puts of JSON or
    bytes values and deletes, each of a key of its own (a key written twice, or checked
    and written, goes through the functions, one op after another)."""
    if len(ops) > MAX_OPS:
        return False
    seen = set()
    for op, kind, sid, key, args, _kw in ops:
        if op == "put" and args[3] is not None:  # a list value: its items
            return False
        if op not in ("check", "put", "delete") or (kind, sid, key) in seen:
            return False
        seen.add((kind, sid, key))
    return True


def _shape(ops: list[Any]) -> tuple[str, ...]:
    out = []
    for op, _kind, _sid, _key, _args, kw in ops:
        v = kw.get("if_version")
        if op == "check":
            out.append("check0" if v == 0 else "check")
        elif op == "put":
            out.append("cas" if v is not None and v > 0 else "put")
        else:
            out.append("delete")
    return tuple(out)


def _chain_text(shape: tuple[str, ...], due: bool) -> str:
    """The statement of a batch of checks at versions and then puts, a chain of CTEs: each
    check locks its row at the version asked for and yields a row, each write runs only
    once the op before it yielded one, so that a check or a first put that fails leaves
    nothing written and no row; a later put that fails, after others wrote, raises
    agentstate:Fallback (which undoes the statement). The changes of the puts under one
    ticket taken after the last write, their ids (and before-images) after the writes."""
    ctes, puts, before = [_ON], [], ""
    for n, op in enumerate(shape, 1):
        i = str(n)
        if op == "check":
            join = f", {before}" if before else ""
            ctes.append(f"o{i} AS MATERIALIZED (SELECT 1 FROM kv t{join} WHERE {_key(i)} AND {LIVE} "
                        f"AND t.version = %(if_version{i})s FOR UPDATE OF t)")
        else:
            ctes.append(_before(i))
            ctes.append(f"o{i} AS ({_cas(i, before) if op == 'cas' else _upsert(i, before)})")
            puts.append(i)
        before = f"o{i}"
    first, *rest = puts
    sources = ", ".join(f"o{i}" for i in puts)
    ctes.append("n AS MATERIALIZED (SELECT " + ", ".join(f"{_ident('true')} AS n{i}" for i in puts)
                + f" FROM {sources}, h)")
    ctes.append(_keep([(f"n{i}", i) for i in puts]))
    rows = ", ".join(f"({i}, 'put', %(kind{i})s, %(sid{i})s, %(key{i})s, o{i}.version, NULL::int8, NULL::int8, "
                     f"n.n{i})" for i in puts)
    ctes.append(_feed("tk.ticket, v.ord, v.op, v.kind, v.sid, v.key, v.version, v.start, v.count, v.id",
                      f"(SELECT nextval('change_ticket') AS ticket) tk, {sources}, n, "
                      f"LATERAL (VALUES {rows}) AS v(ord, op, kind, sid, key, version, start, count, id)"))
    outs = ", ".join(f"o{i}.version" for i in puts)
    joins = "".join(f" LEFT JOIN o{i} ON true" for i in rest)
    refuse = ("CASE WHEN " + " OR ".join(f"o{i}.version IS NULL" for i in rest)
              + " THEN agentstate_error('Fallback', 'the batch goes through the functions') END, "
              if rest else "")
    return ("WITH " + ",\n".join(ctes) + f"\nSELECT {outs}, {refuse}" + _FLAGS.format(due=_DUE[due])[2:]
            + f" FROM o{first}{joins}")


def _batch_text(shape: tuple[str, ...], due: bool) -> str:
    """The statement of a batch of this shape: each op a CTE (``o1``, ``o2``, ...), run in
    order by ``r`` (scalar sub-selects are evaluated in order, each when it is reached),
    which is the ops' results; the changes under one ticket taken after every write, their
    ids (and before-images) too; and the error agentstate:Fallback, which undoes the
    statement, when an op was not done."""
    ctes, results, fails, changes, writes = [_ON], [], [], [], []
    for n, op in enumerate(shape, 1):
        i = str(n)
        if op in ("check", "check0"):
            ctes.append(f"o{i} AS {'' if op == 'check0' else 'MATERIALIZED '}({_check(i, op == 'check0')})")
            if op == "check":
                results.append(f"(SELECT ok FROM o{i}) AS r{i}")
                fails.append(f"r{i} IS NOT TRUE")
            else:
                results.append(f"(SELECT bool_and(ok) FROM o{i}) AS r{i}")
                fails.append(f"r{i} = false")
            continue
        ctes.append(_before(i))
        writes.append(i)
        if op in ("put", "cas"):
            ctes.append(f"o{i} AS ({_cas(i) if op == 'cas' else _upsert(i)})")
            results.append(f"(SELECT version FROM o{i}) AS r{i}")
            fails.append(f"r{i} IS NULL")
            changes.append(f"({i}, 'put', %(kind{i})s, %(sid{i})s, %(key{i})s, r.r{i}, NULL::int8, NULL::int8, "
                           f"n.n{i})")
        else:
            ctes.append(f"o{i} AS ({_delete(i)})")
            results.append(f"(SELECT version FROM o{i}) AS r{i}")
            # not done here: at a version not matched, or a row left (a list, expired, changed)
            fails.append(f"(r{i} IS NULL AND (%(if_version{i})s::int8 IS NOT NULL OR {_left(i)}))")
            changes.append(f"({i}, 'delete', %(kind{i})s, %(sid{i})s, %(key{i})s, r.r{i}, NULL::int8, "
                           f"NULL::int8, n.n{i})")
    ctes.append("r AS MATERIALIZED (SELECT " + ", ".join(results) + ")")
    if changes:
        ctes.append("n AS MATERIALIZED (SELECT "
                    + ", ".join(f"{_ident(f'r.r{i} IS NOT NULL')} AS n{i}" for i in writes) + " FROM r, h)")
        ctes.append(_keep([(f"n{i}", i) for i in writes]))
        ctes.append("tk AS MATERIALIZED (SELECT nextval('change_ticket') AS ticket FROM n)")
        ctes.append(_feed("tk.ticket, v.ord, v.op, v.kind, v.sid, v.key, v.version, v.start, v.count, v.id",
                          "r, n, tk, LATERAL (VALUES " + ", ".join(changes) + ") AS v(ord, op, kind, sid, "
                          "key, version, start, count, id)", "v.version IS NOT NULL"))
    outs = ", ".join(f"r.r{n}" for n in range(1, len(shape) + 1))
    refuse = ("CASE WHEN " + " OR ".join(fails)
              + " THEN agentstate_error('Fallback', 'the batch goes through the functions') END")
    return ("WITH " + ",\n".join(ctes) + f"\nSELECT {outs}, {refuse}" + _FLAGS.format(due=_DUE[due])
            + " FROM r")


def batch(c: Any, ops: list[tuple[str, str, str, str, tuple[Any, ...], dict[str, Any]]]
          ) -> list[Any] | None:
    """The ops' results (a check: its version; a put: the new version; a delete: whether
    the key was there), or None: not done (the functions' turn, see ``batchable``)."""
    shape = _shape(ops)
    params: dict[str, Any] = {}
    for n, (op, kind, sid, key, args, kw) in enumerate(ops, 1):
        i = str(n)
        if op == "put":
            type_, value, size, _items = args
            params.update(put_params(kind, sid, key, type_, value, size, kw.get("if_version"),
                                     kw.get("ttl"), i))
        else:
            params.update({f"kind{i}": kind, f"sid{i}": sid, f"key{i}": key,
                           f"if_version{i}": kw.get("if_version")})
    k = shape.count("check")
    chain = k < len(shape) and shape[:k] == ("check",) * k and all(op in ("put", "cas") for op in shape[k:])
    row = c.lean(_text(("batch", shape), c.tidy,
                       lambda: (_chain_text if chain else _batch_text)(shape, c.tidy)), params)
    if row is None:
        return None
    values = iter(row)
    out: list[Any] = []
    for each in ops:
        if each[0] == "check":
            out.append(each[5]["if_version"])
            if not chain:
                next(values)
        elif each[0] == "put":
            out.append(next(values))
        else:
            out.append(next(values) is not None)
    return out

