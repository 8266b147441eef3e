"""The LangGraph store's own index stays exact under any mix of calls from two stores
(one with an embedding index, one without): puts with and without a TTL or vectors,
deletes, items left to expire, sweeps and searches."""

from __future__ import annotations

import os
import tempfile
import time

from hypothesis import given, settings
from hypothesis import strategies as st

import agentstate
from agentstate.integrations.langgraph import AgentStateStore
from agentstate.integrations.langgraph.store import _stamp

OPS = st.lists(st.tuples(
    st.integers(0, 1),  # which store
    st.sampled_from(["put", "put_ttl", "put_unindexed", "delete", "sweep", "search", "wait"]),
    st.sampled_from([("a",), ("a", "b"), ("c",)]),
    st.sampled_from(["k", "l", "m"]),
    st.sampled_from([0.0002, 0.001, 10.0]),  # TTL minutes: 12 ms, 60 ms, 10 min
), min_size=1, max_size=40)


def exact_index(scope: agentstate.Scope) -> None:
    """Every stored item has one recency key and, with an expiry, one expiry key, both
    naming its current stamps, and as many vectors as it says; no other index key or
    vector; a namespace entry exactly for the namespaces that hold an item (one that
    expired counts until a sweep removes it)."""
    keys = scope.list("")
    items = {k: scope.get(k) for k in keys if k.startswith("i.")}
    recency, expiry, spaces, vectors = set(), set(), set(), set()
    for k, item in items.items():
        n = k[2:k.index(":")]
        recency.add(f"u.{n}:{item['r']}.{k[len(n) + 3:]}")
        if item["expires_at"] is not None:
            expiry.add(f"x.{_stamp(item['expires_at'])}.{k[2:]}")
        spaces.add(f"n.{n}")
        vectors.update(f"v.{k[2:]}.{i}" for i in range(item["v"]))
    assert {k for k in keys if k.startswith("u.")} == recency
    assert {k for k in keys if k.startswith("x.")} == expiry
    assert {k for k in keys if k.startswith("n.")} == spaces
    assert {k for k in keys if k.startswith("v.")} == vectors


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_the_store_s_index_stays_exact(ops):
    with tempfile.TemporaryDirectory() as folder:
        db = agentstate.open(os.path.join(folder, "store.db"))
        try:
            _run(db, ops)
        finally:
            db.close()


def _run(db, ops):
    index = {"dims": 2, "embed": lambda texts: [[len(t), 1.0] for t in texts],
             "fields": ["step", "words[*]"]}
    stores = [AgentStateStore(db, index=index), AgentStateStore(db)]
    scope = db.scope("app", "langgraph.store")
    for step, (which, op, ns, key, ttl) in enumerate(ops):
        store = stores[which]
        value = {"step": step, "words": ["w"] * (step % 3)}  # 1 to 3 vectors with an index
        if op == "put":
            store.put(ns, key, value)
        elif op == "put_ttl":
            store.put(ns, key, value, ttl=ttl)
        elif op == "put_unindexed":
            store.put(ns, key, value, index=False)
        elif op == "delete":
            store.delete(ns, key)
        elif op == "sweep":
            store.sweep_ttl()
        elif op == "search":
            found = store.search(ns[:1], limit=10, query="w" if which == 0 else None)
            assert len({(i.namespace, i.key) for i in found}) == len(found)
        else:
            time.sleep(0.015)
        exact_index(scope)
