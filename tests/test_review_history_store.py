"""Review of value history (SPEC §17) as a careful database user: a past read gives the
value of that moment or refuses (CursorExpired), never another value. Both backends."""

from __future__ import annotations

import random

import pytest

from agentstate import CursorExpired


@pytest.fixture
def db(any_db):
    return any_db


def test_review_history_a_write_made_while_the_feed_was_off_is_never_read_as_the_past(db):
    """With the feed off (feed_retention 0) a write gets no seq and keeps no before-image.
    Once the feed is on again, the past right after the last change before it is unknown:
    as_of, history and diff of it must refuse (CursorExpired), not answer the value written
    while the feed was off as the value of that moment. The store answered "B" for a key
    that held "A" right after change ``then``; the history said change ``then`` put "B";
    and the diff since ``then`` left the key out although it changed."""
    s = db.scope("app", "x")
    s.put("k", "A")
    then = db.last_change()
    db.set_setting("feed_retention", 0)
    s.put("k", "B")  # no change row: the feed is off
    db.set_setting("feed_retention", 604800)
    s.put("other", 1)  # a change after `then`: `then` is no longer the head
    assert db.last_change() > then
    try:
        with db.as_of(then) as past:
            got = past.scope("app", "x").get("k")
    except CursorExpired:
        got = "refused"
    assert got in ("A", "refused"), f"as_of({then}) read k = {got!r}; it held 'A' then"
    for r in s.history("k"):
        assert r.seq != then or r.value == "A", (
            f"history says change {then} left k = {r.value!r}; it put 'A'")
    try:
        keys = {d.key for d in db.diff(then)}
    except CursorExpired:
        keys = {"k"}
    assert "k" in keys, "diff since a change leaves out a key that changed after it"


def _pair_writer(where: str, seconds: float, seed: int, start, results) -> None:
    """Writes the keys a and b of app:pair together (one batch: both or neither), the same
    value in both, or deletes both together, until ``seconds`` pass."""
    import random
    import time

    import agentstate

    rng = random.Random(seed)
    done = 0
    start.wait()
    with agentstate.open(where) as db:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with db.batch() as b:
                s = b.scope("app", "pair")
                if rng.random() < 0.2:
                    s.delete("a")
                    s.delete("b")
                else:
                    v = f"{seed}-{done}"
                    s.put("a", v)
                    s.put("b", v)
            done += 1
    results.put(done)


def test_review_history_a_restore_racing_writers_leaves_no_half_state(db):
    """Writers in other processes keep a == b (each batch writes both, or deletes both);
    restores of the scope to a moment where a == b run meanwhile. Each is one transaction
    (SPEC §17), so the scope ends with a == b: a restore that decided from a read taken
    before a writer's commit and wrote after it would leave one key of the writer's and
    one of the past."""
    import multiprocessing as mp
    import time

    from .conftest import target

    s = db.scope("app", "pair")
    with db.batch() as b:
        b.scope("app", "pair").put("a", "then")
        b.scope("app", "pair").put("b", "then")
    then = db.last_change()
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_pair_writer, args=(target(db), 4.0, i, start, results))
             for i in range(2)]
    for p in procs:
        p.start()
    start.set()
    restores = 0
    deadline = time.monotonic() + 60
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        s.restore(then)
        restores += 1
    counts = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0] and min(counts) > 0 and restores > 0
    final = s.get_many(["a", "b"])
    assert final["a"] == final["b"], final
    seqs, cursor = [], then
    while page := db.changes(cursor, limit=1000, kind="app", scope_id="pair", key="b"):
        seqs += [ch.seq for ch in page]
        cursor = page[-1].seq
    # a random 300 of the transactions that wrote b, and the last (an as_of each: all of
    # thousands took 30 s on PostgreSQL)
    chosen = sorted(set(random.sample(seqs, min(300, len(seqs)))) | {seqs[-1]})
    checked = 0
    for seq in chosen:
        with db.as_of(seq) as past:  # right after that transaction's write of b
            now = past.scope("app", "pair").get_many(["a", "b"])
        assert now["a"] == now["b"], (seq, now)
        checked += 1
    assert checked > 0



def _expired_since(db) -> int:
    """A key app:exp t live right after the change returned, expired since, and met by no
    write (a read does not record its expiry; no write comes after it expired, so the
    housekeeping of writes cannot expire it for good): no change of it after that change."""
    import time

    s = db.scope("app", "exp")
    s.put("t", "live", ttl=3)
    then = db.last_change()
    db.scope("app", "other").put("x", 1)  # a later change, while t is live: a span to diff
    with db.as_of(then) as past:
        assert past.scope("app", "exp").get("t") == "live"  # the moment gone back to
    deadline = time.monotonic() + 30
    while s.get_versioned("t").version and time.monotonic() < deadline:
        time.sleep(0.2)
    assert s.get("t") is None
    return then


def test_review_history_a_key_that_expired_since_is_in_the_diff_and_restored(db):
    """Two reviews of one case (the key's expiry takes seconds: one wait serves both).
    diff(then) lists every key whose value differs between the two moments: a key live
    then and expired since (no 'expire' change recorded yet) is live before and absent
    after. restore(then) puts "every key of the scope back to its value at seq" (a restored
    key does not expire). Both looked only at the keys with a change after ``then``: the
    diff left the key out, the restore answered 0 and the key stayed absent."""
    then = _expired_since(db)
    assert [(d.key, d.before.value, d.after.value) for d in
            db.diff(then, kind="app", scope_id="exp")] == [("t", "live", None)]
    s = db.scope("app", "exp")
    assert s.restore(then) == 1
    assert s.get("t") == "live" and s.expires_at("t") is None
