"""A writer for the crash tests: a random mix of acknowledged operations.

Run as ``python tests/crashwriter.py DB LOG TRIAL SEED [THREADS]``. Each
operation is written to LOG (an O_APPEND file, one os.write per line, so
SIGKILL cannot lose or tear a line that was written) only after the call
returned. With THREADS > 1 that many threads write at once (their plain
writes share group commits); each has its own lists and history run, so
its acknowledgements can be checked in its own order. A thread that fails
ends the process with status 3 (the test tells that from its SIGKILL).
"""

from __future__ import annotations

import os
import random
import sys
import threading
import traceback

import agentstate

ALICE = agentstate.Principal("alice")


def main(path: str, log_path: str, trial: int, seed: int, threads: int = 1) -> None:
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def ack(line: str) -> None:
        os.write(log, (line + "\n").encode())

    db = agentstate.open(path)
    kv = db.scope("session", "crash")
    sid = kv.get("session_id")
    if sid is None:
        sid = db.sessions.create(ALICE).id
        kv.put("session_id", sid)

    def run(t: int) -> None:
        try:
            write(db, ack, trial, seed + t, sid, t)
        except BaseException:
            traceback.print_exc()
            os._exit(3)

    ts = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(threads)]
    for t in ts:
        t.start()
    ack(f"start {trial}")
    for t in ts:
        t.join()


def write(db: agentstate.Database, ack, trial: int, seed: int, sid: str, t: int) -> None:
    """One thread's writes, forever: thread t has its own lists and history run."""
    rnd = random.Random(seed)
    kv, agent = db.scope("session", "crash"), db.scope("agent", "crash")
    history = "history" if t == 0 else f"history-t{t}"
    if db.runs.read(history) is None:
        try:
            db.runs.write(history, [], None, create=True)
        except agentstate.RunExists:
            pass
    i = 0
    while True:
        i += 1
        op = rnd.randrange(9)
        tag = f"{trial}-{t}-{i}"
        if op == 0:
            kv.put(f"p{tag}", {"tag": tag, "pad": "x" * rnd.randrange(0, 3000)})
            ack(f"put {tag}")
        elif op == 1:
            n = agent.update("counter", lambda v: v + 1, default=0)
            ack(f"inc {n}")
        elif op == 2:
            key = f"list{trial % 3}" if t == 0 else f"list{trial % 3}-t{t}"
            if kv.length(key) > 2000:
                kv.delete(key)
                ack(f"cleared {key}")
            kv.append(key, [f"{tag}:a", f"{tag}:b"])
            ack(f"append {key} {tag}")
        elif op == 3:
            tail = db.runs.tail(history, 1)
            seq = tail[0]["seq"] + 1 if tail else 0
            db.runs.write(history, [{"seq": seq, "tag": tag}], {"last": seq})
            ack(f"entry {history} {seq} {tag}")
        elif op == 4:
            with db.transaction():
                kv.put(f"ta{tag}", tag)
                agent.append(f"tb{tag}", [tag, tag])
                db.scope("user", "crash").update("txns", lambda v: v + 1, default=0)
            ack(f"txn {tag}")
        elif op == 5:
            db.runs.write(f"c{tag}", [{"seq": 0}, {"seq": 1}, {"seq": 2}], {"tag": tag}, create=True)
            ack(f"create {tag}")
        elif op == 7:
            ttl = rnd.choice([0.05, 3600])
            kv.put(f"e{tag}", tag, ttl=ttl)
            ack(f"ttlput {tag} {ttl}")
        else:
            try:
                turn = db.sessions.start_turn(sid, ALICE, lease=0.5)
            except agentstate.SessionBusy:
                continue  # a turn of a killed writer still holds its lease
            turn.finish({"tag": tag})
            ack(f"turn {turn.id}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
         int(sys.argv[5]) if len(sys.argv) > 5 else 1)
