#!/usr/bin/env bash
# The Python example against ps-demo, the same scenario on the same seeds
# (docs/python.md, "The example"): 2 shards, 6 workers, 1 sign-flip attacker, the
# trimmed mean, 2000 steps. For each seed both trainers run in turn; one JSON line per
# seed goes to stdout: {"seed": S, "cpp_ps_demo": ACC, "python_example": ACC}.
#
#   bash bench/python_example_accuracy.sh 9 10 11 12 > accuracy.jsonl
#
# Needs the build tree (build/bin/ps-demo, build/bin/ps-launch, build/python) and
# Debian's python3 with torch (bash run.sh test installs both). About 3 minutes a seed
# on 2 cores.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${PS_BUILD_DIR:-$ROOT/build}
[ $# -ge 1 ] || { echo "usage: $0 SEED..." >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for seed in "$@"; do
  "$BUILD/bin/ps-demo" --rules trimmed_mean --seed "$seed" --out "$work/demo-$seed" \
    > "$work/demo-$seed.log" 2>&1 || { echo "ps-demo seed $seed failed: $work/demo-$seed.log" >&2; exit 1; }
  cpp=$(/usr/bin/python3 -c '
import json, sys
rows = json.load(open(sys.argv[1]))
print(next(r["final_test_accuracy"] for r in rows if r["aggregator"] == "trimmed_mean"))
' "$work/demo-$seed/summary.json")
  py=$("$BUILD/bin/ps-launch" --shards 2 --workers 6 --byzantine 1 --aggregator trimmed_mean \
         --lr 0.05 --momentum 0.9 "$ROOT/examples/python/train_fashion_mnist.py" \
         --byzantine 1 --seed "$seed" 2> "$work/python-$seed.log" | tail -1 |
       /usr/bin/python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["final_test_accuracy"])')
  echo "{\"seed\": $seed, \"cpp_ps_demo\": $cpp, \"python_example\": $py}"
done
