"""A single-threaded tight loop under a deep Python stack, reporting its own
speed: the overhead benchmark (bench/python.rs) compares its rate alone and
with profilers attached, so every sample walks DEPTH frames.

    python3 tight.py [--depth 30] [--out PATH] [--seconds N] [--block]

Every second it rewrites PATH (default tight.json; atomically) with
{"pid", "python", "depth", "iterations", "elapsed_ns", "rate"}: loop
iterations and wall ns since the loop started, and the last second's
iterations/s. Prints `ready <pid>` once the loop runs.

--block: the loop sleeps instead, `time.sleep(0.001)` an iteration, under
the same DEPTH frames: the thread blocks about 1,000 times a second, each
wakeup's off-CPU stack a DEPTH-deep Python one (the BPF cost benchmark's
off-CPU side).
"""

import argparse
import json
import os
import sys
import time


def report(path, depth, iterations, elapsed_ns, rate):
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(
            {
                "pid": os.getpid(),
                "python": sys.version.split()[0],
                "depth": depth,
                "iterations": iterations,
                "elapsed_ns": elapsed_ns,
                "rate": rate,
            },
            f,
        )
    os.replace(tmp, path)


def bottom(args, depth):
    print(f"ready {os.getpid()}", flush=True)
    clock = time.monotonic_ns
    start = last = clock()
    end = start + int(args.seconds * 1e9) if args.seconds > 0 else None
    total = done = 0
    batch = 1 if args.block else 10000
    while True:
        if args.block:
            time.sleep(0.001)
        else:
            # Batches of plain bytecode between clock reads: the clock
            # costs nothing next to 10,000 iterations.
            x = 0
            for i in range(10000):
                x = (x * 31 + i) & 0xFFFF
        total += batch
        t = clock()
        if t - last >= 1_000_000_000:
            rate = (total - done) * 1e9 / (t - last)
            report(args.out, depth, total, t - start, rate)
            last, done = t, total
            if end is not None and t >= end:
                return


def level(n, args, depth):
    if n > 1:
        level(n - 1, args, depth)
    else:
        bottom(args, depth)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--depth", type=int, default=30, help="frames of level() above the loop")
    p.add_argument("--out", default="tight.json")
    p.add_argument("--seconds", type=float, default=0.0)
    p.add_argument("--block", action="store_true", help="sleep 1 ms an iteration instead of computing")
    args = p.parse_args()
    level(args.depth, args, args.depth)


if __name__ == "__main__":
    main()
