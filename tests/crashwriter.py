"""A writer for the crash tests: a random mix of acknowledged operations.

Run as ``python tests/crashwriter.py DB LOG TRIAL SEED``. Each operation is
written to LOG (an O_APPEND file, one os.write per line, so SIGKILL cannot
lose or tear a line that was written) only after the call returned.
"""

from __future__ import annotations

import os
import random
import sys

import agentstate

ALICE = agentstate.Principal("alice")


def main(path: str, log_path: str, trial: int, seed: int) -> None:
    rnd = random.Random(seed)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def ack(line: str) -> None:
        os.write(log, (line + "\n").encode())

    db = agentstate.open(path)
    kv, agent = db.scope("session", "crash"), db.scope("agent", "crash")
    if db.runs.read("history") is None:
        try:
            db.runs.write("history", [], None, create=True)
        except agentstate.RunExists:
            pass
    sid = kv.get("session_id")
    if sid is None:
        sid = db.sessions.create(ALICE).id
        kv.put("session_id", sid)
    ack(f"start {trial}")
    i = 0
    while True:
        i += 1
        op = rnd.randrange(9)
        tag = f"{trial}-{i}"
        if op == 0:
            kv.put(f"p{tag}", {"tag": tag, "pad": "x" * rnd.randrange(0, 3000)})
            ack(f"put {tag}")
        elif op == 1:
            n = agent.update("counter", lambda v: v + 1, default=0)
            ack(f"inc {n}")
        elif op == 2:
            key = f"list{trial % 3}"
            if kv.length(key) > 2000:
                kv.delete(key)
                ack(f"cleared {key}")
            kv.append(key, [f"{tag}:a", f"{tag}:b"])
            ack(f"append {key} {tag}")
        elif op == 3:
            tail = db.runs.tail("history", 1)
            seq = tail[0]["seq"] + 1 if tail else 0
            db.runs.write("history", [{"seq": seq, "tag": tag}], {"last": seq})
            ack(f"entry {seq} {tag}")
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
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
