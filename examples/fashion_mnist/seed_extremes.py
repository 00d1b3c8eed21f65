#!/usr/bin/env python3
"""Per rule and f of a ps-experiment run (docs/evaluation.md): the lowest final accuracy
any one seed reached under any attack, and the worst case over the attacks when each
run is scored by the mean of its evaluations at step >= FROM (default 700) instead of
its final one (a run that stopped earlier keeps its last evaluation).

Usage: seed_extremes.py OUT_DIR [FROM]   (OUT_DIR holds summary.csv and results.csv)
"""
import csv
import os
import sys
from collections import defaultdict


def main(out, start):
    summary = list(csv.DictReader(open(os.path.join(out, "summary.csv"))))
    lowest = defaultdict(lambda: float("inf"))
    for r in summary:
        if r["attack"] != "none" and r["final_accuracy"]:
            key = (r["rule"], int(r["byzantine"]))
            lowest[key] = min(lowest[key], float(r["final_accuracy"]))
    curves = defaultdict(list)  # (rule, f, attack, seed) -> [(step, accuracy)]
    for r in csv.DictReader(open(os.path.join(out, "results.csv"))):
        curves[(r["rule"], int(r["byzantine"]), r["attack"], r["seed"])].append(
            (int(r["step"]), float(r["test_accuracy"])))
    late = defaultdict(list)  # (rule, f, attack) -> late mean per seed
    for (rule, f, attack, _), points in curves.items():
        points.sort()
        tail = [a for s, a in points if s >= start] or [points[-1][1]]
        late[(rule, f, attack)].append(sum(tail) / len(tail))
    print(f"| rule | f | lowest seed | worst, mean of evaluations at step >= {start} | attack |")
    print("|---|---|---|---|---|")
    for rule, f in sorted(lowest, key=lambda k: (k[0], k[1])):
        worst = min((sum(v) / len(v), attack) for (r, g, attack), v in late.items()
                    if (r, g) == (rule, f) and attack != "none")
        print(f"| `{rule}` | {f} | {lowest[(rule, f)]:.3f} | {worst[0]:.3f} | {worst[1]} |")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 700)
