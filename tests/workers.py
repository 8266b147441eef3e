"""Functions run in child processes by the multi-process tests (importable for spawn)."""

from __future__ import annotations

import multiprocessing as mp

import agentstate


def race(target, args_for, n: int = 4) -> list:
    """Start n spawned processes on target(*args_for(w), start, results) together;
    return what each put on results. Every process must exit 0."""
    ctx = mp.get_context("spawn")
    start, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_for(w), start, results)) for w in range(n)]
    for p in procs:
        p.start()
    start.set()
    out = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    return out


def increment(path: str, n: int, start, results) -> None:
    start.wait()
    errors = 0
    with agentstate.open(path) as db:
        s = db.scope("agent", "shared")
        for _ in range(n):
            try:
                s.update("counter", lambda v: v + 1, default=0)
            except Exception:
                errors += 1
    results.put(errors)


def aincrement(path: str, tasks: int, n: int, start, results) -> None:
    """``tasks`` asyncio tasks each aupdate() the shared counter ``n`` times (half of them
    with an async function); puts (errors, how often the function ran)."""
    import asyncio

    start.wait()
    runs = [0]

    def plain(v):
        runs[0] += 1
        return v + 1

    async def awaited(v):
        await asyncio.sleep(0)
        return plain(v)

    async def main(s):
        async def one(fn):
            errors = 0
            for _ in range(n):
                try:
                    await s.aupdate("counter", fn, default=0)
                except Exception:
                    errors += 1
            return errors
        return sum(await asyncio.gather(*(one(awaited if t % 2 else plain) for t in range(tasks))))

    with agentstate.open(path) as db:
        errors = asyncio.run(main(db.scope("agent", "shared")))
    results.put((errors, runs[0]))


def append(path: str, who: int, n: int, start, results) -> None:
    start.wait()
    errors = 0
    with agentstate.open(path) as db:
        s = db.scope("session", "shared")
        for i in range(n):
            try:
                s.append("history", [{"who": who, "i": i}])
            except Exception:
                errors += 1
    results.put(errors)


def history_writer(path: str, who: int, n: int, start, results) -> None:
    """Append n entries to one shared run, racing the others for each next seq."""
    start.wait()
    won = gaps = other = 0
    with agentstate.open(path) as db:
        while won < n:
            tail = db.runs.tail("shared", 1)
            seq = tail[0]["seq"] + 1 if tail else 0
            try:
                db.runs.write("shared", [{"seq": seq, "who": who, "k": won}], {"last": who})
                won += 1
            except agentstate.HistoryGap:
                gaps += 1
            except Exception:
                other += 1
    results.put((who, won, other))


def turn_racer(path: str, session_id: str, rounds: int, barrier, results) -> None:
    """Race the other processes to start a turn, round after round."""
    alice = agentstate.Principal("alice")
    with agentstate.open(path) as db:
        for r in range(rounds):
            barrier.wait()
            turn = None
            try:
                turn = db.sessions.start_turn(session_id, alice)
                results.put((r, "won", turn.id))
            except agentstate.SessionBusy as e:
                results.put((r, "busy", e.turn_id))
            except Exception as e:  # reported to the test
                results.put((r, "error", repr(e)))
            barrier.wait()
            if turn is not None:
                turn.finish()
            barrier.wait()


def hold_turn_forever(path: str, session_id: str, ready) -> None:
    """Start a turn with a short lease and heartbeat until killed."""
    import time

    with agentstate.open(path) as db:
        turn = db.sessions.start_turn(session_id, agentstate.Principal("alice"), lease=4)
        ready.put(turn.id)
        while True:
            time.sleep(0.2)
            turn.heartbeat()


def busy_agent(path: str, seconds: float, started) -> None:
    """Keep writing keys, lists, run entries and turns while the shell reads."""
    import time

    alice = agentstate.Principal("alice")
    with agentstate.open(path) as db:
        s = db.scope("agent", "busy")
        sid = db.sessions.create(alice).id
        db.runs.write("run-bg", [], None, create=True)
        for k in ("k0", "k1"):  # keys the shell's queries can count on, however slow the start
            s.put(k, {"i": 0})
        started.set()
        t0, i = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            s.put(f"k{i % 50}", {"i": i})
            db.runs.write("run-bg", [{"seq": i, "type": "tick"}], {"i": i})
            with db.sessions.turn(sid, alice):
                pass
            i += 1


def mixed_worker(path: str, who: int, seconds: float, start, results) -> None:
    """A bit of everything on shared keys, lists, runs and sessions, for a bounded time."""
    import random
    import time

    rnd = random.Random(who)
    alice = agentstate.Principal("alice")
    done = {"inc": 0, "appended": [], "entries": [], "turns": 0, "busy_session": 0,
            "gaps": 0, "errors": [], "busy": []}
    with agentstate.open(path) as db:
        kv = db.scope("app", "soak")
        sid = kv.get("session_id")
        start.wait()
        t0 = time.monotonic()
        i = 0
        while time.monotonic() - t0 < seconds:
            i += 1
            op = rnd.randrange(5)
            began = time.monotonic()
            try:
                if op == 0:
                    kv.update("counter", lambda v: v + 1, default=0)
                    done["inc"] += 1
                elif op == 1:
                    kv.append("shared-list", [[who, i]])
                    done["appended"].append(i)
                elif op == 2:
                    tail = db.runs.tail("soak-run", 1)
                    seq = tail[0]["seq"] + 1 if tail else 0
                    try:
                        db.runs.write("soak-run", [{"seq": seq, "who": who, "i": i}], {"who": who})
                        done["entries"].append(i)
                    except agentstate.HistoryGap:
                        done["gaps"] += 1
                elif op == 3:
                    try:
                        with db.sessions.turn(sid, alice, lease=30):
                            kv.put(f"w{who}", i)
                        done["turns"] += 1
                    except agentstate.SessionBusy:
                        done["busy_session"] += 1
                else:
                    kv.put(f"k{rnd.randrange(20)}", {"who": who, "i": i})
                    kv.get(f"k{rnd.randrange(20)}")
                    kv.list("k")
            except agentstate.Busy:  # SPEC §1: after busy_timeout; the test checks the wait
                done["busy"].append((op, time.monotonic() - began))
            except Exception as e:  # any other error is a failure the test reports
                done["errors"].append(f"{type(e).__name__}: {e}")
    results.put((who, done))


def open_new(path: str, barrier, results) -> None:
    """Open (and so create) ``path`` at the same moment as the others, then write."""
    barrier.wait()
    try:
        with agentstate.open(path) as db:
            db.scope("app", "x").put("k", 1)
        results.put("ok")
    except Exception as e:  # noqa: BLE001 - reported to the test
        results.put(repr(e))


def first_admin(path: str, start, results, ready=None) -> None:
    """Ask for the store's first admin token at once with the others (as servers starting
    together on an empty store do); ``ready`` is told once the store is open."""
    with agentstate.open(path) as db:
        if ready is not None:
            ready.put("open")
        start.wait()
        results.put(db.tokens.create_first_admin())


def batch_writer(path: str, who: int, n: int, start, results) -> None:
    """n batches, each an append to two lists and a put of this writer's count, every
    fifth refused by its last write; reports the batches that were applied. (Writers whose batches lock
    rows in crossing orders deadlock on PostgreSQL, and each deadlock costs the server's
    deadlock_timeout, 1 s, before one of them is retried: too slow for the default run.)"""
    start.wait()
    done = 0
    with agentstate.open(path, busy_timeout=30) as db:
        for i in range(n):
            try:
                with db.batch() as b:
                    w = b.scope("session", "shared")
                    w.append("a", [{"who": who, "i": i}])
                    w.append("b", [{"who": who, "i": i}])
                    w.put(f"count{who}", done + 1)
                    if i % 5 == 4:  # refused: "taken" exists, so none of this batch lands
                        w.put("taken", who, if_version=0)
            except (agentstate.Busy, agentstate.VersionConflict):
                continue
            done += 1
    results.put((who, done))
