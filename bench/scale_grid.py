#!/usr/bin/env python3
"""The scale grid of `ps-bench e2e` (docs/bench.md, "Scale"): workers x shards x
parameters, one ps-bench process per cell (so that each cell's resident memory is its
own), each against raw loopback TCP in the same process. Writes every row to one JSON
array and, when matplotlib is installed, two PNG plots against the worker count: the
goodput ratio to raw TCP (dashed: the one-copy-per-side TCP baseline of the same run,
the ceiling of the ratio), and the process's resident bytes per parameter.

    scale_grid.py --bench build/bin/ps-bench --out DIR [--workers 1,4,16,32]
                  [--shards 1,2,4] [--params 2^20,2^22,2^24] [--codec fp32]
                  [--pull-codec SPEC] [--quick]

Rounds per cell: enough to move about 2 GB of pushes and pulls, between 2 and 10.
A cell that fails or passes its time limit is reported and skipped; the exit code is 1
if any did.
"""
import argparse
import json
import os
import subprocess
import sys


def parse_size(text):
    text = text.strip()
    if text.startswith("2^"):
        return 2 ** int(text[2:])
    return int(text)


def rounds_for(workers, params):
    moved = workers * params * 8  # bytes per round, pushes and pulls
    return max(2, min(10, int(2e9 // moved)))


def run_cell(bench, out, workers, shards, params, codec, pull_codec, timeout):
    path = os.path.join(out, f"cell-w{workers}-s{shards}-p{params}.json")
    args = [bench, "e2e", "--workers", str(workers), "--shards", str(shards),
            "--params", str(params), "--codec", codec,
            "--rounds", str(rounds_for(workers, params)), "--json", path]
    if pull_codec:
        args += ["--pull-codec", pull_codec]
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout} s"
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"
    with open(path) as f:
        rows = json.load(f)
    os.remove(path)
    return rows, None


def plot(rows, out):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("scale_grid: matplotlib is not installed (python3-matplotlib); no plots",
              file=sys.stderr)
        return []
    made = []
    for key, label, name in (("ratio", "goodput / raw loopback TCP", "scale-ratio.png"),
                             ("rss_bytes_per_param", "process resident bytes per parameter",
                              "scale-memory.png")):
        params_list = sorted({r["model_params"] for r in rows})
        fig, axes = plt.subplots(1, len(params_list), figsize=(4.2 * len(params_list), 3.6),
                                 squeeze=False, sharey=(key == "ratio"))
        for ax, params in zip(axes[0], params_list):
            for shards in sorted({r["shards"] for r in rows}):
                pts = sorted((r["workers"], r[key]) for r in rows
                             if r["model_params"] == params and r["shards"] == shards)
                if pts:
                    line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                                   label=f"{shards} shard{'s' if shards > 1 else ''}")[0]
                # The ceiling of any design with one user-space copy per side (the
                # one-copy TCP baseline of the same run), dashed in the same colour.
                ceiling = sorted((r["workers"], r["one_copy_ratio"]) for r in rows
                                 if key == "ratio" and "one_copy_ratio" in r
                                 and r["model_params"] == params and r["shards"] == shards)
                if pts and ceiling:
                    ax.plot([p[0] for p in ceiling], [p[1] for p in ceiling], linestyle="--",
                            color=line.get_color(), alpha=0.6)
            if key == "ratio":
                ax.set_xscale("log", base=2)
            else:  # linear, so that memory linear in n shows as a line
                ax.set_ylim(bottom=0)
            ax.set_xlabel("workers")
            ax.set_title(f"2^{params.bit_length() - 1} parameters")
            ax.grid(True, alpha=0.3)
        axes[0][0].set_ylabel(label)
        if key == "ratio" and any("one_copy_ratio" in r for r in rows):
            axes[0][0].plot([], [], linestyle="--", color="gray", label="one copy per side")
        axes[0][0].legend()
        fig.tight_layout()
        path = os.path.join(out, name)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)
    return made


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="the ps-bench binary")
    ap.add_argument("--out", required=True, help="directory for scale.json and the plots")
    ap.add_argument("--workers", default="1,4,16,32")
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--params", default="2^20,2^22,2^24")
    ap.add_argument("--codec", default="fp32")
    ap.add_argument("--pull-codec", default="")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    ap.add_argument("--quick", action="store_true", help="a tiny grid, for smoke tests")
    ap.add_argument("--plot-only", action="store_true",
                    help="only draw the plots of the scale.json already in --out")
    a = ap.parse_args()
    if a.quick:
        a.workers, a.shards, a.params = "1,2", "1,2", "2^14"
    workers = [int(x) for x in a.workers.split(",")]
    shards = [int(x) for x in a.shards.split(",")]
    params = [parse_size(x) for x in a.params.split(",")]
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "scale.json")
    if a.plot_only:
        with open(path) as f:
            for made in plot(json.load(f), a.out):
                print(f"scale_grid: wrote {made}")
        return 0
    rows, failed = [], 0
    for p in params:
        for s in shards:
            for w in workers:
                cell, error = run_cell(a.bench, a.out, w, s, p, a.codec, a.pull_codec, a.timeout)
                if error:
                    failed += 1
                    print(f"scale_grid: {w} workers x {s} shards, {p} parameters: {error}",
                          file=sys.stderr)
                    continue
                rows.extend(cell)
                r = cell[0]
                print(f"{w:3d} workers x {s} shards, 2^{p.bit_length() - 1}: ratio {r['ratio']:.3f}, "
                      f"round p50 {r['round_seconds_p50']:.3f} s p99 {r['round_seconds_p99']:.3f} s, "
                      f"{r['rss_bytes_per_param']:.0f} B/param", flush=True)
                # After every cell: an interrupted grid keeps what it measured.
                with open(path, "w") as f:
                    json.dump(rows, f, indent=1)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print(f"scale_grid: {len(rows)} cells in {path}")
    for made in plot(rows, a.out):
        print(f"scale_grid: wrote {made}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
