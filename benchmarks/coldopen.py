"""Child process of the cold-open workload (not a command for people).

``python -m benchmarks.coldopen SYSTEM PATH WHAT``: import the system (timed
separately), drop the database files from the page cache, then time opening
the store and its first read. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    sysname, path, what = sys.argv[1:4]
    t0 = time.perf_counter()
    from . import systems
    from .workloads import evict

    sysobj = systems.get(sysname)
    for m in sysobj.modules:
        __import__(m)
    t1 = time.perf_counter()
    files = [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]
    evicted = evict(files)
    t2 = time.perf_counter()
    h = sysobj.open(path, "full")
    got = h.cold_read(what)
    t3 = time.perf_counter()
    h.close()
    if got is None or got == []:
        raise SystemExit(f"cold read of {what} found nothing")
    print(json.dumps({"import_s": t1 - t0, "open_read_s": t3 - t2, "evicted": evicted}))


if __name__ == "__main__":
    main()
