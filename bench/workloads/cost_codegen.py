"""The cost bench's hostile Python (bench/cost.rs, run as another user):
every loop compiles a function never seen before (a new code object with
a new name, file name and line numbers) and calls it, so that every sample
of it names code a profiler has not met yet. Sleeps 1 ms between loops
(off-CPU stacks through the new code as well).

    python3 cost_codegen.py

Prints `ready <pid>`; runs until killed.
"""

import os
import time


def make(n):
    source = (
        f"def gen_{n}_{os.getpid()}(k):\n"
        + "".join(f"    k = (k * {n + i} + {i}) & 0xFFFF\n" for i in range(n % 40 + 1))
        + f"    time.sleep(0.001)\n    return k\n"
    )
    scope = {"time": time}
    exec(compile(source, f"<generated {n}>", "exec"), scope)
    return scope[f"gen_{n}_{os.getpid()}"]


def main():
    print(f"ready {os.getpid()}", flush=True)
    k, n = 1, 0
    while True:
        k = make(n)(k)
        n += 1


if __name__ == "__main__":
    main()
