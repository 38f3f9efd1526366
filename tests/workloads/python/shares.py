"""CPU workload whose per-function CPU shares are known because it measures
them itself: a profiler's shares are compared with this ground truth
(bench/python.rs), not with intended percentages.

    python3 shares.py [--truth PATH] [--seconds N]

The main thread burns CPU in pure Python in nested functions, a method,
a lambda and a generator, picking each round the task furthest below its
target share, so the shares hold on any CPython version. Every second it
rewrites PATH (default $SHARES_TRUTH, else shares.json; atomically) with
the CPU each function used since start, cumulative, in ns:
  {"pid", "python", "functions": {qualname: self_ns}, "inclusive":
   {qualname: ns of samples that would contain it}, "total_ns"}
"self" is the time the function was the innermost Python frame (C
builtins it calls count for it, as profilers attribute them).

Other threads only block, so they add no CPU: `blocked-worker` waits in
`wait_for_lock` for a lock main holds forever, and a two-thread pool
(`pool_0`, `pool_1`) sleeps in `pooled_nap`. Prints `ready <pid>` once
they all run. `late-worker` starts 3 s later and waits in `wait_for_lock`
too: a profiler has long found the interpreter by then, so the thread is
one it learns of only after it blocked.
"""

import argparse
import concurrent.futures
import json
import os
import sys
import threading
import time

now = time.thread_time_ns

# Inclusive CPU ns per qualname. Children are timed inside their caller,
# so a caller's self time is its inclusive time less its children's.
INCL = {}
CHILDREN = {
    "main": ["outer_a", "Worker.crunch", "consume", "<lambda>", "write_truth"],
    "outer_a": ["outer_a.<locals>.inner_a"],
    "outer_a.<locals>.inner_a": ["outer_a.<locals>.inner_a.<locals>.leaf_a"],
    "Worker.crunch": ["Worker.mix"],
    "consume": ["produce"],
}
# Targets of main's direct tasks (inclusive): outer_a 40 % (inner_a 30,
# leaf_a 6), crunch 25 % (mix 11), consume 20 % (produce 12), lambda 15 %.
TARGETS = {"outer_a": 0.40, "Worker.crunch": 0.25, "consume": 0.20, "<lambda>": 0.15}

# Every loop below has the same body, so iteration counts set the splits
# between a function and its callees.
CHUNK = 20000


def add(name, ns):
    INCL[name] = INCL.get(name, 0) + ns


def outer_a(n):
    def inner_a(n):
        def leaf_a(n):
            x = 0
            for i in range(n):
                x = (x * 31 + i) & 0xFFFF
            return x

        x = 0
        for i in range(n * 12):  # 24 points of CPU
            x = (x * 31 + i) & 0xFFFF
        t = now()
        x ^= leaf_a(n * 3)  # 6 points
        INCL["outer_a.<locals>.inner_a.<locals>.leaf_a"] += now() - t
        return x

    x = 0
    for i in range(n * 5):  # 10 points
        x = (x * 31 + i) & 0xFFFF
    t = now()
    x ^= inner_a(n)  # 30 points
    INCL["outer_a.<locals>.inner_a"] += now() - t
    return x


class Worker:
    def __init__(self):
        self.x = 0

    @staticmethod
    def mix(n):
        x = 0
        for i in range(n):
            x = (x * 31 + i) & 0xFFFF
        return x

    def crunch(self, n):
        x = self.x
        for i in range(n * 14):  # 14 of 25 points
            x = (x * 31 + i) & 0xFFFF
        t = now()
        self.x = x ^ self.mix(n * 11)  # 11 points
        INCL["Worker.mix"] += now() - t
        return self.x


def produce(items, n):
    # The generator's own CPU: runs between the consumer's next() calls.
    for k in range(items):
        x = k
        for i in range(n * 3):  # 12 points
            x = (x * 31 + i) & 0xFFFF
        yield x


def consume(n, items=20):
    it = produce(items, n)
    total = 0
    while True:
        t = now()
        v = next(it, None)
        INCL["produce"] += now() - t
        if v is None:
            return total
        x = v
        for i in range(n * 2):  # 8 points
            x = (x * 31 + i) & 0xFFFF
        total += x


# Recursion keeps the lambda's CPU in its own frames (it cannot loop;
# main's loop calling it is a few % of its time); 24 deep stays well under
# the 64 Python frames a profiler may keep.
spin = lambda d, x: spin(d - 1, (x * 31 + d) & 0xFFFF) if d else x  # noqa: E731


def write_truth(path, start):
    incl = dict(INCL)
    total = now() - start
    incl["main"] = total
    incl["<module>"] = total
    own = {}
    for name, ns in incl.items():
        if name == "<module>":
            continue
        own[name] = max(0, ns - sum(incl.get(c, 0) for c in CHILDREN.get(name, [])))
    doc = {
        "pid": os.getpid(),
        "python": sys.version.split()[0],
        "functions": own,
        "inclusive": incl,
        "total_ns": total,
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def wait_for_lock(lock, started):
    started.set()
    lock.acquire()  # main never releases it


def pooled_nap(started):
    started.wait()
    while True:
        time.sleep(3600)


def pool_task(both, started):
    both.wait()
    pooled_nap(started)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--truth", default=os.environ.get("SHARES_TRUTH", "shares.json"))
    p.add_argument("--seconds", type=float, default=0.0)
    args = p.parse_args()

    for name in CHILDREN["main"] + [c for k in CHILDREN for c in CHILDREN[k]]:
        INCL.setdefault(name, 0)

    lock = threading.Lock()
    lock.acquire()
    blocked_started = threading.Event()
    threading.Thread(
        target=wait_for_lock, args=(lock, blocked_started), name="blocked-worker", daemon=True
    ).start()
    # A barrier of both workers and main: each task keeps its worker, so
    # the pool starts two threads.
    both = threading.Barrier(3)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="pool")
    for _ in range(2):
        pool.submit(pool_task, both, blocked_started)
    both.wait()
    blocked_started.wait()
    print(f"ready {os.getpid()}", flush=True)

    worker = Worker()
    start = now()
    wall_end = time.monotonic() + args.seconds if args.seconds > 0 else None
    next_write = time.monotonic() + 1.0
    late_at = time.monotonic() + 3.0
    while True:
        # The task furthest below its target share runs next.
        # (A plain loop: a key= lambda would be a second `<lambda>`.)
        spent = 1
        for k in TARGETS:
            spent += INCL[k]
        name, lag = None, -2.0
        for k, share in TARGETS.items():
            if share - INCL[k] / spent > lag:
                name, lag = k, share - INCL[k] / spent
        # Called directly (no dispatch table of lambdas): only the task's
        # own frames sit between main and the work.
        t = now()
        if name == "outer_a":
            outer_a(CHUNK // 20)
        elif name == "Worker.crunch":
            worker.crunch(CHUNK // 25)
        elif name == "consume":
            consume(CHUNK // 100)
        else:
            for k in range(CHUNK // 25):
                spin(24, k)
        INCL[name] += now() - t
        if late_at is not None and time.monotonic() >= late_at:
            late_at = None
            threading.Thread(
                target=wait_for_lock,
                args=(lock, threading.Event()),
                name="late-worker",
                daemon=True,
            ).start()
        if time.monotonic() >= next_write:
            t = now()
            write_truth(args.truth, start)
            INCL["write_truth"] += now() - t
            next_write += 1.0
            if wall_end is not None and time.monotonic() >= wall_end:
                write_truth(args.truth, start)
                os._exit(0)  # the pool's and the blocked thread never end


if __name__ == "__main__":
    main()
