#!/usr/bin/env bash
# Builds ps-lite (from a source checkout, against the system libzmq and libprotobuf) and
# the pslite_e2e driver into BUILD_DIR. Needs: cmake, g++, pkg-config, and the Debian
# packages libzmq3-dev libprotobuf-dev protobuf-compiler.
#
#   bench/peers/pslite/build.sh /work/pslite-src /work/pslite-build
#   -> /work/pslite-build/pslite_e2e
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 PSLITE_SRC_DIR BUILD_DIR" >&2
  exit 2
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
src=$(cd "$1" && pwd)
mkdir -p "$2"
build=$(cd "$2" && pwd)
case "$build/" in
  "$here"/*) echo "$0: put BUILD_DIR outside the repository" >&2; exit 2 ;;
esac
if [ -d "$src/.git" ] || [ -f "$src/.git" ]; then
  echo "ps-lite commit: $(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)"
fi
cmake -S "$here" -B "$build" -DPSLITE_SRC="$src" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)"
echo "built $build/pslite_e2e"
