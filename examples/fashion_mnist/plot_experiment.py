#!/usr/bin/env python3
"""Plots of a ps-experiment run (docs/evaluation.md).

Usage: plot_experiment.py OUT_DIR

Reads OUT_DIR/results.csv and OUT_DIR/summary.csv and writes
- accuracy-f<F>-<split>-<codec>.png: test accuracy per step, one panel per rule (and
  worker momentum), one line per attack plus the no-attack baseline (mean over seeds);
- worst-case-<split>.png, one per split: a heatmap of the final accuracy without attack
  and of the worst final accuracy over the attacks (means over seeds), per rule (rows,
  with worker momentum and lr schedule where they vary) and f (columns: no attack and
  worst for each f, or one no-attack column when the baseline is f = 0);
- time-to-accuracy-<B>mbps.png (from OUT_DIR/runs.json, one per link bandwidth, 0 =
  unshaped): test accuracy against training seconds, one line per strategy (and rule,
  attack), the target accuracy dashed (docs/adaptive.md).
"""
import csv
import json
import os
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def wm_tag(wm, all_wms):
    """' (wm 0.9)' after a rule's name: where workers use momentum, or the grid mixes values."""
    return f" (wm {wm})" if float(wm) > 0 or len(all_wms) > 1 else ""


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def safe(text):
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)


def label_of(r):
    """The rule, with the lr schedule when it is not constant."""
    schedule = r.get("lr_schedule") or "constant"
    return r["rule"] + ("" if schedule == "constant" else f" [lr {schedule}]")


def main(out):
    results = read(os.path.join(out, "results.csv"))
    summary = read(os.path.join(out, "summary.csv"))

    # (rule, wm, split, codec, f, attack) -> step -> [accuracy over seeds]
    curves = defaultdict(lambda: defaultdict(list))
    for r in results:
        codec = r["codec"] + (f' @ {r["bandwidth_mbps"]} Mbit/s' if float(r.get("bandwidth_mbps") or 0) > 0 else "")
        key = (label_of(r), r["worker_momentum"], r["split"], codec, int(r["byzantine"]), r["attack"])
        curves[key][int(r["step"])].append(float(r["test_accuracy"]))
    rows = sorted({(k[0], k[1]) for k in curves})
    groups = sorted({(k[4], k[2], k[3]) for k in curves if k[4] > 0})
    for f, split, codec in groups:
        fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.6), squeeze=False, sharey=True)
        for ax, (rule, wm) in zip(axes[0], rows):
            for key, points in sorted(curves.items()):
                if (key[0], key[1], key[2], key[3]) != (rule, wm, split, codec):
                    continue
                if key[4] != f and key[5] != "none":
                    continue
                steps = sorted(points)
                acc = [sum(points[s]) / len(points[s]) for s in steps]
                style = "k--" if key[5] == "none" else "-"
                ax.plot(steps, acc, style, label="no attack" if key[5] == "none" else key[5])
            ax.set_title(rule + wm_tag(wm, {w for _, w in rows}), fontsize=8)
            ax.set_xlabel("step")
            ax.set_ylim(0, 1)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel("test accuracy")
        axes[0][-1].legend(fontsize=7, loc="lower right")
        fig.suptitle(f"f = {f}, split {split}, codec {codec}", fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"accuracy-f{f}-{safe(split)}-{safe(codec)}.png"), dpi=110)
        plt.close(fig)

    # Worst final accuracy over the attacks per (rule, wm) and f > 0 (mean over seeds
    # first), after a "no attack" column (attack none at any f; f = 0 when listed); one
    # heatmap per split.
    finals = defaultdict(list)
    seeds = defaultdict(set)  # split -> seeds
    for r in summary:
        acc = float(r["final_accuracy"]) if r["final_accuracy"] else 0.0
        finals[(label_of(r), r["worker_momentum"], r["split"], int(r["byzantine"]), r["attack"])].append(acc)
        seeds[r["split"]].add(r["seed"])
    means = {k: sum(v) / len(v) for k, v in finals.items()}
    for split in sorted({k[2] for k in means}):
        worst_case_heatmap(out, split, len(seeds[split]),
                           {(k[0], k[1], k[3], k[4]): v for k, v in means.items() if k[2] == split})
    time_to_accuracy(out)


def worst_case_heatmap(out, split, seeds, means):
    fs = sorted({k[2] for k in means if k[2] > 0})
    labels = sorted({(k[0], k[1]) for k in means})
    # The rule configured for f with every worker honest, per f when the grid has it
    # (attack "none" at f > 0), else one baseline column (f = 0).
    per_f_baseline = any(k[2] > 0 and k[3] == "none" for k in means)

    def value(rule, wm, f, none):
        vals = [v for k, v in means.items()
                if (k[0], k[1]) == (rule, wm) and (k[3] == "none") == none and (f is None or k[2] == f)]
        return min(vals) if vals else float("nan")

    grid = []
    for rule, wm in labels:
        row = [] if per_f_baseline else [value(rule, wm, None, True)]
        for f in fs:
            if per_f_baseline:
                row.append(value(rule, wm, f, True))
            row.append(value(rule, wm, f, False))
        grid.append(row)
    columns = [] if per_f_baseline else ["no attack"]
    for f in fs:
        columns += ([f"no attack, f = {f}"] if per_f_baseline else []) + [f"worst, f = {f}"]
    names = [r + wm_tag(wm, {w for _, w in labels}) for r, wm in labels]
    fig, ax = plt.subplots(figsize=(3.5 + 0.07 * max(len(n) for n in names) + 1.3 * len(columns),
                                    1.2 + 0.45 * len(labels)))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(columns)), columns, fontsize=8)
    ax.set_yticks(range(len(labels)), names, fontsize=8)
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.3f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=8)
    fig.colorbar(image, ax=ax, label="final test accuracy")
    over = f", mean over {seeds} seeds" if seeds > 1 else ""
    ax.set_title(f"worst-case accuracy over the attacks, split {split}{over}", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(out, f"worst-case-{safe(split)}.png"), dpi=110)
    plt.close(fig)


def time_to_accuracy(out):
    path = os.path.join(out, "runs.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        runs = [r for r in json.load(f) if r["curve"]]
    rules = {r["rule"] for r in runs}
    attacks = {r["attack"] for r in runs}
    for bandwidth in sorted({r["bandwidth_mbps"] for r in runs}):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        target = None
        for r in sorted((r for r in runs if r["bandwidth_mbps"] == bandwidth), key=lambda r: r["strategy"]):
            label = r["strategy"] + (f' | pull {r["pull_codec"]}' if r.get("pull_codec") else "")
            if len(rules) > 1:
                label += f' / {r["rule"]}'
            if len(attacks) > 1:
                label += f' / {r["attack"]}'
            if r["seed"] != 1:
                label += f' (seed {r["seed"]})'
            ax.plot([p[0] for p in r["curve"]], [p[2] for p in r["curve"]], "-o", markersize=2.5, label=label)
            target = r["target_accuracy"] or target
        if target:
            ax.axhline(target, color="k", linestyle="--", linewidth=0.8, label=f"target {target}")
        link = f"{bandwidth:g} Mbit/s" if bandwidth > 0 else "unshaped"
        ax.set_title(f"time to accuracy, {link}", fontsize=9)
        ax.set_xlabel("training seconds (evaluations excluded)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        fig.savefig(os.path.join(out, f"time-to-accuracy-{bandwidth:g}mbps.png"), dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
