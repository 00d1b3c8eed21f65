#!/usr/bin/env python3
"""Checks a ps-bench --json file (docs/bench.md).

    check_bench_json.py FILE                        # `ps-bench aggregators` rows
    check_bench_json.py --codecs FILE [--expect SPEC;SPEC...] [--data gaussian,real]

Aggregators: a non-empty array of rows with the documented keys and sane values, and
every rule of the build timed at least once.
Codecs: a non-empty array of rows with exactly the keys codec, data, encode_gbps,
decode_gbps, ratio, rel_l2_error, memread_gbps (then apply_gbps, apply_unfused_gbps,
change_gbps in every row or in none: --apply); positive throughputs and ratio, a finite
non-negative error, one memread_gbps for the whole file, no (codec, data) twice, every
expected spec measured on every expected data set, and fp32 (when present) lossless with
a ratio just under 1 (the version byte of each slice).
"""
import argparse
import json
import math

REQUIRED = {"rule": str, "n": int, "f": int, "d": int, "threads": int, "seconds": float,
            "input_gbps": float, "ratio_vs_memread": float}
RULES = {"mean", "median", "trimmed_mean", "meamed", "phocas", "krum", "multi_krum",
         "bulyan", "geometric_median", "centered_clipping", "mda"}
CODEC_KEYS = ["codec", "data", "encode_gbps", "decode_gbps", "ratio", "rel_l2_error",
              "memread_gbps"]
APPLY_KEYS = ["apply_gbps", "apply_unfused_gbps", "change_gbps"]


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_aggregators(path):
    rows = json.load(open(path))
    assert isinstance(rows, list) and rows, "no rows"
    for row in rows:
        for key, kind in REQUIRED.items():
            assert key in row, f"row without {key}: {row}"
            value = row[key]
            if kind is float:
                assert isinstance(value, (int, float)), f"{key} not a number: {row}"
            else:
                assert isinstance(value, kind), f"{key} not {kind.__name__}: {row}"
        assert row["seconds"] > 0 and row["input_gbps"] > 0 and row["ratio_vs_memread"] > 0, row
        assert abs(row["input_gbps"] - row["n"] * row["d"] * 4 / row["seconds"] / 1e9) < \
            1e-3 * row["input_gbps"], f"input_gbps inconsistent: {row}"
    missing = RULES - {r["rule"] for r in rows}
    assert not missing, f"rules never timed: {sorted(missing)}"
    print(f"{path}: {len(rows)} rows, all {len(RULES)} rules timed")


def check_codecs(path, expect, data_sets):
    rows = json.load(open(path))
    assert isinstance(rows, list) and rows, "no rows"
    seen = set()
    memread = None
    keys = CODEC_KEYS + APPLY_KEYS if isinstance(rows[0], dict) and "apply_gbps" in rows[0] \
        else CODEC_KEYS
    for row in rows:
        assert isinstance(row, dict) and list(row) == keys, \
            f"keys must be exactly {keys} in that order: {row}"
        assert isinstance(row["codec"], str) and row["codec"], f"codec not a spec: {row}"
        assert row["data"] in ("gaussian", "real"), f"data not gaussian or real: {row}"
        for key in keys[2:]:
            assert is_number(row[key]), f"{key} not a finite number: {row}"
        for key in ["encode_gbps", "decode_gbps", "ratio", "memread_gbps"] + keys[7:]:
            assert row[key] > 0, f"{key} not positive: {row}"
        assert row["rel_l2_error"] >= 0, f"negative error: {row}"
        if memread is None:
            memread = row["memread_gbps"]
        assert row["memread_gbps"] == memread, f"memread_gbps differs between rows: {row}"
        cell = (row["codec"], row["data"])
        assert cell not in seen, f"measured twice: {cell}"
        seen.add(cell)
        if row["codec"] == "fp32":
            assert row["rel_l2_error"] == 0, f"fp32 is lossless: {row}"
            assert 0.79 < row["ratio"] < 1, f"fp32 ratio is 4n / (4n + slices): {row}"
    missing = [(c, d) for c in expect for d in data_sets if (c, d) not in seen]
    assert not missing, f"never measured: {missing}"
    print(f"{path}: {len(rows)} codec rows ({len({c for c, _ in seen})} specs, data "
          f"{sorted({d for _, d in seen})})")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--codecs", action="store_true", help="check `ps-bench codecs` rows")
    parser.add_argument("--expect", default="", help="';'-separated specs that must have rows")
    parser.add_argument("--data", default="gaussian",
                        help="comma-separated data sets every expected spec must have")
    args = parser.parse_args()
    if args.codecs:
        expect = [s.strip() for s in args.expect.split(";") if s.strip()]
        check_codecs(args.file, expect, [d for d in args.data.split(",") if d])
    else:
        check_aggregators(args.file)


if __name__ == "__main__":
    main()
