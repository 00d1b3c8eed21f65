#!/usr/bin/env bash
# The installed package, from outside the tree (ctest install_consumer_project, label
# install; docs/building.md, "Installing and linking against ps-server"):
#   1. cmake --install BUILD_DIR --prefix TMP/prefix, and the expected files are there
#      (binaries, libraries, package files; no *_internal.h, generated or gRPC-including
#      header; no path into the source or build tree in the package files); the Python package, when built, imports from
#      the prefix and its ps-launch runs;
#   2. every installed header compiles, with only the prefix's include path;
#   3. tests/install/consumer/ configured out of tree with CMAKE_PREFIX_PATH=TMP/prefix
#      (find_package(PsServer), PsServer::worker), built and run;
#   4. the same main.cc compiled and linked with `pkg-config --cflags --libs ps-server`,
#      and run.
# Stops at the first failure (exit 1). The temporary directory is removed on exit.
# usage: consumer_test.sh BUILD_DIR CONFIG CONSUMER_SRC CMAKE GENERATOR MAKE_PROGRAM CXX
set -euo pipefail
[ $# -eq 7 ] || { echo "usage: $0 BUILD_DIR CONFIG CONSUMER_SRC CMAKE GENERATOR MAKE_PROGRAM CXX" >&2; exit 2; }
build=$(cd "$1" && pwd) config=$2 src=$(cd "$3" && pwd) cmake=$4 generator=$5 make_program=$6 cxx=$7
source_dir=$(cd "$src/../../.." && pwd)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/ps-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
t0=$SECONDS
fail() { echo "consumer_test: FAILED: $*" >&2; exit 1; }
step() { echo "=== [$((SECONDS - t0)) s] $*"; }

step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" --config "$config" >"$tmp/install.log" ||
  { cat "$tmp/install.log"; fail "cmake --install"; }
config_file=$(find "$prefix" -path '*/cmake/PsServer/PsServerConfig.cmake' | head -n 1)
pc_file=$(find "$prefix" -path '*/pkgconfig/ps-server.pc' | head -n 1)
[ -n "$config_file" ] || fail "no PsServerConfig.cmake under $prefix"
[ -n "$pc_file" ] || fail "no ps-server.pc under $prefix"
[ -x "$prefix/bin/ps-server" ] && [ -x "$prefix/bin/ps-admin" ] || fail "no bin/ps-server or bin/ps-admin"
include_dir=$prefix/include/ps-server
[ -f "$include_dir/worker_lib/worker.h" ] || fail "no include/ps-server/worker_lib/worker.h"
[ -n "$(find "$prefix" -name 'libps_worker.a')" ] || fail "no libps_worker.a"
internal=$(find "$include_dir" -name '*_internal.h' -o -name '*.pb.h')
[ -z "$internal" ] || fail "internal or generated headers installed: $internal"
# Public headers carry no gRPC or protobuf types (cmake/PsServerInstall.cmake's list).
if grep -rlE '#include [<"](grpc|grpcpp|google/protobuf|ps/v1)/' "$include_dir"; then
  fail "the installed headers above include gRPC or protobuf"
fi
# Relocatable: the package files name no path of this machine's trees.
if grep -rlF -e "$source_dir" -e "$build" "$(dirname "$config_file")" "$pc_file"; then
  fail "the package files above name the source or build directory"
fi
"$prefix/bin/ps-server" --help >/dev/null || fail "the installed ps-server --help"
# The Python package, where the build made one: importable from the prefix alone, and
# ps-launch runs from the prefix's bin/.
package=$(find "$prefix" -type d -path '*/dist-packages/ps_server' | head -n 1)
if [ -n "$package" ]; then
  [ -x "$prefix/bin/ps-launch" ] || fail "no bin/ps-launch next to the Python package"
  (cd "$tmp" && env -u PYTHONPATH PYTHONPATH="$(dirname "$package")" PYTHONDONTWRITEBYTECODE=1 \
    /usr/bin/python3 -c 'import ps_server, ps_server.aggregators, ps_server.codecs, ps_server.launch') ||
    fail "import ps_server from $(dirname "$package")"
  env PYTHONPATH="$(dirname "$package")" PYTHONDONTWRITEBYTECODE=1 "$prefix/bin/ps-launch" --help >/dev/null ||
    fail "the installed ps-launch --help"
  echo "Python package: $package"
fi
echo "installed $(find "$prefix" -type f | wc -l) files ($(du -sh "$prefix" | cut -f1))"

# The include path of the consumers: the prefix, never the source tree.
export PKG_CONFIG_PATH=$(dirname "$pc_file")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
pc_cflags=$(pkg-config --cflags ps-server) || fail "pkg-config --cflags ps-server"
pc_libs=$(pkg-config --libs ps-server) || fail "pkg-config --libs ps-server"
echo "pkg-config --cflags: $pc_cflags"
echo "pkg-config --libs: $pc_libs"

step "every installed header, with only the prefix's include path"
headers=$(cd "$include_dir" && find . -name '*.h' | sed 's|^\./||' | sort)
[ -n "$headers" ] || fail "no headers installed"
for h in $headers; do echo "#include \"$h\""; done >"$tmp/all_headers.cc"
# One translation unit (each header on its own costs a minute on 2 cores): an #include
# that does not resolve in the prefix fails here.
# shellcheck disable=SC2086
"$cxx" -std=c++20 -fsyntax-only $pc_cflags "$tmp/all_headers.cc" ||
  fail "the installed headers do not compile with pkg-config's flags"
echo "$(echo "$headers" | wc -l) headers compile"

step "consumer project: find_package(PsServer), PsServer::worker"
"$cmake" -S "$src" -B "$tmp/consumer" -G "$generator" -DCMAKE_MAKE_PROGRAM="$make_program" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" \
  >"$tmp/configure.log" 2>&1 || { cat "$tmp/configure.log"; fail "configuring the consumer"; }
"$cmake" --build "$tmp/consumer" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log"; fail "building the consumer"; }
"$tmp/consumer/consumer" || fail "the consumer (CMake) exited with $?"

step "consumer with pkg-config: $cxx -std=c++20 main.cc \$(pkg-config --cflags --libs ps-server)"
# shellcheck disable=SC2086
"$cxx" -std=c++20 -O1 "$src/main.cc" $pc_cflags $pc_libs -o "$tmp/consumer_pc" ||
  fail "compiling and linking with pkg-config"
"$tmp/consumer_pc" || fail "the consumer (pkg-config) exited with $?"

step "done"
