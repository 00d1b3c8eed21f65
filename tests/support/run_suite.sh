#!/usr/bin/env bash
# Runs one GoogleTest suite for ctest (cmake/gtest_suites.cmake):
#   run_suite.sh BINARY --gtest_filter=Suite.*
# Its exit status is the binary's, except 77 (ctest: Skipped) when the suite passed with a
# test skipped: ctest shows only Passed, Failed and Skipped, and a skip (no GPU, no
# promtool, no dataset) must not read as a pass. The test output, the skip's reason
# included, is printed as it runs.
set -uo pipefail
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$@" 2>&1 | tee "$out"
status=${PIPESTATUS[0]}
if [[ $status -eq 0 ]] && grep -q '^\[  SKIPPED \] [0-9]* tests\?, listed below' "$out"; then
  exit 77
fi
exit "$status"
