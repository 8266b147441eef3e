"""AgentStateStore's search by meaning (SPEC §19) beyond LangGraph's own suites: the
same results as LangGraph's InMemoryStore (and PostgresStore's scores), on a file and on
PostgreSQL; vectors written and removed with their item, kept across a restart, never
found once their item expired; two processes at once; no embedding inside a write
transaction; and the pgvector statement against a stand-in for the extension."""

from __future__ import annotations

import asyncio
import hashlib
import math
import multiprocessing
import random
import sys
import time
import uuid

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.store.memory import InMemoryStore

import agentstate
from agentstate.integrations.langgraph import AgentStateStore

from ..conftest import on_postgres, target

DIMS = 16
SCOPE = ("app", "langgraph.store")


def embed(texts: list[str]) -> list[list[float]]:
    """Each text as a fixed pseudo-random vector (from its hash): distinct texts are
    almost surely apart, the same text always lands on the same vector."""
    out = []
    for text in texts:
        rnd = random.Random(hashlib.sha256(text.encode()).digest())
        out.append([rnd.gauss(0, 1) for _ in range(DIMS)])
    return out


def index(**more):
    return {"dims": DIMS, "embed": embed, **more}


def scored(results):
    return [(r.key, r.score) for r in results]


def vector_keys(db) -> list[str]:
    return db.scope(*SCOPE).list("v.")


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    return dot / (na * nb) if na and nb else 0.0


# -- the same results as LangGraph's own stores --------------------------------------------

DOCS = st.lists(st.tuples(st.sampled_from(["k0", "k1", "k2", "k3", "k4", "k5"]),
                          st.sampled_from([("a",), ("a", "b"), ("c",)]),
                          st.text("xyzw ", max_size=6),
                          st.sampled_from([None, False, ["t"], ["t", "u"]])),
                max_size=12)


@settings(max_examples=25, deadline=None)
@given(DOCS, st.text("xyzw ", min_size=1, max_size=6), st.integers(0, 3),
       st.sampled_from([(), ("a",), ("a", "b")]))
def test_search_ranks_as_langgraph_s_in_memory_store(tmp_path_factory, docs, query, offset, prefix):
    """For any puts (fields from the config, a per-put list, or index=False) and query,
    the scored results are InMemoryStore's for the same items (same order, same cosine
    scores, from the same offset); the unscored ones follow, the same items.
    (InMemoryStore is given each item's last put only: a put with index=False, or with
    fewer texts, leaves the item's old vectors there, as in LangGraph's SQL stores.)"""
    path = tmp_path_factory.mktemp("v") / "v.db"
    ours_db = agentstate.open(str(path))
    try:
        ours = AgentStateStore(ours_db, index=index(fields=["t"]))
        theirs = InMemoryStore(index=index(fields=["t"]))
        last = {}
        for key, ns, text, idx in docs:
            ours.put(ns, key, {"t": text, "u": text[::-1] + "!"}, index=idx)
            last[(ns, key)] = (text, idx)
        for (ns, key), (text, idx) in last.items():
            theirs.put(ns, key, {"t": text, "u": text[::-1] + "!"}, index=idx)
        got = ours.search(prefix, query=query, limit=50, offset=offset)
        want = theirs.search(prefix, query=query, limit=50)
    finally:
        ours_db.close()
    want_scored = [r for r in want if r.score is not None]
    unscored = {(tuple(r.namespace), r.key) for r in want if r.score is None}
    got_scored, rest = got[:len(want_scored[offset:])], got[len(want_scored[offset:]):]
    assert [r.key for r in got_scored] == [r.key for r in want_scored[offset:]] \
        or _near_ties(want_scored)
    by_item = {(tuple(r.namespace), r.key): r for r in want_scored}
    for g in got_scored:
        w = by_item[(g.namespace, g.key)]
        assert g.value == w.value and g.score == pytest.approx(w.score, abs=1e-5)
    assert all(r.score is None for r in rest)
    # the unscored ones: all of them after the scored ones (as many as the offset leaves)
    assert {(r.namespace, r.key) for r in rest} <= unscored
    assert len(rest) == max(0, len(unscored) - max(0, offset - len(want_scored)))


def _near_ties(results) -> bool:
    """float32 (sqlite-vec) and float64 (InMemoryStore) may order two scores closer than
    this the other way round."""
    return any(abs(a.score - b.score) < 1e-5 for a, b in zip(results, results[1:]))


@pytest.mark.parametrize("metric", ["cosine", "l2", "inner_product"])
def test_scores_are_postgres_store_s(any_db, metric):
    """Each distance_type scores as PostgresStore does (cosine similarity, minus the L2
    distance, the inner product), ranks best first, and a zero vector scores 0 by cosine."""
    fixed = {"one": [1.0, 2.0, 0.0], "two": [-1.0, 0.5, 3.0], "zero": [0.0, 0.0, 0.0],
             "q": [0.5, -1.0, 2.0]}
    store = AgentStateStore(any_db, index={"dims": 3, "embed": lambda ts: [fixed[t] for t in ts],
                                           "fields": ["t"], "distance_type": metric})
    for key in ("one", "two", "zero"):
        store.put(("m",), key, {"t": key})
    q = fixed["q"]
    want = {
        "cosine": lambda v: cosine(v, q),
        "l2": lambda v: -math.dist(v, q),
        "inner_product": lambda v: sum(x * y for x, y in zip(v, q)),
    }[metric]
    expected = sorted(((k, want(fixed[k])) for k in ("one", "two", "zero")), key=lambda p: -p[1])
    got = store.search(("m",), query="q")
    assert [k for k, _ in scored(got)] == [k for k, _ in expected]
    assert [s for _, s in scored(got)] == pytest.approx([s for _, s in expected], abs=1e-5)


def test_an_item_scores_by_its_best_vector_and_is_found_once(any_db):
    """An item with several vectors (a field list, or an array path) is found once, with
    its best vector's score."""
    store = AgentStateStore(any_db, index=index(fields=["a", "b[*]"]))
    store.put(("d",), "x", {"a": "apple", "b": ["car", "tree"]})
    store.put(("d",), "y", {"a": "tree", "b": []})
    got = store.search(("d",), query="tree")
    assert sorted(k for k, _ in scored(got)) == ["x", "y"]
    assert all(s == pytest.approx(1.0, abs=1e-6) for _, s in scored(got))
    assert len(vector_keys(any_db)) == 4


# -- vectors live and die with their item ----------------------------------------------------

def test_vectors_are_written_replaced_and_removed_with_their_item(any_db):
    """A put writes its vectors, a put with fewer (or index=False) leaves only those, and a
    delete removes them all; searching then scores only what is there."""
    store = AgentStateStore(any_db, index=index(fields=["t[*]"]))
    store.put(("d",), "x", {"t": ["a", "b", "c"]})
    assert len(vector_keys(any_db)) == 3
    store.put(("d",), "x", {"t": ["b"]})
    assert len(vector_keys(any_db)) == 1
    assert scored(store.search(("d",), query="a")) == [("x", pytest.approx(cosine(*embed(["b", "a"])), abs=1e-5))]
    store.put(("d",), "x", {"t": ["a"]}, index=False)
    assert vector_keys(any_db) == []
    assert scored(store.search(("d",), query="a")) == [("x", None)]
    store.put(("d",), "x", {"t": ["a", "b"]})
    store.delete(("d",), "x")
    assert vector_keys(any_db) == []
    assert store.search(("d",), query="a") == []


def test_unindexed_items_follow_the_scored_ones_with_filters_and_offsets(any_db):
    """index=False items come after every scored one, newest first, unscored; a filter
    applies to both; offset and limit page through the whole order."""
    store = AgentStateStore(any_db, index=index(fields=["t"]))
    for i in range(6):
        store.put(("d",), f"s{i}", {"t": f"text {i}", "even": i % 2 == 0})
    for i in range(4):
        store.put(("d",), f"u{i}", {"t": f"text {i}", "even": i % 2 == 0}, index=False)
    everything = store.search(("d",), query="text 3", limit=100)
    assert [r.key for r in everything][:1] == ["s3"]
    assert [r.key for r in everything[6:]] == ["u3", "u2", "u1", "u0"]
    assert all(r.score is not None for r in everything[:6])
    assert all(r.score is None for r in everything[6:])
    pages = [store.search(("d",), query="text 3", limit=3, offset=o) for o in range(0, 12, 3)]
    assert [r.key for page in pages for r in page] == [r.key for r in everything]
    even = store.search(("d",), query="text 3", filter={"even": True}, limit=100)
    assert [r.key for r in even] == [r.key for r in everything if r.value["even"]]
    assert [r.key for r in store.search(("d",), query="text 3", filter={"even": True},
                                        limit=2, offset=3)] == [r.key for r in even[3:5]]


def test_an_expired_item_is_never_found_and_its_vectors_go_with_the_sweep(any_db):
    """From the instant its TTL passes, an item is in no search, with a query or without;
    sweep_ttl removes its vectors with it."""
    store = AgentStateStore(any_db, index=index(fields=["t"]))
    store.put(("d",), "old", {"t": "same"}, ttl=0.002)  # minutes: 120 ms
    store.put(("d",), "new", {"t": "same"})
    assert {r.key for r in store.search(("d",), query="same")} == {"old", "new"}
    time.sleep(0.25)
    assert [r.key for r in store.search(("d",), query="same")] == ["new"]
    assert [r.key for r in store.search(("d",))] == ["new"]
    assert len(vector_keys(any_db)) == 2
    assert store.sweep_ttl() == 1
    assert len(vector_keys(any_db)) == 1


def test_vectors_survive_a_restart(any_db, tmp_path):
    """Closed and opened again (a new process would do the same), the store finds what it
    had by meaning, with the same scores."""
    where = target(any_db)
    store = AgentStateStore(any_db, index=index(fields=["t"]))
    for word in ("alpha", "beta", "gamma"):
        store.put(("d",), word, {"t": word})
    before = scored(store.search(("d",), query="beta"))
    any_db.close()
    with agentstate.open(where) as again:
        after = scored(AgentStateStore(again, index=index(fields=["t"])).search(("d",), query="beta"))
    assert [k for k, _ in after] == [k for k, _ in before] and after[0][0] == "beta"
    assert [s for _, s in after] == pytest.approx([s for _, s in before], abs=1e-6)


def test_async_search_and_put_with_an_async_embedding(any_db):
    """An async embed function serves aput and asearch (LangGraph calls it on the loop);
    the sync calls of such a store say it cannot (LangGraph's own wrapper refuses)."""
    async def aembed(texts):
        await asyncio.sleep(0)
        return embed(texts)

    store = AgentStateStore(any_db, index={"dims": DIMS, "embed": aembed, "fields": ["t"]})

    async def run():
        await store.aput(("d",), "a", {"t": "alpha"})
        await store.aput(("d",), "b", {"t": "beta"})
        return await store.asearch(("d",), query="alpha")

    got = asyncio.run(run())
    assert got[0].key == "a" and got[0].score == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="async function"):
        store.put(("d",), "c", {"t": "gamma"})
    assert [r.key for r in store.search(("d",))] == ["b", "a"]


# -- the config -----------------------------------------------------------------------------

def test_the_config_is_langgraph_s(db):
    """The config is kept as given; text_fields is SqliteStore's spelling of fields; a
    "provider:model" string is resolved by LangGraph's own helper (which needs langchain:
    without it, LangGraph's own error); a bad config is refused when the store is made."""
    store = AgentStateStore(db, index={"dims": DIMS, "embed": embed, "text_fields": ["u"],
                                       "ann_index_config": {"kind": "hnsw"}})
    assert store.index_config["text_fields"] == ["u"] and store.index_config["embed"] is embed
    store.put(("d",), "x", {"t": "no", "u": "yes"})
    assert store.search(("d",), query="yes")[0].score == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError) as theirs:
        InMemoryStore(index={"dims": 3, "embed": "nowhere:model"})
    with pytest.raises(ValueError) as ours:
        AgentStateStore(db, index={"dims": 3, "embed": "nowhere:model"})
    assert str(ours.value) == str(theirs.value)
    for bad in ({"dims": 0, "embed": embed}, {"dims": "3", "embed": embed},
                {"dims": 3, "embed": embed, "distance_type": "hamming"},
                {"dims": 3, "embed": embed, "fields": 3}, {"dims": 3}):
        with pytest.raises(ValueError):
            AgentStateStore(db, index=bad)


def test_a_provider_string_becomes_langchain_s_embeddings(db, monkeypatch):
    """``embed="provider:model"`` is what LangChain's init_embeddings makes of it, as in
    LangGraph's stores."""
    import langgraph.store.base.embed as lg_embed
    from langchain_core.embeddings import Embeddings

    class Fake(Embeddings):
        def embed_documents(self, texts):
            return embed(texts)

        def embed_query(self, text):
            return embed([text])[0]

    asked = []
    monkeypatch.setattr(lg_embed, "_get_init_embeddings",
                        lambda: lambda name: asked.append(name) or Fake())
    store = AgentStateStore(db, index={"dims": DIMS, "embed": "fake:model-1"})
    assert asked == ["fake:model-1"] and isinstance(store.embeddings, Fake)
    store.put(("d",), "x", {"t": "hello"})
    assert store.search(("d",), query="anything")[0].key == "x"


def test_a_wrong_embedding_writes_nothing(any_db):
    """An embedding of the wrong length, or with NaN, is refused before anything is
    written (the item too)."""
    for wrong in ([[1.0] * (DIMS - 1)], [[float("nan")] * DIMS], []):
        store = AgentStateStore(any_db, index={"dims": DIMS, "embed": lambda ts, w=wrong: w})
        with pytest.raises(ValueError):
            store.put(("d",), "x", {"t": "a"})
    assert any_db.scope(*SCOPE).list("") == []


def test_a_file_without_sqlite_vec_says_how_to_get_it(db_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sqlite_vec", None)
    with agentstate.open(db_path) as db:
        with pytest.raises(ImportError, match=r"agentstate-db\[vec\]"):
            AgentStateStore(db, index=index())
        AgentStateStore(db).put(("d",), "x", {"t": 1})  # without an index it needs nothing


# -- no embedding inside a write transaction ------------------------------------------------

def test_no_embedding_runs_while_the_store_holds_its_write_lock(db_path):
    """The model is called before the write: while it runs, another connection can write
    at once (busy_timeout 0), for a put, a delete of an indexed item, and the async calls."""
    calls = []

    def watching(texts):
        with agentstate.open(db_path, busy_timeout=0) as other:
            other.scope("app", "other").put("k", len(calls))  # Busy if the lock were held
        calls.append(texts)
        return embed(texts)

    with agentstate.open(db_path) as db:
        store = AgentStateStore(db, index={"dims": DIMS, "embed": watching, "fields": ["t"]})
        store.put(("d",), "x", {"t": "a"})
        store.put(("d",), "y", {"t": "b"})
        store.search(("d",), query="a")
        asyncio.run(store.aput(("d",), "z", {"t": "c"}))
        asyncio.run(store.asearch(("d",), query="c"))
    assert calls == [["a"], ["b"], ["a"], ["c"], ["c"]]


# -- two processes ----------------------------------------------------------------------------

def _vector_worker(where: str, who: str, n: int, barrier) -> None:
    with agentstate.open(where) as db:
        store = AgentStateStore(db, index=index(fields=["t"]))
        barrier.wait()
        for i in range(n):
            store.put(("shared",), f"{who}{i}", {"t": f"{who} says {i}"})
            if i % 5 == 4:
                store.put(("shared",), f"{who}{i - 1}", {"t": f"{who} said {i - 1}"})
            for r in store.search(("shared",), query=f"{who} says {i}", limit=5):
                # whatever it finds scores by that item's own current text: no stale vector
                want = cosine(embed([r.value["t"]])[0], embed([f"{who} says {i}"])[0])
                assert r.score == pytest.approx(want, abs=1e-5), (r.key, r.value)


def test_two_processes_putting_and_searching_lose_nothing(any_db):
    """Two processes put, re-put and search one namespace at once: every search scores
    each item by its own current vectors, and afterwards every item is found by its own
    text, with one vector each."""
    n = 25
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_vector_worker, args=(target(any_db), w, n, barrier)) for w in "ab"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    store = AgentStateStore(any_db, index=index(fields=["t"]))
    everything = store.search(("shared",), limit=1000)
    assert sorted(r.key for r in everything) == sorted(f"{w}{i}" for w in "ab" for i in range(n))
    for r in everything:
        (top,) = store.search(("shared",), query=r.value["t"], limit=1)
        assert top.key == r.key and top.score == pytest.approx(1.0, abs=1e-5)
    assert len(vector_keys(any_db)) == 2 * n


# -- pgvector's statement, against a stand-in for the extension ------------------------------

STAND_IN = """
CREATE SCHEMA fakevec;
CREATE DOMAIN fakevec.vector AS text;
CREATE FUNCTION fakevec.arr(fakevec.vector) RETURNS float8[] LANGUAGE sql IMMUTABLE
    AS $$ SELECT translate($1::text, '[]', '{}')::float8[] $$;
CREATE FUNCTION fakevec.dot(fakevec.vector, fakevec.vector) RETURNS float8 LANGUAGE sql
    AS $$ SELECT sum(a * b) FROM unnest(fakevec.arr($1), fakevec.arr($2)) AS t(a, b) $$;
CREATE FUNCTION fakevec.cos_d(fakevec.vector, fakevec.vector) RETURNS float8 LANGUAGE sql
    AS $$ SELECT 1 - fakevec.dot($1, $2) / (sqrt(fakevec.dot($1, $1)) * sqrt(fakevec.dot($2, $2))) $$;
CREATE FUNCTION fakevec.l2_d(fakevec.vector, fakevec.vector) RETURNS float8 LANGUAGE sql
    AS $$ SELECT sqrt(sum((a - b) ^ 2)) FROM unnest(fakevec.arr($1), fakevec.arr($2)) AS t(a, b) $$;
CREATE FUNCTION fakevec.nip(fakevec.vector, fakevec.vector) RETURNS float8 LANGUAGE sql
    AS $$ SELECT -fakevec.dot($1, $2) $$;
CREATE OPERATOR fakevec.<=> (LEFTARG = fakevec.vector, RIGHTARG = fakevec.vector, FUNCTION = fakevec.cos_d);
CREATE OPERATOR fakevec.<-> (LEFTARG = fakevec.vector, RIGHTARG = fakevec.vector, FUNCTION = fakevec.l2_d);
CREATE OPERATOR fakevec.<#> (LEFTARG = fakevec.vector, RIGHTARG = fakevec.vector, FUNCTION = fakevec.nip);
"""


@pytest.mark.parametrize("metric", ["cosine", "l2", "inner_product"])
def test_the_pgvector_statement_scores_as_the_exact_search(pg_url, metric):
    """pgvector's statement (the cast of a stored vector to the extension's type, its three
    operators, the scores made of them) against a stand-in installed in a schema of its own
    on the suite's PostgreSQL 15 (Debian packages no pgvector): the schema is named in every
    operator. The real extension is tested on PGlite (test_pgvector.py)."""
    schema = "fakevec_" + uuid.uuid4().hex[:8]  # the server's: one per test
    with psycopg.connect(pg_url, autocommit=True) as c:
        c.execute(STAND_IN.replace("fakevec", schema))
    try:
        with agentstate.open(pg_url) as db:
            store = AgentStateStore(db, index=index(fields=["t"], distance_type=metric))
            assert db._ops.vector_search() == "exact"
            for word in ("alpha", "beta", "gamma", "delta"):
                store.put(("d",), word, {"t": word})
            store.put(("d",), "plain", {"t": "alpha"}, index=False)
            exact = scored(store.search(("d",), query="gamma", limit=10))
            db._ops._vectors = f"pgvector:{schema}"
            stand_in = scored(store.search(("d",), query="gamma", limit=10))
    finally:
        with psycopg.connect(pg_url, autocommit=True) as c:
            c.execute(f"DROP SCHEMA {schema} CASCADE")
    assert [k for k, _ in stand_in] == [k for k, _ in exact]
    assert [s for _, s in stand_in[:4]] == pytest.approx([s for _, s in exact[:4]], abs=1e-6)
    assert stand_in[-1] == ("plain", None)


def test_the_choice_of_search_is_made_once_per_store(any_db, monkeypatch):
    """On a file sqlite-vec, on PostgreSQL without the extension the exact search; asked
    when the store is made, not again per search."""
    ops = any_db._ops
    store = AgentStateStore(any_db, index=index())
    assert ops.vector_search() == ("exact" if on_postgres(any_db) else "sqlite-vec")
    asked = []
    real = ops.kv.vector_method
    monkeypatch.setattr(ops.kv, "vector_method", lambda c: asked.append(1) or real(c))
    store.put(("d",), "x", {"t": "a"})
    store.search(("d",), query="a")
    AgentStateStore(any_db, index=index()).search(("d",), query="a")
    assert asked == []
