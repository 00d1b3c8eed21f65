#!/usr/bin/env bash
# The Kubernetes topology of deploy/k8s as plain processes on loopback (docs/deploy.md,
# "Local processes"): S ps-server shards (shard ids 0..S-1, --peers 127.0.0.1:PORT,...)
# and W ps-fashion-mnist workers (worker ids 0..W-1, like the Indexed Job), logs in a run
# directory. Waits for the workers, prints a summary, stops the shards with SIGTERM and
# exits 0 when every worker finished and every shard exited 0. Ctrl-C stops everything.
#
#   deploy/local/up.sh                        # 2 shards, 3 workers, 200 steps
#   PS_LOCAL_WORKERS=0 deploy/local/up.sh     # shards only, left running: deploy/local/down.sh
#
# Environment (defaults in brackets):
#   PS_BIN_DIR             ps-server and ps-fashion-mnist [<repo>/build/bin]
#   PS_LOCAL_SHARDS        S [2]           PS_LOCAL_WORKERS      W [3]
#   PS_LOCAL_BYZANTINE     f [0]           PS_LOCAL_AGGREGATOR   rule spec [mean]
#   PS_LOCAL_STEPS         rounds [200]    PS_LOCAL_BATCH_SIZE   [32]
#   PS_LOCAL_BASE_PORT     shard i listens on BASE+i, metrics on BASE+100+i [17070]
#   PS_LOCAL_OUT           [<repo>/out/local]; runs in OUT/run-<time>, OUT/current links
#                          the latest; PS_LOCAL_STATE_DIR [OUT/state] outlives runs
#   PS_LOCAL_TIMEOUT_S     give up on the workers after this long [1800]
#   PS_LOCAL_SERVER_ARGS, PS_LOCAL_WORKER_ARGS   extra flags (split on spaces)
#   PS_LOCAL_KEEP_SHARDS=1 leave the shards running after the workers (down.sh stops them)
# Opt-in features, each needing a ps-server that has the flags (checked at start):
#   PS_LOCAL_TLS=1         mTLS with test certificates from deploy/tls/make-certs.sh,
#                          made once in STATE_DIR/tls
#   PS_LOCAL_CHECKPOINTS=1 --checkpoint-dir STATE_DIR/checkpoints (a rerun restores it)
#                          every PS_LOCAL_CHECKPOINT_INTERVAL_S [30] seconds
#   PS_LOCAL_METRICS=1     --metrics-port BASE+100+i
#   PS_LOCAL_DATA_PLANE=tcp|grpc [tcp]
#                          the shards' --data-plane; with tcp shard i's --data-port is
#                          BASE+200+i (the workers follow at join); with
#                          PS_LOCAL_TLS=1 the data ports serve the same mTLS
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${PS_BIN_DIR:-$ROOT/build/bin}
SHARDS=${PS_LOCAL_SHARDS:-2}
WORKERS=${PS_LOCAL_WORKERS:-3}
BYZANTINE=${PS_LOCAL_BYZANTINE:-0}
AGGREGATOR=${PS_LOCAL_AGGREGATOR:-mean}
STEPS=${PS_LOCAL_STEPS:-200}
BATCH=${PS_LOCAL_BATCH_SIZE:-32}
BASE_PORT=${PS_LOCAL_BASE_PORT:-17070}
OUT=${PS_LOCAL_OUT:-$ROOT/out/local}
STATE=${PS_LOCAL_STATE_DIR:-$OUT/state}
TIMEOUT_S=${PS_LOCAL_TIMEOUT_S:-1800}
KEEP=${PS_LOCAL_KEEP_SHARDS:-0}
DATA_PLANE=${PS_LOCAL_DATA_PLANE:-tcp}
[ "$WORKERS" -eq 0 ] && KEEP=1

die() { echo "up.sh: $*" >&2; exit 1; }
for v in SHARDS WORKERS BYZANTINE STEPS BATCH BASE_PORT TIMEOUT_S; do
  [[ ${!v} =~ ^[0-9]+$ ]] || die "$v must be a number, got '${!v}'"
done
[ "$SHARDS" -ge 1 ] || die "PS_LOCAL_SHARDS must be at least 1"
case $DATA_PLANE in
  grpc|tcp) ;;
  *) die "PS_LOCAL_DATA_PLANE must be grpc or tcp, got '$DATA_PLANE'" ;;
esac
top_port=$((BASE_PORT + 100 + SHARDS))
[ "$DATA_PLANE" = tcp ] && top_port=$((BASE_PORT + 200 + SHARDS))
[ "$top_port" -le 65535 ] || die "PS_LOCAL_BASE_PORT too high"
SERVER="$BIN/ps-server"
TRAINER="$BIN/ps-fashion-mnist"
[ -x "$SERVER" ] || die "no $SERVER (build it: cmake --build build --target ps-server; or set PS_BIN_DIR)"
[ "$WORKERS" -eq 0 ] || [ -x "$TRAINER" ] ||
  die "no $TRAINER (build it: cmake --build build --target ps-fashion-mnist; or set PS_BIN_DIR)"

# The opt-in features need flags that older builds lack: say so instead of a usage error.
server_help=$("$SERVER" --help)
trainer_help=$([ "$WORKERS" -eq 0 ] || "$TRAINER" --help)
need_flag() {  # need_flag FEATURE HELP FLAG...
  local feature=$1 help=$2; shift 2
  for f in "$@"; do
    grep -q -- "${f}[ =]" <<<"$help" || die "$feature needs $f, which this build ($BIN) lacks"
  done
}
[ "${PS_LOCAL_TLS:-0}" = 1 ] && need_flag PS_LOCAL_TLS=1 "$server_help" --tls-cert --tls-key --tls-ca
[ "${PS_LOCAL_TLS:-0}" = 1 ] && [ "$WORKERS" -gt 0 ] &&
  need_flag PS_LOCAL_TLS=1 "$trainer_help" --tls-cert --tls-key --tls-ca
[ "${PS_LOCAL_CHECKPOINTS:-0}" = 1 ] &&
  need_flag PS_LOCAL_CHECKPOINTS=1 "$server_help" --checkpoint-dir --checkpoint-interval-s
[ "${PS_LOCAL_METRICS:-0}" = 1 ] && need_flag PS_LOCAL_METRICS=1 "$server_help" --metrics-port
need_flag "PS_LOCAL_DATA_PLANE=$DATA_PLANE" "$server_help" --data-plane --data-port

# Ports: refuse ones already taken rather than fail later with a shard's bind error.
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
peers=() data_ports=()
for ((i = 0; i < SHARDS; i++)); do
  port=$((BASE_PORT + i))
  port_busy "$port" && die "port $port is in use (set PS_LOCAL_BASE_PORT, or deploy/local/down.sh)"
  peers+=("127.0.0.1:$port")
  if [ "$DATA_PLANE" = tcp ]; then
    port=$((BASE_PORT + 200 + i))
    port_busy "$port" && die "port $port (shard $i's data port) is in use (set PS_LOCAL_BASE_PORT, or deploy/local/down.sh)"
    data_ports+=("$port")
  fi
done
PEERS=$(IFS=,; echo "${peers[*]}")

RUN=${PS_LOCAL_RUN_DIR:-$OUT/run-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$RUN" "$STATE"
ln -sfn "$RUN" "$OUT/current"
PIDS="$RUN/pids"  # NAME PID per line, read by down.sh
: >"$PIDS"

tls_server=() tls_worker=()
if [ "${PS_LOCAL_TLS:-0}" = 1 ]; then
  certs="$STATE/tls"
  if [ ! -f "$certs/shard-$((SHARDS - 1)).pem" ] || [ ! -f "$certs/worker-$((WORKERS > 0 ? WORKERS - 1 : 0)).pem" ]; then
    [ -x "$ROOT/deploy/tls/make-certs.sh" ] || die "PS_LOCAL_TLS=1 needs deploy/tls/make-certs.sh"
    "$ROOT/deploy/tls/make-certs.sh" "$certs" "$SHARDS" "$((WORKERS > 0 ? WORKERS : 1))" >"$RUN/make-certs.log" 2>&1 ||
      die "deploy/tls/make-certs.sh failed; see $RUN/make-certs.log"
  fi
  tls_server=(--tls-ca "$certs/ca.pem")
  tls_worker=(--tls-ca "$certs/ca.pem")
fi
# Without mTLS the shards authenticate clients with tokens derived from a secret in a
# private run directory (made by the first shard); each worker reads its own token.
auth_server=() auth_worker=()
if [ ${#tls_server[@]} -eq 0 ]; then
  need_flag "authentication" "$server_help" --run-dir
  auth_server=(--run-dir "$STATE/run")
  auth_worker=(--run-dir "$STATE/run")
fi

# shellcheck source=deploy/local/lib.sh
source "$ROOT/deploy/local/lib.sh"
stop_all() {
  trap - INT TERM EXIT
  echo "up.sh: stopping (SIGTERM)" >&2
  ps_local_stop "$RUN" "${PS_LOCAL_STOP_TIMEOUT_S:-30}" >&2 || true
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
[ "$KEEP" = 1 ] || trap stop_all EXIT

# --- shards ----------------------------------------------------------------------------
# shellcheck disable=SC2206
server_extra=(${PS_LOCAL_SERVER_ARGS:-})
for ((i = 0; i < SHARDS; i++)); do
  args=(--host 127.0.0.1 --port "$((BASE_PORT + i))" --port-file "$RUN/shard-$i.port"
        --shard-id "$i" --num-shards "$SHARDS" --workers "$((WORKERS > 0 ? WORKERS : 1))"
        --byzantine "$BYZANTINE" --aggregator "$AGGREGATOR" --lr 0.05 --momentum 0.9
        --threads 1 --log-format plain)
  [ "$SHARDS" -gt 1 ] && args+=(--peers "$PEERS")
  [ ${#tls_server[@]} -gt 0 ] && args+=("${tls_server[@]}" --tls-cert "$certs/shard-$i.pem" --tls-key "$certs/shard-$i.key")
  [ ${#auth_server[@]} -gt 0 ] && args+=("${auth_server[@]}")
  [ "${PS_LOCAL_CHECKPOINTS:-0}" = 1 ] && args+=(--checkpoint-dir "$STATE/checkpoints"
    --checkpoint-interval-s "${PS_LOCAL_CHECKPOINT_INTERVAL_S:-30}")
  [ "${PS_LOCAL_METRICS:-0}" = 1 ] && args+=(--metrics-port "$((BASE_PORT + 100 + i))")
  args+=(--data-plane "$DATA_PLANE")
  [ "$DATA_PLANE" = tcp ] && args+=(--data-port "${data_ports[$i]}")
  "$SERVER" "${args[@]}" "${server_extra[@]}" >"$RUN/shard-$i.log" 2>&1 &
  echo "shard-$i $!" >>"$PIDS"
done
pid_of() { awk -v n="$1" '$1 == n { print $2 }' "$PIDS"; }

for ((t = 0; ; t++)); do
  up=0
  for ((i = 0; i < SHARDS; i++)); do
    if [ -s "$RUN/shard-$i.port" ]; then up=$((up + 1)); continue; fi
    if ! kill -0 "$(pid_of "shard-$i")" 2>/dev/null; then
      tail -n 20 "$RUN/shard-$i.log" >&2
      die "shard-$i exited during start-up; log: $RUN/shard-$i.log"
    fi
  done
  [ "$up" -eq "$SHARDS" ] && break
  [ "$t" -lt 300 ] || die "shards not serving after 30 s; logs in $RUN"
  sleep 0.1
done
echo "up.sh: $SHARDS shard(s) serving on $PEERS$([ "${PS_LOCAL_TLS:-0}" = 1 ] && echo " (mTLS)")$([ "$DATA_PLANE" = tcp ] && echo ", data plane tcp on $(IFS=,; echo "${data_ports[*]}")"); logs in $RUN"

if [ "$WORKERS" -eq 0 ]; then
  echo "up.sh: no workers (PS_LOCAL_WORKERS=0); the shards keep running: deploy/local/down.sh stops them"
  exit 0
fi

# --- workers ---------------------------------------------------------------------------
# shellcheck disable=SC2206
worker_extra=(${PS_LOCAL_WORKER_ARGS:-})
start=$(date +%s)
for ((i = 0; i < WORKERS; i++)); do
  args=(--shards "$PEERS" --worker-id "$i" --workers "$WORKERS" --steps "$STEPS"
        --batch-size "$BATCH" --seed 1 --progress jsonl --log-every 10)
  [ ${#tls_worker[@]} -gt 0 ] && args+=("${tls_worker[@]}" --tls-cert "$certs/worker-$i.pem" --tls-key "$certs/worker-$i.key")
  [ ${#auth_worker[@]} -gt 0 ] && args+=("${auth_worker[@]}")
  "$TRAINER" "${args[@]}" "${worker_extra[@]}" >"$RUN/worker-$i.jsonl" 2>"$RUN/worker-$i.log" &
  echo "worker-$i $!" >>"$PIDS"
done
echo "up.sh: $WORKERS worker(s) training for $STEPS steps"

declare -A rc
left=$WORKERS
while [ "$left" -gt 0 ]; do
  for ((i = 0; i < WORKERS; i++)); do
    [ -n "${rc[$i]:-}" ] && continue
    pid=$(pid_of "worker-$i")
    kill -0 "$pid" 2>/dev/null && continue
    code=0; wait "$pid" || code=$?
    rc[$i]=$code; left=$((left - 1))
  done
  for ((i = 0; i < SHARDS; i++)); do
    kill -0 "$(pid_of "shard-$i")" 2>/dev/null ||
      { tail -n 20 "$RUN/shard-$i.log" >&2; die "shard-$i exited while the workers ran; log: $RUN/shard-$i.log"; }
  done
  [ $(($(date +%s) - start)) -lt "$TIMEOUT_S" ] || die "workers still running after $TIMEOUT_S s; logs in $RUN"
  [ "$left" -gt 0 ] && sleep 1
done
wall=$(($(date +%s) - start))

# --- summary ---------------------------------------------------------------------------
failed=0
{
  printf '%-10s %-6s %-6s %s\n' worker exit steps final_test_accuracy
  for ((i = 0; i < WORKERS; i++)); do
    done_line=$(grep '"event":"done"' "$RUN/worker-$i.jsonl" | tail -n 1 || true)
    steps=$(sed -n 's/.*"steps":\([0-9]*\).*/\1/p' <<<"$done_line")
    acc=$(sed -n 's/.*"final_test_accuracy":\([0-9.e-]*\).*/\1/p' <<<"$done_line")
    printf '%-10s %-6s %-6s %s\n' "worker-$i" "${rc[$i]}" "${steps:--}" "${acc:--}"
    [ "${rc[$i]}" -eq 0 ] || failed=1
  done
  echo "workers: ${wall} s"
} | tee "$RUN/summary.txt"

if [ "$KEEP" = 1 ]; then
  echo "up.sh: shards left running (PS_LOCAL_KEEP_SHARDS=1): deploy/local/down.sh stops them"
else
  trap - EXIT
  # Not in a subshell: only this shell can read its children's exit statuses.
  ps_local_stop "$RUN" "${PS_LOCAL_STOP_TIMEOUT_S:-30}" >"$RUN/stop.txt" || failed=1
  tee -a "$RUN/summary.txt" <"$RUN/stop.txt"
fi
[ "$failed" -eq 0 ] || die "a worker or a shard failed; logs in $RUN"
echo "up.sh: done; logs and summary in $RUN"
