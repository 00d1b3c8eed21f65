#!/usr/bin/env bash
# Every check of docs/gpu.md "Status" that needs a CUDA device, in one command, for the
# first session (or user) on a GPU machine: `bash run.sh gpu-check` builds what it needs
# and calls this script; by hand: bench/gpu_check.sh BUILD_DIR [OUT_DIR].
#
#   1. ps_aggregators_cuda_test and ps_codecs_cuda_device_test: the kernels against the
#      CPU's bits (their OnCuda.* / DeviceEncoderTest.* cases run instead of skipping);
#   2. ps-bench aggregators --device cuda: median and trimmed mean at n = 16, Krum at
#      n = 64, d = 2^24, each as a ratio to a device-to-device copy in the same run;
#   3. ps-bench codecs --device cuda: every GPU encoder against the same copy.
#
# Logs and the benches' JSON rows go to OUT_DIR (default BUILD_DIR/gpu-check); the last
# step prints the ratios against the targets (bench/gpu_targets.py, docs/gpu.md). Exit status:
# 0 when every test passed (a missed throughput target is reported, not an error), 1
# when a test failed or a bench could not run, 2 when there is no CUDA device.
set -uo pipefail
cd "$(dirname "$0")/.."

build=${1:?usage: bench/gpu_check.sh BUILD_DIR [OUT_DIR]}
out=${2:-$build/gpu-check}
bench=$build/bin/ps-bench
mkdir -p "$out"

for binary in "$bench" "$build/tests/ps_aggregators_cuda_test" "$build/tests/ps_codecs_cuda_device_test"; do
  [ -x "$binary" ] || { echo "gpu_check: $binary is missing (a build with CUDA: bash run.sh gpu-check)" >&2; exit 1; }
done

# The device first: without one every step below would only skip.
"$bench" aggregators --device cuda --n 4 --d 1024 --rules mean >"$out/probe.log" 2>&1
case $? in
  0) sed -n 's/^device: /gpu_check: device: /p' "$out/probe.log" ;;
  2) echo "gpu_check: $(tail -n 1 "$out/probe.log")" >&2; exit 2 ;;
  *) echo "gpu_check: the probe run failed; last lines of $out/probe.log:" >&2
     tail -n 20 "$out/probe.log" >&2; exit 1 ;;
esac

failed=0
# Runs one step with its output in OUT_DIR/NAME.log; says how it went in one line.
step() {
  local name=$1; shift
  local started=$SECONDS
  if "$@" >"$out/$name.log" 2>&1; then
    echo "gpu_check: $name passed ($((SECONDS - started)) s; $out/$name.log)"
  else
    echo "gpu_check: $name FAILED (status $?); last lines of $out/$name.log:" >&2
    tail -n 30 "$out/$name.log" >&2
    failed=1
  fi
}

step aggregators_cuda_test "$build/tests/ps_aggregators_cuda_test"
step codecs_cuda_device_test "$build/tests/ps_codecs_cuda_device_test"
# With a device, a GPU test that still skips means its setup could not use it.
if grep -h '^\[  SKIPPED \]' "$out/aggregators_cuda_test.log" "$out/codecs_cuda_device_test.log" \
    | grep -v 'tests\?, listed below' >"$out/skipped.txt"; then
  echo "gpu_check: tests skipped although a device exists:" >&2
  cat "$out/skipped.txt" >&2
  failed=1
fi
step bench_coordinate "$bench" aggregators --device cuda --n 16 --d 2^24 \
  --rules median,trimmed_mean --json "$out/aggregators_n16.json"
step bench_krum "$bench" aggregators --device cuda --n 64 --d 2^24 --rules krum \
  --json "$out/aggregators_n64.json"
step bench_codecs "$bench" codecs --device cuda --json "$out/codecs.json"

python3 bench/gpu_targets.py "$out" || failed=1
exit "$failed"
