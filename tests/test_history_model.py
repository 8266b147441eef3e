"""Value history against models (SPEC §17): hypothesis draws puts, appends, pops,
deletes, touches, clears, restores and forks across scopes, and every change's seq is
then read back as of that change and compared with what a plain Python model held
right after it; two processes write at once, and the store's past is checked against a
replay of its own feed."""

from __future__ import annotations

import copy
import json
import multiprocessing as mp
import os
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import agentstate

from .conftest import target

SCOPES = [("app", "a"), ("user", "u")]
KEYS = ["k1", "k2", "l1"]
Model = dict[tuple[str, str], dict[str, object]]

ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(SCOPES), st.sampled_from(KEYS),
              st.one_of(st.integers(-5, 5), st.text(max_size=3),
                        st.lists(st.integers(0, 9), max_size=3))),
    st.tuples(st.just("append"), st.sampled_from(SCOPES), st.sampled_from(KEYS),
              st.lists(st.integers(0, 99), max_size=3)),
    st.tuples(st.just("pop"), st.sampled_from(SCOPES), st.sampled_from(KEYS), st.integers(1, 3)),
    st.tuples(st.just("delete"), st.sampled_from(SCOPES), st.sampled_from(KEYS), st.none()),
    st.tuples(st.just("touch"), st.sampled_from(SCOPES), st.sampled_from(KEYS), st.none()),
    st.tuples(st.just("clear"), st.sampled_from(SCOPES), st.none(), st.none()),
    st.tuples(st.just("restore"), st.sampled_from(SCOPES), st.none(), st.integers(0, 40)),
    st.tuples(st.just("fork"), st.just(("session", "")), st.none(), st.integers(0, 40)),
), min_size=1, max_size=30)


def _apply(db, model: Model, snapshots: dict[int, Model], forks: list[str],
           op: str, scope: tuple[str, str], key: str | None, arg: object) -> None:
    """One op on the store and on the model (what the store must do, in plain Python)."""
    if op == "fork":  # of the newest session (the first: a new one), as of a change
        p = agentstate.Principal("p")
        if not forks:
            forks.append(db.sessions.create(p).id)
            db.sessions.state(forks[0], p).append("l1", [0])
            model[("session", forks[0])] = {"l1": [0]}
        else:
            seqs = sorted(s for s in snapshots if ("session", forks[-1]) in snapshots[s])
            at = seqs[arg % len(seqs)]  # type: ignore[operator]
            f = db.sessions.fork(forks[-1], p, at=at)
            forked = copy.deepcopy(snapshots[at][("session", forks[-1])])
            db.sessions.state(f.id, p).append("l1", ["f"])  # and it goes its own way
            forked.setdefault("l1", []).append("f")  # type: ignore[union-attr]
            model[("session", f.id)] = forked
            forks.append(f.id)
        snapshots[db.last_change()] = copy.deepcopy(model)
        return
    kv = db.scope(*scope)
    mine = model.setdefault(scope, {})
    if op == "put":
        kv.put(key, arg)
        mine[key] = copy.deepcopy(arg)
    elif op == "append":
        if key in mine and not isinstance(mine[key], list):
            return  # NotAList: nothing written
        kv.append(key, arg)
        mine.setdefault(key, [])
        mine[key].extend(arg)  # type: ignore[union-attr]
    elif op == "pop":
        if key in mine and not isinstance(mine[key], list):
            return
        kv.pop(key, arg)
        if key in mine:
            del mine[key][max(0, len(mine[key]) - arg):]  # type: ignore[arg-type, union-attr]
    elif op == "delete":
        kv.delete(key)
        mine.pop(key, None)
    elif op == "touch":
        kv.touch(key, 3600)
    elif op == "clear":
        kv.clear()
        mine.clear()
    elif op == "restore":
        seqs = sorted(snapshots)
        if not seqs:
            return
        at = seqs[arg % len(seqs)]  # type: ignore[operator]
        kv.restore(at=at)
        model[scope] = copy.deepcopy(snapshots[at].get(scope, {}))
    snapshots[db.last_change()] = copy.deepcopy(model)


def _check(db, snapshots: dict[int, Model]) -> None:
    for seq, snap in snapshots.items():
        with db.as_of(seq) as past:
            for (kind, sid), want in snap.items():
                got = {k: v.value for k, v in past.scope(kind, sid).items()}
                assert got == {k: v for k, v in want.items()}, (seq, kind, sid)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture],
          deadline=None)
@given(steps=ops)
def test_every_change_reads_as_the_model_held_it(any_db, steps):
    """After random writes (restores and forks among them), the store as of every change
    is what the model held right after it; a fork's lists stay its own."""
    db = any_db
    snapshots: dict[int, Model] = {}
    model: Model = {}
    forks: list[str] = []
    for op, scope, key, arg in steps:
        try:
            _apply(db, model, snapshots, forks, op, scope, key, arg)
        except agentstate.NotAList:
            snapshots[db.last_change()] = copy.deepcopy(model)
    _check(db, snapshots)
    for (kind, sid) in {k for snap in snapshots.values() for k in snap}:
        db.scope(kind, sid).clear()  # the next example starts from empty scopes


# -- two processes, checked against a replay of the feed --------------------------------------

def _writer(where: str, name: str, seed: int, n: int, log_path: str) -> None:
    """Random writes to shared keys; every acknowledged one logged with what it wrote and
    the version it made (the replay's facts)."""
    rng = random.Random(seed)
    with agentstate.open(where) as db, open(log_path, "w") as log:
        for i in range(n):
            scope = db.scope(*rng.choice(SCOPES))
            key = rng.choice(KEYS)
            op = rng.choice(["put", "append", "append", "pop", "delete"])
            try:
                if op == "put":
                    value = f"{name}{i}"
                    log.write(json.dumps([scope.kind, scope.id, key, "put",
                                          scope.put(key, value), value]) + "\n")
                elif op == "append":
                    items = [f"{name}{i}"]
                    log.write(json.dumps([scope.kind, scope.id, key, "append",
                                          scope.append(key, items).version, items]) + "\n")
                elif op == "pop":
                    scope.pop(key, rng.randint(1, 2))
                else:
                    scope.delete(key)
            except agentstate.NotAList:
                pass


def test_two_processes_and_a_replay_of_the_feed_agree_on_every_change(any_db, tmp_path):
    """Two processes write the same keys at once; replaying the feed (each put's and
    append's value from the writers' logs, pops' counts and deletes from the feed itself)
    gives every key's state after every change, and the store's past agrees with it."""
    db = any_db
    ctx = mp.get_context("spawn")
    logs = [str(tmp_path / f"w{i}.log") for i in range(2)]
    start = db.last_change()
    procs = [ctx.Process(target=_writer, args=(target(db), f"p{i}-", i + random.randrange(10**6),
                                               60, logs[i])) for i in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(300)
    assert [p.exitcode for p in procs] == [0, 0]
    written: dict[tuple[str, str, str, int], tuple[str, object]] = {}
    for path in logs:
        with open(path) as f:
            for line in f:
                kind, sid, key, op, version, payload = json.loads(line)
                written[(kind, sid, key, version)] = (op, payload)
    state: dict[tuple[str, str, str], object] = {}
    for ch in db.changes(start, limit=10_000):
        k = (ch.kind, ch.scope_id, ch.key)
        if ch.op in ("delete", "expire"):
            state.pop(k, None)
        elif ch.op == "put":
            state[k] = written[(*k, ch.version)][1]
        elif ch.op == "append":
            state[k] = [*state.get(k, []), *written[(*k, ch.version)][1]]  # type: ignore[misc]
        elif ch.op == "pop":
            state[k] = state[k][:ch.start]  # type: ignore[index]
        with db.as_of(ch.seq) as past:
            for kind, sid in SCOPES:
                got = {key: v.value for key, v in past.scope(kind, sid).items()}
                want = {key: v for (k2, s2, key), v in state.items() if (k2, s2) == (kind, sid)}
                assert got == want, (ch.seq, kind, sid)
    assert os.path.getsize(logs[0]) > 0 and os.path.getsize(logs[1]) > 0
