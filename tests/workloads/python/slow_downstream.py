"""A downstream service that answers each one-byte request after a fixed
delay: what the `/explain` acceptance test's Java pool waits on.

    python3 slow_downstream.py --delay-ms 50

Listens on 127.0.0.1 (a free port), one thread per connection. Prints
`ready <pid>`, then `port <port>`.
"""

import argparse
import os
import socket
import threading
import time


def answer(conn, delay):
    with conn:
        while True:
            if not conn.recv(1):
                return
            time.sleep(delay)
            conn.sendall(b"x")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--delay-ms", type=float, required=True)
    args = p.parse_args()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    print(f"ready {os.getpid()}", flush=True)
    print(f"port {server.getsockname()[1]}", flush=True)
    while True:
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=answer, args=(conn, args.delay_ms / 1000), daemon=True).start()


if __name__ == "__main__":
    main()
