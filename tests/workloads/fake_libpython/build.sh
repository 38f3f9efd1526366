#!/bin/sh
# Builds the fake CPython runtimes and their host program into OUTDIR:
#   OUTDIR/libpython3.12.so, OUTDIR/libpython3.13.so, OUTDIR/fake_python
# Run: OUTDIR/fake_python [OUTDIR/libpython3.13.so]   (default: 3.12)
set -eu
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
src=$(cd "$(dirname "$0")" && pwd)
out=$1
mkdir -p "$out"
cc=${CC:-clang}
# Frame pointers, as the other workloads: the native part of the stacks is
# exact. Each library is built beside and renamed into place, so a
# concurrent build never runs a half-written one.
for minor in 12 13; do
  lib="$out/libpython3.$minor.so"
  $cc -O1 -g -fno-omit-frame-pointer -fPIC -shared -fvisibility=hidden -pthread \
    -Wall -Wextra -Werror -DFAKE_MINOR=$minor -Wl,-soname,libpython3.$minor.so \
    -o "$lib.$$" "$src/fake_libpython.c"
  mv -f "$lib.$$" "$lib"
done
$cc -O1 -g -fno-omit-frame-pointer -fno-inline -fno-optimize-sibling-calls -pthread \
  -Wall -Wextra -Werror -o "$out/fake_python.$$" "$src/fake_python.c" -ldl
mv -f "$out/fake_python.$$" "$out/fake_python"
