#!/usr/bin/env python3
"""Per rule and f of a ps-experiment run (docs/evaluation.md): the worst case over the
attacks when each run is scored by the mean of its evaluations at step >= FROM (default
700) instead of its final one (a run that stopped earlier keeps its last evaluation), the
seeds averaged as in table.md, beside the no-attack run scored the same way. It checks that a ranking does not hang on the last
evaluation; table.md has the final-accuracy figures, the lowest seed among them.

Usage: late_worst_case.py OUT_DIR [FROM]   (OUT_DIR holds results.csv)
"""
import csv
import os
import sys
from collections import defaultdict


def main(out, start):
    curves = defaultdict(list)  # (rule, f, attack, seed) -> [(step, accuracy)]
    for r in csv.DictReader(open(os.path.join(out, "results.csv"))):
        curves[(r["rule"], int(r["byzantine"]), r["attack"], r["seed"])].append(
            (int(r["step"]), float(r["test_accuracy"])))
    late = defaultdict(list)  # (rule, f, attack) -> late mean per seed
    for (rule, f, attack, _), points in curves.items():
        points.sort()
        tail = [a for s, a in points if s >= start] or [points[-1][1]]
        late[(rule, f, attack)].append(sum(tail) / len(tail))
    def mean(v):
        return sum(v) / len(v)

    print(f"Each run scored by the mean of its evaluations at step >= {start}:\n")
    print("| rule | f | no attack | worst | attack |")
    print("|---|---|---|---|---|")
    for rule, f in sorted({(r, g) for (r, g, a) in late if g > 0 and a != "none"}):
        worst = min((mean(v), attack) for (r, g, attack), v in late.items()
                    if (r, g) == (rule, f) and attack != "none")
        # The no-attack run at f, else the f = 0 baseline (as table.md).
        base = late.get((rule, f, "none")) or late.get((rule, 0, "none"))
        base_text = f"{mean(base):.3f}" if base else "-"
        print(f"| `{rule}` | {f} | {base_text} | {worst[0]:.3f} | {worst[1]} |")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 700)
