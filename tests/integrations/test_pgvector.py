"""AgentStateStore's search (SPEC §19) on PostgreSQL with the pgvector extension installed:
the real extension, not a stand-in. Debian 12 packages no pgvector, so the server is PGlite
(PostgreSQL compiled to WebAssembly, with its pgvector build) behind its socket server, both
from the npm registry (tests/fixtures/pglite); psycopg speaks to it as to any PostgreSQL."""

from __future__ import annotations

import math
import socket
import subprocess
import time

import psycopg
import pytest

import agentstate
from agentstate.integrations.langgraph import AgentStateStore

from .. import nodejs
from ..conftest import REPO
from .test_langgraph_vectors import embed, index, scored

PACKAGE = REPO / "tests" / "fixtures" / "pglite"
SERVER = PACKAGE / "node_modules" / "@electric-sql" / "pglite-socket" / "dist" / "scripts" / "server.js"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pgvector_url():
    """A fresh PGlite database with pgvector loaded, served on a free local port: one per test,
    as PGlite runs every client connection in its one backend (prepared statements and all)."""
    npm = nodejs.npm("the pgvector tests")
    nodejs.install(npm, PACKAGE)
    port = _free_port()
    proc = subprocess.Popen(["node", str(SERVER), "-p", str(port), "-m", "4",
                             "-e", "@electric-sql/pglite-pgvector:vector"],
                            cwd=PACKAGE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")
            try:
                with psycopg.connect(url, autocommit=True, connect_timeout=2) as c:
                    c.execute("CREATE EXTENSION IF NOT EXISTS vector")
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "PGlite's socket server never answered"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# A PGlite server a test (~3 s): the default run tries cosine, CI's -m slow the other two as well.
@pytest.mark.parametrize("metric", ["cosine", *(pytest.param(m, marks=pytest.mark.slow)
                                                for m in ("l2", "inner_product"))])
def test_pgvector_ranks_and_scores_as_the_exact_search(pgvector_url, metric):
    """Each distance type: pgvector's ranking and scores are the exact search's (same store,
    same rows), and PostgresStore's formulas; unindexed items follow, unscored."""
    with psycopg.connect(pgvector_url) as c:
        (version,) = c.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
    assert version  # the real extension, found and used below: no stand-in
    with agentstate.open(pgvector_url) as db:
        store = AgentStateStore(db, index=index(fields=["t"], distance_type=metric))
        ns = (metric,)
        words = ("alpha", "beta", "gamma", "delta", "epsilon")
        for word in words:
            store.put(ns, word, {"t": word})
        store.put(ns, "plain", {"t": "alpha"}, index=False)
        assert db._ops.vector_search() == "pgvector"
        assert db._ops._vectors == "pgvector:public"  # the schema it is installed in
        real = scored(store.search(ns, query="gamma", limit=10))
        db._ops._vectors = "exact"
        exact = scored(store.search(ns, query="gamma", limit=10))
    q = embed(["gamma"])[0]
    want = {
        "cosine": lambda v: sum(x * y for x, y in zip(v, q)) / (math.hypot(*v) * math.hypot(*q)),
        "l2": lambda v: -math.dist(v, q),
        "inner_product": lambda v: sum(x * y for x, y in zip(v, q)),
    }[metric]
    expected = sorted(((w, want(embed([w])[0])) for w in words), key=lambda p: -p[1])
    assert [k for k, _ in real] == [k for k, _ in exact] == [k for k, _ in expected] + ["plain"]
    assert [s for _, s in real[:5]] == pytest.approx([s for _, s in expected], abs=1e-5)
    assert [s for _, s in exact[:5]] == pytest.approx([s for _, s in expected], abs=1e-5)
    assert real[-1] == ("plain", None)


def test_a_replaced_or_deleted_item_is_found_by_its_new_vector_only(pgvector_url):
    """pgvector reads the vectors the store keeps with the item: a put replaces them, a delete
    removes them, and search never finds the old text."""
    with agentstate.open(pgvector_url) as db:
        store = AgentStateStore(db, index=index(fields=["t"]))
        ns = ("replace",)
        store.put(ns, "a", {"t": "old words"})
        store.put(ns, "b", {"t": "other"})
        (top, _) = store.search(ns, query="old words", limit=2)
        assert top.key == "a" and top.score == pytest.approx(1.0, abs=1e-5)
        store.put(ns, "a", {"t": "new words"})
        (top, _) = store.search(ns, query="new words", limit=2)
        assert top.key == "a" and top.score == pytest.approx(1.0, abs=1e-5)
        assert all(r.score < 0.99 for r in store.search(ns, query="old words", limit=2))
        store.delete(ns, "a")
        assert [r.key for r in store.search(ns, query="new words", limit=5)] == ["b"]
