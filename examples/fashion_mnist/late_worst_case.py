#!/usr/bin/env python3
"""Per rule, setting and f of a ps-experiment run (docs/evaluation.md): the worst case
over the attacks when each run is scored by the mean of its evaluations at step >= FROM
(default 700) instead of its final one (a run that stopped earlier keeps its last
evaluation), the seeds averaged as in table.md, beside the no-attack run scored the same
way. It checks that a ranking does not hang on the last evaluation; table.md has the
final-accuracy figures, the lowest seed among them.

Usage: late_worst_case.py OUT_DIR [FROM]   (OUT_DIR holds results.csv)
"""
import csv
import os
import sys
from collections import defaultdict

# What a table.md row holds fixed besides the rule.
SETTING = ("split", "codec", "bandwidth_mbps", "worker_momentum", "lr_schedule")


def mean(values):
    return sum(values) / len(values)


def main(out, start):
    curves = defaultdict(list)  # (rule, setting, f, attack, seed) -> [(step, accuracy)]
    for r in csv.DictReader(open(os.path.join(out, "results.csv"))):
        key = (r["rule"], tuple(r[k] for k in SETTING), int(r["byzantine"]), r["attack"], r["seed"])
        curves[key].append((int(r["step"]), float(r["test_accuracy"])))
    late = defaultdict(list)  # (rule, setting, f, attack) -> late mean per seed
    for (rule, setting, f, attack, _), points in curves.items():
        points.sort()
        tail = [a for s, a in points if s >= start] or [points[-1][1]]
        late[(rule, setting, f, attack)].append(mean(tail))
    settings = {k[1] for k in late}
    varies = len(settings) > 1  # a setting column only where the run has several
    print(f"Each run scored by the mean of its evaluations at step >= {start}:\n")
    print("| rule | " + ("setting | " if varies else "") + "f | no attack | worst | attack |")
    print("|---|" + ("---|" if varies else "") + "---|---|---|---|")
    for rule, setting, f in sorted({k[:3] for k in late if k[2] > 0 and k[3] != "none"}):
        worst = min((mean(v), k[3]) for k, v in late.items()
                    if k[:3] == (rule, setting, f) and k[3] != "none")
        # The no-attack run at f, else the f = 0 baseline (as table.md).
        base = late.get((rule, setting, f, "none")) or late.get((rule, setting, 0, "none"))
        columns = [f"`{rule}`"] + ([", ".join(setting)] if varies else []) + [
            str(f), f"{mean(base):.3f}" if base else "-", f"{worst[0]:.3f}", worst[1]]
        print("| " + " | ".join(columns) + " |")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 700)
