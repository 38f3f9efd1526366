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
# JVM tests: a JDK 17+ (Compiler.perfmap), and setpriv/unshare (util-linux).
jdk_ok() {
  have_cmd javac || return 1
  local v
  v=$(javac -version 2>&1 | sed -n 's/^javac \([0-9]*\).*/\1/p')
  [ "${v:-0}" -ge 17 ]
}
if ! jdk_ok; then
  # Debian 12 / Ubuntu 22.04+ have 17; newer releases only a newer default.
  if apt-cache show openjdk-17-jdk-headless >/dev/null 2>&1; then
    need+=(openjdk-17-jdk-headless)
  else
    need+=(default-jdk-headless)
  fi
fi
have_cmd setpriv || need+=(util-linux)
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
