# shellcheck shell=bash
# Shared by up.sh and down.sh (sourced): stops the processes of a run with SIGTERM.
# Exit statuses are known only in the shell that started the processes (up.sh); from
# another shell (down.sh) a process that exited on time is reported as "stopped".

# ps_local_stop RUN_DIR TIMEOUT_S: SIGTERM to the workers, then to the shards (which
# drain and, with checkpoints on, write a final one); SIGKILL after TIMEOUT_S. Prints
# one line per process; returns 1 if one was killed or exited non-zero.
ps_local_stop() {
  local run=$1 timeout_s=$2 status=0 role name pid t alive k code
  local -a names pids
  [ -f "$run/pids" ] || return 0
  # Workers before shards: a shard stopping under a live worker only makes it retry.
  for role in worker shard; do
    names=() pids=()
    while read -r name pid; do
      [[ $name == "$role"-* ]] || continue
      if ps_local_ours "$pid"; then
        kill -TERM "$pid" 2>/dev/null && { names+=("$name"); pids+=("$pid"); }
      fi
    done <"$run/pids"
    [ ${#pids[@]} -gt 0 ] || continue
    for ((t = 0; t < timeout_s * 10; t++)); do
      alive=0
      for pid in "${pids[@]}"; do ps_local_ours "$pid" && alive=1; done
      [ "$alive" -eq 0 ] && break
      sleep 0.1
    done
    for k in "${!pids[@]}"; do
      pid=${pids[$k]}
      if ps_local_ours "$pid"; then
        kill -KILL "$pid" 2>/dev/null || true
        echo "${names[$k]}: still running ${timeout_s} s after SIGTERM, killed"
        status=1
        continue
      fi
      code=0
      wait "$pid" 2>/dev/null || code=$?
      if [ "$code" -eq 127 ]; then
        echo "${names[$k]}: stopped"
      else
        echo "${names[$k]}: exit $code after SIGTERM"
        [ "$code" -eq 0 ] || status=1
      fi
    done
  done
  return "$status"
}

# A pid recorded by up.sh is ours only while it runs one of our binaries (pids are
# reused once a process is gone; a zombie has no exe and counts as gone).
ps_local_ours() {
  local exe
  exe=$(readlink "/proc/$1/exe" 2>/dev/null) || return 1
  case ${exe##*/} in ps-server|ps-fashion-mnist) return 0 ;; *) return 1 ;; esac
}
