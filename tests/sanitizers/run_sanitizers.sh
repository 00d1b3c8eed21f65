#!/usr/bin/env bash
# Builds the integration tests and ps-server with sanitizers and runs them
# (docs/sanitizers.md):
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer), clang, in
#         build-fuzz/, the build the fuzz targets use (clang_asan_build.sh)
#   tsan: ThreadSanitizer, g++, build-tsan/
#
#   tests/sanitizers/run_sanitizers.sh [asan|tsan]...     # default: asan tsan
#
# Each configures (-O1 -g1 with assertions on, no examples or benchmarks), builds only
# ps_integration_test, ps-server and ps-admin (TSan: and the canary of
# tests/sanitizers/tsan_canary.cc), and runs `ctest -L integration`. Stops at the first
# failing sanitizer and exits 1; the reports are in the ctest output
# (build-*/Testing/Temporary/LastTest.log).
# Environment: PS_SANITIZE_JOBS (ninja and ctest -j, default 2), PS_ASAN_BUILD_DIR
# (default PS_FUZZ_BUILD_DIR, else <repo>/build-fuzz), PS_TSAN_BUILD_DIR (default
# <repo>/build-tsan), PS_TSAN_TESTS (a ctest -R regex to run only some tests under TSan;
# default all), CC/CXX for the asan build (default clang/clang++). `bash run.sh test`
# runs this after fuzzing unless PS_SANITIZERS=0.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
jobs=${PS_SANITIZE_JOBS:-2}
kinds=("$@")
[[ ${#kinds[@]} -gt 0 ]] || kinds=(asan tsan)

# Every integration test runs under both (about 15 s under ASan, 45 s under TSan on 2
# cores); PS_TSAN_TESTS narrows the TSan run to a ctest -R regex.
tsan_tests=${PS_TSAN_TESTS:-.}

# shellcheck source=clang_asan_build.sh
source "$root/tests/sanitizers/clang_asan_build.sh"

build_integration() {  # DIR [EXTRA TARGET...]
  local dir=$1
  shift
  ninja -C "$dir" -j "$jobs" ps_integration_test ps-server ps-admin "$@"
}

run_asan() {
  local dir=${PS_ASAN_BUILD_DIR:-${PS_FUZZ_BUILD_DIR:-$root/build-fuzz}}
  echo "=== asan: building in $dir"
  local t0=$SECONDS
  configure_clang_asan "$root" "$dir"
  build_integration "$dir"
  echo "=== asan: built in $((SECONDS - t0)) s; running ctest -L integration"
  t0=$SECONDS
  # Leak checking stays on: the test binary and ps-server return from main (only the
  # examples' trainers _Exit, and they are not built here). gRPC's process-wide state
  # is reachable from globals at exit, so LSan does not count it.
  (cd "$dir" && ASAN_OPTIONS=halt_on_error=1:abort_on_error=0:detect_leaks=1:strict_string_checks=1:detect_stack_use_after_return=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    ctest -L integration --output-on-failure -j "$jobs" --timeout 900)
  echo "=== asan: integration tests passed in $((SECONDS - t0)) s"
}

run_tsan() {
  local dir=${PS_TSAN_BUILD_DIR:-$root/build-tsan}
  echo "=== tsan: building in $dir"
  local t0=$SECONDS
  cmake -S "$root" -B "$dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DPS_SANITIZE=thread -DPS_BUILD_TESTS=ON -DPS_BUILD_EXAMPLES=OFF \
    -DPS_BUILD_BENCHMARKS=OFF -DPS_WITH_CUDA=OFF >/dev/null
  build_integration "$dir" tsan_canary
  echo "=== tsan: built in $((SECONDS - t0)) s; running ctest -L integration -R '$tsan_tests'"
  t0=$SECONDS
  (cd "$dir" && TSAN_OPTIONS="suppressions=$root/tests/sanitizers/tsan.supp halt_on_error=1 second_deadlock_stack=1 history_size=4" \
    ctest -L integration -R "$tsan_tests" --output-on-failure -j "$jobs" --timeout 900)
  echo "=== tsan: integration tests passed in $((SECONDS - t0)) s"
}

for kind in "${kinds[@]}"; do
  case $kind in
    asan) run_asan ;;
    tsan) run_tsan ;;
    *) echo "usage: $0 [asan|tsan]..." >&2; exit 2 ;;
  esac
done
echo "=== sanitizers passed: ${kinds[*]}"
