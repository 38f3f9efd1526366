"""A traced service for the request-context tests (#43): the real ddtrace
tracer, run under `ddtrace-run` with DD_TRACE_OTEL_CTX_ENABLED=true, so
that every request's span is published in the OpenTelemetry thread context
(`otel_thread_ctx_v1`) that wallscope reads.

    ddtrace-run python3 spans_service.py [--workers 4] [--max-seconds 600]

A pool of `--workers` threads serves requests a driver thread keeps
coming, alternating two endpoints:
- `/lock` waits in `wait_for_lock` on a threading.Lock a releaser thread
  holds for 80-150 ms;
- `/socket` reads in `read_from_socket` from a local server that answers
  after 80-150 ms.
Each request runs in `tracer.trace("request", resource=route)` with the tag
`http_route`. Two `idle` threads do periodic work with no span active.

Prints `idle <native_tid>` per idle thread, `ready <pid>`, then one line per
finished span, with ddtrace's own duration and the W3C hex ids (as the
thread context record holds them: big-endian bytes of the ids):
    span <trace_hex32> <span_hex16> <native_tid> <route> <duration_ns>
"""

import argparse
import heapq
import os
import random
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from ddtrace.trace import tracer

HOLD_MS = (80, 150)
ROUTES = ("/lock", "/socket")

out_lock = threading.Lock()


def say(line):
    with out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Releaser:
    """Releases each lock handed to it when its hold time is over: the
    holder a `/lock` request waits on."""

    def __init__(self):
        self.due = []
        self.cond = threading.Condition()
        threading.Thread(target=self.run, name="releaser", daemon=True).start()

    def hold(self, lock, seconds):
        with self.cond:
            heapq.heappush(self.due, (time.monotonic() + seconds, id(lock), lock))
            self.cond.notify()

    def run(self):
        with self.cond:
            while True:
                while not self.due:
                    self.cond.wait()
                at, _, lock = self.due[0]
                now = time.monotonic()
                if now < at:
                    self.cond.wait(at - now)
                    continue
                heapq.heappop(self.due)
                lock.release()


def serve_slowly(server, rng_seed):
    """The slow downstream: answers each one-byte request after 80-150 ms,
    one thread per connection."""
    rng = random.Random(rng_seed)

    def answer(conn, delay_ms):
        with conn:
            if conn.recv(1):
                time.sleep(delay_ms / 1000)
                conn.sendall(b"x")

    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(
            target=answer, args=(conn, rng.uniform(*HOLD_MS)), name="downstream", daemon=True
        ).start()


def wait_for_lock(releaser, hold_ms):
    lock = threading.Lock()
    lock.acquire()
    releaser.hold(lock, hold_ms / 1000)
    # Blocks (a futex wait) until the releaser lets go.
    lock.acquire()


def read_from_socket(port):
    with socket.create_connection(("127.0.0.1", port)) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"?")
        # Blocks (a socket read) until the downstream answers.
        return conn.recv(1)


def handle(route, releaser, port, hold_ms):
    with tracer.trace("request", resource=route) as span:
        span.set_tag("http_route", route)
        if route == "/lock":
            wait_for_lock(releaser, hold_ms)
        else:
            read_from_socket(port)
    say(
        f"span {span.trace_id:032x} {span.span_id:016x} {threading.get_native_id()} "
        f"{route} {span.duration_ns}"
    )


def idle(ready):
    """Periodic work outside any request: its time belongs to no span."""
    say(f"idle {threading.get_native_id()}")
    ready.release()
    n = 0
    while True:
        time.sleep(0.02)
        for i in range(20_000):
            n += i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--max-seconds", type=float, default=600)
    p.add_argument("--seed", type=int, default=43)
    args = p.parse_args()
    rng = random.Random(args.seed)

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    port = server.getsockname()[1]
    threading.Thread(
        target=serve_slowly, args=(server, args.seed + 1), name="accept", daemon=True
    ).start()
    releaser = Releaser()

    started = threading.Semaphore(0)
    for i in range(2):
        threading.Thread(target=idle, args=(started,), name=f"idle-{i}", daemon=True).start()
    for _ in range(2):
        started.acquire()
    say(f"ready {os.getpid()}")

    # As many requests in flight as workers: the pool stays busy, and no
    # request waits in the queue (its span starts when a worker takes it).
    in_flight = threading.Semaphore(args.workers)
    deadline = time.monotonic() + args.max_seconds
    with ThreadPoolExecutor(max_workers=args.workers, thread_name_prefix="worker") as pool:
        i = 0
        while time.monotonic() < deadline:
            in_flight.acquire()
            route = ROUTES[i % 2]
            i += 1
            future = pool.submit(handle, route, releaser, port, rng.uniform(*HOLD_MS))
            future.add_done_callback(lambda f: (in_flight.release(), f.result()))


if __name__ == "__main__":
    main()
