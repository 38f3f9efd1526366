"""Attacker: splices forged thread states into its own interpreter's
thread list, so that a profiler reading the list would give this one
process as many entries as the list holds.

    python3 forged_threads.py [COUNT]   (default 4096)

The main thread's PyThreadState is copied COUNT times (so each copy names
this interpreter), each with a thread id of its own, and linked after the
real one (`prev`, `next` at offsets 0 and 8 on CPython 3.10-3.13; the
thread id is found by its value, `threading.get_ident()`). Prints
`ready <pid>`, then sleeps: the forged states are never run, and the
process must be killed (its interpreter would free them at exit).
"""

import ctypes
import os
import sys
import threading
import time

COUNT = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
# Bytes of each copy: past every field a reader of the list looks at.
SPAN = 512


def word(addr):
    return ctypes.c_uint64.from_address(addr)


def main():
    get = ctypes.pythonapi.PyThreadState_Get
    get.restype = ctypes.c_void_p
    real = get()
    raw = ctypes.string_at(real, SPAN)
    words = [int.from_bytes(raw[i : i + 8], "little") for i in range(0, SPAN, 8)]
    id_at = 8 * words.index(threading.get_ident())
    after = words[1]
    forged = ctypes.create_string_buffer(SPAN * COUNT)
    base = ctypes.addressof(forged)
    for i in range(COUNT):
        at = base + i * SPAN
        ctypes.memmove(at, raw, SPAN)
        word(at).value = real if i == 0 else at - SPAN
        word(at + 8).value = at + SPAN if i < COUNT - 1 else after
        word(at + id_at).value = 0x7E0000000000 + i * 0x1000
    if after:
        word(after).value = base + (COUNT - 1) * SPAN
    word(real + 8).value = base
    print(f"ready {os.getpid()}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
