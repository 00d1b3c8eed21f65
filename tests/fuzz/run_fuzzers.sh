#!/usr/bin/env bash
# Builds the libFuzzer targets with clang in build-fuzz/ (the clang ASan build of
# tests/sanitizers/clang_asan_build.sh, which the ASan integration tests share) and runs
# each for a while.
#
#   tests/fuzz/run_fuzzers.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 30; TARGETs (e.g. codec_decode) default to all.
# Stops at the first target that crashes and exits 1; the crashing input is left in
# build-fuzz/fuzz/artifacts/<target>/. New corpus entries go to
# build-fuzz/fuzz/corpus/<target>/ (the checked-in seeds are only read).
# Environment: CC/CXX (default clang/clang++), PS_FUZZ_BUILD_DIR (default
# <repo>/build-fuzz, as run_sanitizers.sh's asan), PS_FUZZ_JOBS (ninja -j, default 2), PS_FUZZ_ARGS (extra
# libFuzzer flags, e.g. "-jobs=4 -workers=4" or "-max_len=100000"; they come after
# the defaults, so "-timeout=600" overrides the per-input limit of 60 s: one input
# running longer counts as a failure, a hang instead of a bounded run).
# `bash run.sh test` runs this with PS_FUZZ_SECONDS (default 10) after ctest.
set -euo pipefail

seconds=${1:-30}
if [[ $# -gt 0 ]]; then shift; fi
if ! [[ $seconds =~ ^[0-9]+$ ]]; then
  echo "usage: $0 [SECONDS_PER_TARGET] [TARGET...]" >&2
  exit 2
fi

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${PS_FUZZ_BUILD_DIR:-$root/build-fuzz}

# The clang ASan build the ASan integration tests share (tests/sanitizers/).
# shellcheck source=../sanitizers/clang_asan_build.sh
source "$root/tests/sanitizers/clang_asan_build.sh"
configure_clang_asan "$root" "$build"
ninja -C "$build" -j "${PS_FUZZ_JOBS:-2}" ps_fuzz_targets

list="$build/fuzz/targets.tsv"
ran=0
while IFS=$'\t' read -r name binary seeds; do
  [[ -n $name ]] || continue
  if [[ $# -gt 0 ]] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
  work="$build/fuzz/corpus/$name"
  artifacts="$build/fuzz/artifacts/$name"
  mkdir -p "$work" "$artifacts"
  echo "=== $name: ${seconds}s (corpus $work, seeds $seeds)"
  # shellcheck disable=SC2086  # PS_FUZZ_ARGS is a list of flags
  if ! "$binary" -max_total_time="$seconds" -timeout=60 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" ${PS_FUZZ_ARGS:-} "$work" "$seeds"; then
    echo "=== $name: FAILED; reproduce with: $binary $artifacts/<crash-file>" >&2
    ls -l "$artifacts" >&2 || true
    exit 1
  fi
  ran=$((ran + 1))
done <"$list"

if [[ $ran -eq 0 ]]; then
  echo "no fuzz target matched: $* (known: $(cut -f1 "$list" | tr '\n' ' '))" >&2
  exit 2
fi
echo "=== $ran fuzz target(s) ran ${seconds}s each without a crash"
