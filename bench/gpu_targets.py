#!/usr/bin/env python3
"""Reports bench/gpu_check.sh's figures against the GPU throughput targets (docs/gpu.md).

    gpu_targets.py OUT_DIR

Reads OUT_DIR/aggregators_n16.json, aggregators_n64.json and codecs.json (ps-bench
--json rows) and prints one Markdown table per file, ready for docs/gpu.md, with each
row's ratio to the device-to-device copy measured in the same run and, where there is
one, the target and whether it was met:

    median and trimmed mean at n = 16:  >= 0.3 of copy bandwidth
    Krum at n = 64, d = 2^24:           >= 0.2

Exit status 0 when every file was read (a missed target is printed, not an error), 1
when one is missing or malformed.
"""
import json
import math
import os
import sys

# (rule name before any "(", n) -> minimum ratio to the copy.
TARGETS = {("median", 16): 0.3, ("trimmed_mean", 16): 0.3, ("krum", 64): 0.2}


def load(path):
    rows = json.load(open(path))
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: no rows")
    return rows


def number(row, key):
    value = row.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"row without a finite {key}: {row}")
    return float(value)


def aggregator_table(rows):
    lines = ["| rule | n | f | d | input GB/s | copy GB/s | ratio | target |",
             "|---|---|---|---|---|---|---|---|"]
    missed = []
    for row in rows:
        rule, n = str(row["rule"]), int(number(row, "n"))
        ratio = number(row, "ratio_vs_copy")
        target = TARGETS.get((rule.split("(")[0], n))
        verdict = "" if target is None else (f">= {target}: met" if ratio >= target
                                             else f">= {target}: MISSED")
        if target is not None and ratio < target:
            missed.append(f"{rule} n={n}: {ratio:.3f} < {target}")
        lines.append(f"| {rule} | {n} | {int(number(row, 'f'))} | {int(number(row, 'd'))} | "
                     f"{number(row, 'input_gbps'):.1f} | {number(row, 'copy_gbps'):.1f} | "
                     f"{ratio:.3f} | {verdict} |")
    return lines, missed


def codec_table(rows):
    lines = ["| codec | compression | encode GB/s | copy GB/s | encode / copy | payload to host GB/s "
             "| floor / encode |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        encode, copy = number(row, "encode_gbps"), number(row, "copy_gbps")
        lines.append(f"| {row['codec']} | {number(row, 'ratio'):.4g} | {encode:.1f} | {copy:.1f} | "
                     f"{encode / copy:.3f} | {number(row, 'to_host_gbps'):.1f} | "
                     f"{number(row, 'floor_share'):.3f} |")
    return lines


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 1
    out = sys.argv[1]
    missed, device, ok = [], None, True
    for name in ("aggregators_n16.json", "aggregators_n64.json", "codecs.json"):
        path = os.path.join(out, name)
        try:
            rows = load(path)
            device = device or rows[0].get("device")
            if name.startswith("aggregators"):
                lines, file_missed = aggregator_table(rows)
                missed += file_missed
            else:
                lines = codec_table(rows)
        except (OSError, ValueError, KeyError) as e:
            print(f"gpu_targets: {path}: {e}", file=sys.stderr)
            ok = False
            continue
        print(f"\n{name}:\n" + "\n".join(lines))
    if device:
        print(f"\ndevice: {device}")
    for line in missed:
        print(f"target missed: {line}")
    if ok and not missed:
        print("every throughput target met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
