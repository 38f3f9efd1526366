"""A service whose request threads wait for the GIL held by a background
loop: the `/explain` acceptance test's first incident.

    python3 gil_holder.py [--requests N]

`background-loop` runs `crunch_forever`, a pure-Python loop that holds
the GIL but when the interpreter makes it let go; N request threads
(`request-0` ...) each sleep 2 ms (a stand-in for I/O, GIL released),
then need the GIL for a small `handle_request`. Prints `ready <pid>`,
then one line `tids background=T request=T1,T2,...` (native thread ids).
"""

import argparse
import os
import threading
import time


def crunch_forever(started):
    started.release()
    x = 0
    while True:
        x = (x * 31 + 7) & 0xFFFF
        x = (x ^ (x >> 3)) + 1


def handle_request(n):
    total = 0
    for i in range(200):
        total += i * n
    return total


def serve_requests(started):
    started.release()
    n = 0
    while True:
        time.sleep(0.002)
        n += 1
        handle_request(n)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=6)
    args = p.parse_args()
    started = threading.Semaphore(0)
    background = threading.Thread(
        target=crunch_forever, args=(started,), name="background-loop", daemon=True
    )
    background.start()
    requests = [
        threading.Thread(target=serve_requests, args=(started,), name=f"request-{i}", daemon=True)
        for i in range(args.requests)
    ]
    for t in requests:
        t.start()
    for _ in range(args.requests + 1):
        started.acquire()
    print(f"ready {os.getpid()}", flush=True)
    tids = ",".join(str(t.native_id) for t in requests)
    print(f"tids background={background.native_id} request={tids}", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
