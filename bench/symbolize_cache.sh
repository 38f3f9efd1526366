#!/usr/bin/env bash
# CPU of the daemon's symbolizer thread (ws-symbolize) for two daemon
# builds on the same busy workload, in alternating rounds (issue #40).
#
#   bench/symbolize_cache.sh BEFORE_BINARY AFTER_BINARY
#
# Workload, started once for all rounds: a JVM (bench/workloads/Burn.java,
# JIT defaults: its compiler and GC threads run in libjvm.so, 24 MB, over
# the 16 MiB past which the old code let go of a file's symbols at every
# batch), tests/workloads/mixed (locks, sleeps, a pipe, a spinner) and two
# `yes` loops. Each round starts one daemon, waits WARM seconds, then reads
# ws-symbolize's utime+stime from /proc/PID/task/TID/stat and the daemon's
# /healthz before and after SECS seconds. Needs root (the daemon loads BPF).
set -euo pipefail
BEFORE=$(realpath "$1")
AFTER=$(realpath "$2")
SECS=${SECS:-60}
WARM=${WARM:-20}
ROUNDS=${ROUNDS:-2}
PORT=${PORT:-7741}
cd "$(dirname "$0")/.."
# Under target/: a shared host may clean /tmp under a long run.
TMP=$(mktemp -d -p "$PWD/target")
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT

javac -d "$TMP" bench/workloads/Burn.java
java -cp "$TMP" Burn 100000 >"$TMP/burn.out" &
PIDS+=($!)
gcc -O2 -pthread -o "$TMP/mixed" tests/workloads/mixed.c
"$TMP/mixed" 100000 >"$TMP/mixed.out" &
PIDS+=($!)
for _ in 1 2; do
    yes >/dev/null &
    PIDS+=($!)
done
HZ=$(getconf CLK_TCK)

# utime+stime ticks of the daemon's ws-symbolize thread.
symbolize_ticks() {
    local d=$1 t
    for t in /proc/"$d"/task/*; do
        if [ "$(cat "$t/comm")" = ws-symbolize ]; then
            awk '{ print $14 + $15 }' "$t/stat"
            return
        fi
    done
    echo 0
}

healthz() { curl -s "http://127.0.0.1:$PORT/healthz"; }

round() {
    local name=$1 bin=$2
    "$bin" serve --listen "127.0.0.1:$PORT" >"$TMP/$name.log" 2>&1 &
    local d=$!
    for _ in $(seq 120); do
        healthz >/dev/null 2>&1 && break
        sleep 1
    done
    sleep "$WARM"
    local t0 h0 t1 h1
    t0=$(symbolize_ticks "$d")
    h0=$(healthz)
    sleep "$SECS"
    t1=$(symbolize_ticks "$d")
    h1=$(healthz)
    local rss hwm
    rss=$(awk '/VmRSS/ { print $2 }' /proc/"$d"/status)
    hwm=$(awk '/VmHWM/ { print $2 }' /proc/"$d"/status)
    kill "$d"
    wait "$d" 2>/dev/null || true
    python3 - "$name" "$t0" "$t1" "$HZ" "$SECS" "$rss" "$hwm" "$h0" "$h1" <<'EOF'
import json, sys
name, t0, t1, hz, secs, rss, hwm = sys.argv[1:8]
h0, h1 = json.loads(sys.argv[8])["pipeline"], json.loads(sys.argv[9])["pipeline"]
cpu = (int(t1) - int(t0)) / int(hz) / int(secs) * 100
batches = h1["symbolized_batches"] - h0["symbolized_batches"]
own_us = h1["symbolize_cpu_us_total"] - h0["symbolize_cpu_us_total"]
line = (f"{name}: ws-symbolize {cpu:.2f} % of a CPU (/proc), "
        f"{own_us / max(batches, 1) / 1000:.2f} ms CPU per batch over {batches} batches "
        f"(/healthz), RSS {int(rss) // 1024} MB, HWM {int(hwm) // 1024} MB")
c0, c1 = h0.get("frame_cache"), h1.get("frame_cache")
if c0 and c1:
    d = {k: c1[k] - c0[k] for k in ("hits", "misses", "evicted", "invalidated",
                                     "refused", "elf_parses", "elf_lookups")}
    line += (f"; cache over the window: {d}, holding {c1['entries']} entries, "
             f"{c1['bytes'] // 1024} KiB of {c1['max_bytes'] // 1024} KiB")
print(line, flush=True)
EOF
}

for r in $(seq "$ROUNDS"); do
    round "before-$r" "$BEFORE"
    round "after-$r" "$AFTER"
done
