"""Four CPU-bound threads contending for the GIL: at any time one runs
Python and three wait for the GIL (a profiler shows them under `[GIL]`).

    python3 gil.py [--seconds N]

Threads are named spin-0 .. spin-3 and loop in `spin`; main only waits.
Prints `ready <pid>` once all four run.
"""

import argparse
import os
import threading
import time


def spin(started):
    started.release()
    x = 0
    while True:
        for i in range(10000):
            x = (x * 31 + i) & 0xFFFF


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=0.0)
    args = p.parse_args()
    started = threading.Semaphore(0)
    for n in range(4):
        threading.Thread(target=spin, args=(started,), name=f"spin-{n}", daemon=True).start()
    for _ in range(4):
        started.acquire()
    print(f"ready {os.getpid()}", flush=True)
    if args.seconds > 0:
        time.sleep(args.seconds)
    else:
        threading.Event().wait()


if __name__ == "__main__":
    main()
