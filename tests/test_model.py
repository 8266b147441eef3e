"""A stateful model of the public API: scopes, versions, CAS, append, delete, transactions,
runs and turns, compared with the store after every step, across close and reopen."""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import agentstate
from agentstate import NotAList, SessionBusy, VersionConflict

SCOPES = [("session", "s1"), ("agent", "a1"), ("user", "u_1"), ("thread", "t:1")]
KEYS = ["k", "k.1", "k_2", "list", "l2"]
VALUES = st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab", max_size=3) | \
    st.lists(st.integers(0, 3), max_size=3) | st.dictionaries(st.text("xy", max_size=2), st.integers(0, 3), max_size=2)
ALICE = agentstate.Principal("alice")


class Store(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.path = os.path.join(tempfile.mkdtemp(), "model.db")
        self.db = agentstate.open(self.path)
        self.kv: dict[tuple, tuple] = {}  # (kind, sid, key) -> (value, version)
        self.seen: dict[tuple, int] = {}  # highest version ever returned for a key
        self.run: list = []
        self.db.runs.write("run", [], None, create=True)
        self.sid = self.db.sessions.create(ALICE).id
        self.active: agentstate.Turn | None = None
        self.finished = 0

    def scope(self, i):
        return self.db.scope(*SCOPES[i])

    def _wrote(self, k, value, version):
        assert version > self.seen.get(k, 0), "versions must rise and never be reused"
        self.seen[k] = version
        self.kv[k] = (value, version)

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS), value=VALUES, cas=st.sampled_from(["none", "right", "stale"]))
    def put(self, i, key, value, cas):
        k = (*SCOPES[i], key)
        current = self.kv.get(k, (None, 0))[1]
        if cas == "none":
            self._wrote(k, value, self.scope(i).put(key, value))
        elif cas == "right":
            self._wrote(k, value, self.scope(i).put(key, value, if_version=current))
        else:
            with pytest.raises(VersionConflict) as e:
                self.scope(i).put(key, value, if_version=current + 1)
            assert e.value.current_version == current

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS), cas=st.booleans())
    def delete(self, i, key, cas):
        k = (*SCOPES[i], key)
        current = self.kv.get(k, (None, 0))[1]
        existed = self.scope(i).delete(key, if_version=current if cas else None)
        assert existed == (k in self.kv)
        self.kv.pop(k, None)

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS))
    def update(self, i, key):
        k = (*SCOPES[i], key)
        new = self.scope(i).update(key, lambda v: [v], default="absent")
        old = self.kv.get(k, ("absent", 0))[0]
        assert new == [old]
        self._wrote(k, new, self.scope(i).get_versioned(key).version)

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS), items=st.lists(VALUES, max_size=3))
    def append(self, i, key, items):
        k = (*SCOPES[i], key)
        old = self.kv.get(k)
        if old is not None and not isinstance(old[0], list):
            with pytest.raises(NotAList):
                self.scope(i).append(key, items)
            return
        r = self.scope(i).append(key, items)
        value = (old[0] if old else []) + items
        assert r.length == len(value)
        if old is not None and not items:
            assert r.version == old[1]
            return
        self._wrote(k, value, r.version)

    @rule(writes=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(KEYS), st.integers(0, 9)),
                          min_size=1, max_size=4), abort=st.booleans())
    def transaction(self, writes, abort):
        pending = {}
        try:
            with self.db.transaction():
                for i, key, v in writes:
                    pending[(*SCOPES[i], key)] = (v, self.scope(i).put(key, v))
                if abort:
                    raise RuntimeError("abort")
        except RuntimeError:
            pass
        if not abort:
            for k, (v, version) in pending.items():
                self._wrote(k, v, version)

    @rule(n=st.integers(1, 3), resend=st.booleans())
    def run_write(self, n, resend):
        start = max(0, len(self.run) - 1) if resend and self.run else len(self.run)
        entries = [{"seq": s, "v": s * 2} for s in range(start, len(self.run) + n)]
        self.db.runs.write("run", entries, {"len": len(self.run) + n})
        self.run = self.run[:start] + entries if start < len(self.run) else self.run + entries

    @rule()
    def turn(self):
        if self.active is None:
            self.active = self.db.sessions.start_turn(self.sid, ALICE)
        else:
            with pytest.raises(SessionBusy):
                self.db.sessions.start_turn(self.sid, ALICE)
            self.active.finish()
            self.active = None
            self.finished += 1

    @rule()
    def reopen(self):
        self.db.close()
        self.db = agentstate.open(self.path)
        if self.active is not None:
            self.active = self.db.sessions.get_turn(self.active.id, ALICE)

    @invariant()
    def matches(self):
        if not hasattr(self, "db"):
            return
        for kind, sid in SCOPES:
            s = self.db.scope(kind, sid)
            want = sorted(k for (kk, ss, k) in self.kv if (kk, ss) == (kind, sid))
            assert s.list() == want
            for key in KEYS:
                assert tuple(s.get_versioned(key)) == self.kv.get((kind, sid, key), (None, 0))
        rec = self.db.runs.read("run")
        assert rec.entries == self.run
        turns = self.db.sessions.turns(self.sid, ALICE)
        assert sum(t.status == "finished" for t in turns) == self.finished
        assert sum(t.status == "running" for t in turns) == (self.active is not None)

    def teardown(self):
        if hasattr(self, "db"):
            assert self.db.check() == []
            self.db.close()


Store.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_store_model = Store.TestCase
