"""A ddtrace service publishing its thread context (run under ddtrace-run
with DD_TRACE_OTEL_CTX_ENABLED=true): one thread serves requests, each a
span, printing its thread pointer (glibc's pthread_self on x86_64) and
each span's ids as the record holds them."""
import ctypes
import os
import threading
import time

from ddtrace import tracer

libc = ctypes.CDLL(None)
libc.pthread_self.restype = ctypes.c_ulong


def serve():
    tid = threading.get_native_id()
    print(f"tls {tid} {libc.pthread_self():x}", flush=True)
    while True:
        with tracer.trace("request", resource="/lock") as s:
            print(f"span {s.trace_id:032x} {s.span_id:016x} {tid}", flush=True)
            time.sleep(0.05)
        time.sleep(0.01)


print(f"ready {os.getpid()}", flush=True)
serve()
