"""Ctrl-C storms for the group commit tests: ``python tests/interruptwriter.py DB SECONDS``.

16 threads put in a loop while the main thread puts too and treats Ctrl-C as
"cancel this call and go on"; a helper thread sends SIGINT to the process
every ~2 ms. Python runs signal handlers (KeyboardInterrupt) only in the main
thread, between any two steps of its code. Prints one JSON line: the keys
acknowledged, the worker threads that ever saw KeyboardInterrupt, and other
errors. Exits 2 if no write finished for 10 s (a hang).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import agentstate


def main(path: str, seconds: float) -> None:
    db = agentstate.open(path)
    kv = db.scope("agent", "a")
    acked: list[str] = []
    worker_interrupts: list[str] = []
    errors: list[str] = []
    progress = [0]
    stop = threading.Event()

    def worker(t: int) -> None:
        n = 0
        while not stop.is_set():
            k = f"w{t}-{n}"
            try:
                kv.put(k, n)
                acked.append(k)
                progress[0] += 1
            except KeyboardInterrupt:
                worker_interrupts.append(k)
            except Exception as e:  # noqa: BLE001 - reported, and the test fails on it
                errors.append(f"{k}: {e!r}")
            n += 1

    def sender() -> None:
        while not stop.is_set():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.002)

    def watchdog() -> None:
        last, since = -1, time.monotonic()
        while not stop.is_set():
            time.sleep(0.2)
            if progress[0] != last:
                last, since = progress[0], time.monotonic()
            elif time.monotonic() - since > 10:
                print(json.dumps({"hang": True, "acked": len(acked)}), flush=True)
                os._exit(2)

    armed = [False]

    def on_int(signum: int, frame: object) -> None:
        if armed[0]:  # Ctrl-C cancels the call under way only
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, on_int)
    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(16)]
    for t in threads + [threading.Thread(target=sender, daemon=True),
                        threading.Thread(target=watchdog, daemon=True)]:
        t.start()
    end, n, interrupted = time.monotonic() + seconds, 0, 0
    while time.monotonic() < end:
        try:
            armed[0] = True
            kv.put(f"m{n}", n)
            armed[0] = False
            acked.append(f"m{n}")
            progress[0] += 1
        except KeyboardInterrupt:
            armed[0] = False
            interrupted += 1
        except Exception as e:  # noqa: BLE001
            armed[0] = False
            errors.append(f"m{n}: {e!r}")
        n += 1
    armed[0] = False
    stop.set()
    for t in threads:
        t.join(30)
    print(json.dumps({"acked": acked, "worker_interrupts": worker_interrupts, "errors": errors,
                      "main_interrupted": interrupted, "alive": sum(t.is_alive() for t in threads)}),
          flush=True)
    os._exit(0)  # the sender may still be between two signals


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
