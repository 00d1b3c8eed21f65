# Sourced by tests/fuzz/run_fuzzers.sh and tests/sanitizers/run_sanitizers.sh: the one
# clang build with AddressSanitizer + UndefinedBehaviorSanitizer (docs/sanitizers.md,
# docs/fuzzing.md) in which both build what they run, so the project's libraries are
# compiled once for the fuzz targets and the ASan integration tests (two separate
# builds took about 2,200 s of compiler time on 2 cores, this one about 900):
# - every file with -fsanitize=address,undefined (PS_SANITIZE), -O1 -g1;
# - the libraries a fuzz target links also with libFuzzer's coverage
#   (-fsanitize=fuzzer-no-link, tests/fuzz/CMakeLists.txt), which the ASan runtime's
#   weak hooks satisfy in the other executables;
# - tests on (the integration tests), examples, benchmarks and CUDA off.
# Environment: CC/CXX (default clang/clang++).
#
#   configure_clang_asan ROOT DIR
configure_clang_asan() {
  local root=$1 dir=$2
  cmake -S "$root" -B "$dir" -G Ninja \
    -DCMAKE_C_COMPILER="${CC:-clang}" -DCMAKE_CXX_COMPILER="${CXX:-clang++}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
    -DPS_SANITIZE="address;undefined" -DPS_FUZZING=ON -DPS_BUILD_TESTS=ON \
    -DPS_BUILD_EXAMPLES=OFF -DPS_BUILD_BENCHMARKS=OFF -DPS_WITH_CUDA=OFF >/dev/null
}
