#!/usr/bin/env bash
# Installs what building and testing wallscope needs on Debian/Ubuntu, and
# nothing when it is all there. `scripts/deps.sh bench` adds the reference
# tools the benchmarks compare against.
set -euo pipefail

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_cmd clang || need+=(clang)
have_cmd cc || need+=(build-essential)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
if [ "${1:-}" = bench ]; then
  have_cmd perf || need+=(linux-perf)
  have_cmd bpftrace || need+=(bpftrace)
  have_cmd bpftool || need+=(bpftool)
  { [ -x /usr/sbin/offcputime ] && [ -x /usr/sbin/runqlat ]; } || need+=(libbpf-tools)
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
