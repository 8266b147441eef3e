"""A stateful model of the public API: scopes, versions, CAS, append, pop, delete, expiry,
transactions, runs (with trim) and turns, compared with the store after every step, across
close and reopen. The model predicts every row of the change feed.

Time is the model's: a fake clock stands in for the store's ``time.time()`` in the kv layer,
and the bounded background purge is off, so an 'expire' change appears exactly when a write
meets an expired key — which the model predicts. (The purge is tested in test_expiry.py.)
"""

from __future__ import annotations

import os
import tempfile

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import agentstate
from agentstate import NotAList, SessionBusy, VersionConflict
from agentstate.backends.sqlite import kv as _kv

SCOPES = [("session", "s1"), ("agent", "a1"), ("user", "u_1"), ("thread", "t:1")]
KEYS = ["k", "k.1", "k_2", "list", "l2"]
VALUES = st.none() | st.booleans() | st.integers(-5, 5) | st.text("ab", max_size=3) | \
    st.lists(st.integers(0, 3), max_size=3) | st.dictionaries(st.text("xy", max_size=2), st.integers(0, 3), max_size=2)
TTLS = st.sampled_from([None, None, 1.0, 5.0])
ALICE = agentstate.Principal("alice")


class Clock:
    """The model's time: only tick() moves it."""

    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def time(self) -> float:
        return self.now


class Store(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        self.clock = Clock()
        self._real = _kv.time
        _kv.time = self.clock
        self.path = os.path.join(tempfile.mkdtemp(), "model.db")
        self.db = self._open()
        # (kind, sid, key) -> [value, version, expires_at]; rows may be expired but not yet removed
        self.kv: dict[tuple, list] = {}
        self.seen: dict[tuple, int] = {}  # highest version ever returned for a key
        self.feed: list[tuple] = []  # every change row the store must hold, in order
        self.run: list = []
        self.first = 0  # entries below this seq were trimmed
        self.db.runs.write("run", [], None, create=True)
        self.feed.append(("run", "create", None, "run", None, None, 0, 0))
        self.sid = self.db.sessions.create(ALICE).id
        self.feed.append(("session", "create", None, self.sid, None, None, None, None))
        self.active: agentstate.Turn | None = None
        self.finished = 0

    def _open(self):
        db = agentstate.open(self.path)
        db._store.housekeeping = None  # no background purge: expiry rows come from writes only
        return db

    def scope(self, i):
        return self.db.scope(*SCOPES[i])

    def live(self, k):
        row = self.kv.get(k)
        return row if row is not None and (row[2] is None or row[2] > self.clock.now) else None

    def met(self, k):
        """A write meets the key: an expired row is expired for good first."""
        row = self.kv.get(k)
        if row is not None and self.live(k) is None:
            self.feed.append(("kv", "expire", *k, row[1], None, None))
            del self.kv[k]

    def _wrote(self, k, value, version, expires, op="put", span=(None, None)):
        assert version > self.seen.get(k, 0), "versions must rise and never be reused"
        self.seen[k] = version
        self.kv[k] = [value, version, expires]
        self.feed.append(("kv", op, *k, version, *span))

    def _span(self, value):
        return (0, len(value)) if isinstance(value, list) else (None, None)

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS), value=VALUES,
          cas=st.sampled_from(["none", "right", "stale"]), ttl=TTLS)
    def put(self, i, key, value, cas, ttl):
        k = (*SCOPES[i], key)
        current = (self.live(k) or (None, 0))[1]
        expires = None if ttl is None else self.clock.now + ttl
        if cas == "stale":
            with pytest.raises(VersionConflict) as e:
                self.scope(i).put(key, value, if_version=current + 1, ttl=ttl)
            assert e.value.current_version == current
            return
        version = self.scope(i).put(key, value, if_version=current if cas == "right" else None, ttl=ttl)
        self.met(k)
        self._wrote(k, value, version, expires, span=self._span(value))

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS), cas=st.booleans())
    def delete(self, i, key, cas):
        k = (*SCOPES[i], key)
        row = self.live(k)
        current = row[1] if row else 0
        existed = self.scope(i).delete(key, if_version=current if cas else None)
        assert existed == (row is not None)
        self.met(k)
        if row is not None:
            self.feed.append(("kv", "delete", *k, current, None, None))
            del self.kv[k]

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS))
    def update(self, i, key):
        k = (*SCOPES[i], key)
        row = self.live(k)
        new = self.scope(i).update(key, lambda v: [v], default="absent")
        assert new == [row[0] if row else "absent"]
        self.met(k)
        self._wrote(k, new, self.scope(i).get_versioned(key).version, row[2] if row else None,
                    span=(0, 1))

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS), items=st.lists(VALUES, max_size=3), ttl=TTLS)
    def append(self, i, key, items, ttl):
        k = (*SCOPES[i], key)
        old = self.live(k)
        if old is not None and not isinstance(old[0], list):
            with pytest.raises(NotAList):
                self.scope(i).append(key, items, ttl=ttl)
            return
        r = self.scope(i).append(key, items, ttl=ttl)
        self.met(k)
        value = (old[0] if old else []) + items
        assert r.length == len(value)
        expires = (old[2] if old else None) if ttl is None else self.clock.now + ttl
        if old is not None and not items:
            assert r.version == old[1]
            if ttl is not None:
                old[2] = expires
                self.feed.append(("kv", "touch", *k, old[1], None, None))
            return
        self._wrote(k, value, r.version, expires, "append", (len(old[0]) if old else 0, len(items)))

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS), n=st.integers(0, 3))
    def pop(self, i, key, n):
        k = (*SCOPES[i], key)
        row = self.live(k)
        if row is not None and not isinstance(row[0], list):
            with pytest.raises(NotAList):
                self.scope(i).pop(key, n)
            return
        got = self.scope(i).pop(key, n)
        self.met(k)
        if row is None:
            assert got == []
            return
        taken = row[0][len(row[0]) - min(n, len(row[0])):]
        assert got == taken
        if taken:
            self._wrote(k, row[0][:len(row[0]) - len(taken)], row[1] + 1, row[2], "pop",
                        (len(row[0]) - len(taken), len(taken)))

    @rule(i=st.integers(0, 3), key=st.sampled_from(KEYS), ttl=TTLS)
    def touch(self, i, key, ttl):
        k = (*SCOPES[i], key)
        row = self.live(k)
        assert self.scope(i).touch(key, ttl) == (row is not None)
        if row is not None:
            row[2] = None if ttl is None else self.clock.now + ttl
            self.feed.append(("kv", "touch", *k, row[1], None, None))

    @rule(dt=st.sampled_from([0.5, 2.0, 6.0]))
    def tick(self, dt):
        self.clock.now += dt

    @rule(writes=st.lists(st.tuples(st.integers(0, 3), st.sampled_from(KEYS), st.integers(0, 9)),
                          min_size=1, max_size=4), abort=st.booleans())
    def transaction(self, writes, abort):
        model = {k: list(v) for k, v in self.kv.items()}
        feed, seen = list(self.feed), dict(self.seen)
        try:
            with self.db.transaction():
                for i, key, v in writes:
                    k = (*SCOPES[i], key)
                    version = self.scope(i).put(key, v)
                    self.met(k)
                    self._wrote(k, v, version, None)
                if abort:
                    raise RuntimeError("abort")
        except RuntimeError:
            self.kv, self.feed, self.seen = model, feed, seen  # nothing of it happened

    @rule(n=st.integers(1, 3), resend=st.booleans())
    def run_write(self, n, resend):
        start = max(0, len(self.run) - 1) if resend and self.run else len(self.run)
        entries = [{"seq": s, "v": s * 2} for s in range(start, len(self.run) + n)]
        self.db.runs.write("run", entries, {"len": len(self.run) + n})
        self.feed.append(("run", "write", None, "run", None, None, len(self.run), n))
        self.run = self.run[:start] + entries if start < len(self.run) else self.run + entries

    @rule(before=st.integers(0, 12))
    def trim(self, before):
        removed = self.db.runs.trim("run", before=before)
        new_first = min(max(before, self.first), len(self.run))
        assert removed == new_first - self.first
        if removed:
            self.feed.append(("run", "trim", None, "run", None, None, new_first, removed))
        self.first = new_first

    @rule()
    def turn(self):
        if self.active is None:
            self.active = self.db.sessions.start_turn(self.sid, ALICE)
            self.feed.append(("session", "running", None, self.sid, self.active.id, None, None, None))
        else:
            with pytest.raises(SessionBusy):
                self.db.sessions.start_turn(self.sid, ALICE)
            self.active.finish()
            self.feed.append(("session", "finished", None, self.sid, self.active.id, None, None, None))
            self.active = None
            self.finished += 1

    @rule()
    def reopen(self):
        self.db.close()
        self.db = self._open()
        if self.active is not None:
            self.active = self.db.sessions.get_turn(self.active.id, ALICE)

    @invariant()
    def matches(self):
        if not hasattr(self, "db"):
            return
        for kind, sid in SCOPES:
            s = self.db.scope(kind, sid)
            want = sorted(k for (kk, ss, k) in self.kv if (kk, ss) == (kind, sid) and self.live((kk, ss, k)))
            assert s.list() == want
            for key in KEYS:
                row = self.live((kind, sid, key))
                assert tuple(s.get_versioned(key)) == ((row[0], row[1]) if row else (None, 0))
        rec = self.db.runs.read("run")
        assert rec.entries == self.run[self.first:]
        turns = self.db.sessions.turns(self.sid, ALICE)
        assert sum(t.status == "finished" for t in turns) == self.finished
        assert sum(t.status == "running" for t in turns) == (self.active is not None)
        got = [(c.topic, c.op, c.kind, c.scope_id, c.key, c.version, c.start, c.count)
               for c in self.db.changes(0, limit=10_000)]
        assert got == self.feed
        assert self.db.last_change() == len(self.feed)

    def teardown(self):
        if hasattr(self, "db"):
            _kv.time = self._real
            assert self.db.check() == []
            self.db.close()


Store.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
test_store_model = Store.TestCase
