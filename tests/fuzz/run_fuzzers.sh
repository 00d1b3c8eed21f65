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
# <repo>/build-fuzz, as run_sanitizers.sh's asan), PS_FUZZ_JOBS (ninja -j and the targets
# run at once, default 2), PS_FUZZ_ARGS (extra
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
# Targets run PS_FUZZ_JOBS at a time (one per core: each is a single-threaded process),
# each writing its own log, printed when it ends; the first that fails stops the rest.
parallel=${PS_FUZZ_JOBS:-2}
logs="$build/fuzz/logs"
mkdir -p "$logs"
declare -A running=() binaries=()  # pid -> target name; name -> its binary
failed=""
failed_status=0

# Waits for one running target; prints its log; records a failure.
reap() {
  local pid status=0
  wait -n -p pid "${!running[@]}" || status=$?
  local name=${running[$pid]}
  unset "running[$pid]"
  cat "$logs/$name.log"
  if [[ $status -ne 0 && -z $failed ]]; then  # the first to fail is the one reported
    failed=$name
    failed_status=$status
  fi
}

# Says which target failed and why, last, so that a caller showing only the log's tail
# (run.sh, CI) shows this and not the log of a target that ran beside it: the sanitizer's
# or libFuzzer's report (from its first "==<pid>==" line on, at most 31 lines), the
# inputs left in artifacts/, and the command that replays them.
report_failure() {
  local name=$1 log="$logs/$1.log"
  echo "=== $name: FAILED with exit status $failed_status (over 128: 128 + the signal that" \
    "killed it); its full log: $log" >&2
  grep -a -m1 -A30 -E '^==[0-9]+==|^ERROR: libFuzzer|^SUMMARY: ' "$log" >&2 || tail -n 30 "$log" >&2
  ls -l "$build/fuzz/artifacts/$name" >&2 || true
  echo "=== $name: reproduce with: ${binaries[$name]} $build/fuzz/artifacts/$name/<crash-file>" >&2
}

ran=0
while IFS=$'\t' read -r name binary seeds; do
  [[ -n $name ]] || continue
  if [[ $# -gt 0 ]] && ! printf '%s\n' "$@" | grep -qx "$name"; then continue; fi
  while [[ ${#running[@]} -ge $parallel ]]; do reap; done
  [[ -z $failed ]] || break
  work="$build/fuzz/corpus/$name"
  artifacts="$build/fuzz/artifacts/$name"
  mkdir -p "$work" "$artifacts"
  # shellcheck disable=SC2086  # PS_FUZZ_ARGS is a list of flags
  { echo "=== $name: ${seconds}s (corpus $work, seeds $seeds)"
    "$binary" -max_total_time="$seconds" -timeout=60 -print_final_stats=1 \
      -artifact_prefix="$artifacts/" ${PS_FUZZ_ARGS:-} "$work" "$seeds"; } >"$logs/$name.log" 2>&1 &
  running[$!]=$name
  binaries[$name]=$binary
  ran=$((ran + 1))
done <"$list"
while [[ ${#running[@]} -gt 0 ]]; do reap; done
if [[ -n $failed ]]; then
  report_failure "$failed"
  exit 1
fi

if [[ $ran -eq 0 ]]; then
  echo "no fuzz target matched: $* (known: $(cut -f1 "$list" | tr '\n' ' '))" >&2
  exit 2
fi
echo "=== $ran fuzz target(s) ran ${seconds}s each without a crash"
