"""The cost bench's CPython service (bench/cost.rs): four threads, as a
small web service has. The main thread accepts "requests" (a timer) and
hands them to two handler threads over a queue; each request is ~1 ms of
Python. A background thread (`refresh`) recomputes a table in pure
Python for 50 ms out of every 100 ms, holding the GIL meanwhile, so the
handlers wait for it (a profiler shows them under `[GIL]`).

    python3 cost_service.py

Prints `ready <pid>` once every thread runs; runs until killed.
"""

import os
import queue
import threading
import time

REQUESTS_PER_S = 100


def handle(n):
    total = 0
    for i in range(2000):
        total = (total * 31 + i + n) & 0xFFFFFFFF
    return total


def handler(requests, started):
    started.release()
    while True:
        handle(requests.get())


def rebuild_table(seed):
    table = {}
    end = time.monotonic() + 0.05
    while time.monotonic() < end:
        for i in range(1000):
            seed = (seed * 1103515245 + 12345) & 0x7FFFFFFF
            table[i] = seed
    return seed


def refresh(started):
    started.release()
    seed = 1
    while True:
        seed = rebuild_table(seed)
        time.sleep(0.05)


def main():
    started = threading.Semaphore(0)
    requests = queue.Queue()
    for n in range(2):
        threading.Thread(
            target=handler, args=(requests, started), name=f"handler-{n}", daemon=True
        ).start()
    threading.Thread(target=refresh, args=(started,), name="refresh", daemon=True).start()
    for _ in range(3):
        started.acquire()
    print(f"ready {os.getpid()}", flush=True)
    n = 0
    while True:
        time.sleep(1 / REQUESTS_PER_S)
        requests.put(n)
        n += 1


if __name__ == "__main__":
    main()
