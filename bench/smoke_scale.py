#!/usr/bin/env python3
"""ctest bench_scale_smoke: `scale_grid.py --quick` runs its 2 x 2 grid (one ps-bench
process per cell) and writes one row per cell with the scale keys, sane values, and,
where matplotlib is installed, both plots. Speed is not asserted here.

    smoke_scale.py PS_BENCH WORK_DIR
"""
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main(bench, work):
    proc = subprocess.run([sys.executable, os.path.join(HERE, "scale_grid.py"), "--bench", bench,
                           "--out", work, "--quick"], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"scale_grid.py --quick failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    with open(os.path.join(work, "scale.json")) as f:
        rows = json.load(f)
    cells = sorted((r["workers"], r["shards"]) for r in rows)
    if cells != [(1, 1), (1, 2), (2, 1), (2, 2)]:
        sys.exit(f"want the cells 1-2 workers x 1-2 shards, got {cells}")
    for r in rows:
        for key in ("ratio", "round_seconds_p50", "round_seconds_p99", "rss_bytes_per_param"):
            v = r.get(key)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
                sys.exit(f"{key} must be a positive number in {r}")
        if r["round_seconds_p50"] > r["round_seconds_p99"]:
            sys.exit(f"median round above its p99: {r}")
        if r["model_params"] != 2 ** 14:
            sys.exit(f"quick cells have 2^14 parameters: {r}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    for name in ("scale-ratio.png", "scale-memory.png"):
        path = os.path.join(work, name)
        with open(path, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                sys.exit(f"{path} is not a PNG")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
