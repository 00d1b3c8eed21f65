#!/usr/bin/env bash
# Runs pslite_e2e on 127.0.0.1: one scheduler, S servers and W workers as separate
# processes, configured through ps-lite's DMLC_* variables, and prints worker 0's line
#   pslite_e2e workers=W servers=S params=N rounds=R seconds=X goodput_gbps=Y
#
#   bench/peers/pslite/run.sh W S [N=4194304] [R=10]
#
# Environment: PSLITE_E2E_BIN (default /work/pslite-build/pslite_e2e), PSLITE_TIMEOUT
# (seconds for the whole run, default 300), PSLITE_WARMUP (untimed rounds, default 2),
# PSLITE_LR (default 0.1), PSLITE_LOGS (keep the per-process logs in this directory;
# default a temporary one, removed on success). Exit status: 0 when every process exited
# 0 and worker 0 printed its line; 1 otherwise (the logs' tails are printed); 124 on timeout.
set -uo pipefail

if [ $# -lt 2 ] || [ $# -gt 4 ]; then
  echo "usage: $0 W S [N=4194304] [R=10]" >&2
  exit 2
fi
W=$1 S=$2 N=${3:-4194304} R=${4:-10}
for v in "$W" "$S" "$N" "$R"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "$0: W S N R must be positive integers" >&2; exit 2; }
done
BIN=${PSLITE_E2E_BIN:-/work/pslite-build/pslite_e2e}
TIMEOUT=${PSLITE_TIMEOUT:-300}
WARMUP=${PSLITE_WARMUP:-2}
LR=${PSLITE_LR:-0.1}
[ -x "$BIN" ] || { echo "$0: no $BIN (run build.sh first, or set PSLITE_E2E_BIN)" >&2; exit 2; }

if [ -n "${PSLITE_LOGS:-}" ]; then
  logs=$PSLITE_LOGS; mkdir -p "$logs"; keep_logs=1
else
  logs=$(mktemp -d /tmp/pslite_e2e.XXXXXX); keep_logs=0
fi

# A free TCP port on 127.0.0.1 for the scheduler (the kernel picks it; the small race
# until the scheduler binds it is acceptable for a hand-run benchmark).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null) \
  || port=$((20000 + RANDOM % 20000))

pids=()
cleanup() {
  trap - EXIT INT TERM
  local p alive=()
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
  if [ ${#alive[@]} -gt 0 ]; then
    kill -TERM "${alive[@]}" 2>/dev/null
    sleep 1
    for p in "${alive[@]}"; do kill -0 "$p" 2>/dev/null && kill -KILL "$p" 2>/dev/null; done
  fi
  wait 2>/dev/null
  if [ "$keep_logs" = 0 ] && [ "${ok:-0}" = 1 ]; then rm -rf "$logs"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

export DMLC_PS_ROOT_URI=127.0.0.1
export DMLC_PS_ROOT_PORT=$port
export DMLC_NUM_WORKER=$W
export DMLC_NUM_SERVER=$S
# Every node announces (and binds) 127.0.0.1; without it ps-lite picks the first
# non-loopback interface's address.
export DMLC_NODE_HOST=127.0.0.1
args=("$N" "$R" "$WARMUP" "$LR")

start() {  # start ROLE LOGNAME
  DMLC_ROLE=$1 "$BIN" "${args[@]}" >"$logs/$2.out" 2>"$logs/$2.err" &
  pids+=($!)
}
start scheduler scheduler
for ((i = 0; i < S; ++i)); do start server "server$i"; done
for ((i = 0; i < W; ++i)); do start worker "worker$i"; done

# Wait for all, at most TIMEOUT seconds; stop at the first process that fails (the
# others would wait for it forever).
deadline=$((SECONDS + TIMEOUT))
rc=0 timed_out=0
running=("${pids[@]}")
while [ ${#running[@]} -gt 0 ]; do
  still=()
  for p in "${running[@]}"; do
    if kill -0 "$p" 2>/dev/null; then still+=("$p"); continue; fi
    wait "$p"; r=$?
    [ $r -ne 0 ] && { rc=$r; break 2; }
  done
  running=("${still[@]+"${still[@]}"}")
  [ ${#running[@]} -eq 0 ] && break
  if [ $SECONDS -ge $deadline ]; then timed_out=1; break; fi
  sleep 0.1
done

line=$(cat "$logs"/worker*.out 2>/dev/null | grep '^pslite_e2e ' | head -n 1)
if [ $timed_out = 0 ] && [ $rc = 0 ] && [ -n "$line" ]; then
  ok=1
  echo "$line"
  exit 0
fi
if [ $timed_out = 1 ]; then
  echo "$0: timed out after ${TIMEOUT}s (W=$W S=$S N=$N R=$R); logs in $logs" >&2
else
  echo "$0: failed (exit status $rc, W=$W S=$S N=$N R=$R); logs in $logs" >&2
fi
for f in "$logs"/*.err; do
  [ -s "$f" ] && { echo "--- $(basename "$f")" >&2; tail -n 5 "$f" >&2; }
done
[ -n "$line" ] && echo "$line"
[ $timed_out = 1 ] && exit 124
exit 1
