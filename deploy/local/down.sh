#!/usr/bin/env bash
# Stops the processes of a deploy/local/up.sh run with SIGTERM (workers first, then the
# shards), waits for them, SIGKILL only after PS_LOCAL_STOP_TIMEOUT_S [30] seconds.
#
#   deploy/local/down.sh [RUN_DIR]     # default: the latest run, <repo>/out/local/current
#
# Exit 0 unless a process had to be killed.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RUN=${1:-${PS_LOCAL_OUT:-$ROOT/out/local}/current}
[ -f "$RUN/pids" ] || { echo "down.sh: no $RUN/pids (nothing started there?)" >&2; exit 1; }
# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"
ps_local_stop "$RUN" "${PS_LOCAL_STOP_TIMEOUT_S:-30}"
