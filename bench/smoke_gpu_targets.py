#!/usr/bin/env python3
"""Checks bench/gpu_targets.py on made-up ps-bench rows (no GPU needed):

    smoke_gpu_targets.py SCRATCH_DIR

a target met and one missed are reported as such with status 0; a missing file or a row
without a finite ratio gives status 1 and names the file.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def row(rule, n, ratio):
    return {"rule": rule, "device": "test device", "n": n, "f": 3, "d": 1 << 24, "seconds": 0.01,
            "input_gbps": 100.0 * ratio, "copy_gbps": 100.0, "ratio_vs_copy": ratio}


def write(directory, name, rows):
    with open(os.path.join(directory, name), "w") as f:
        json.dump(rows, f)


def run(directory):
    p = subprocess.run([sys.executable, os.path.join(HERE, "gpu_targets.py"), directory],
                       capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def main():
    scratch = sys.argv[1]
    os.makedirs(scratch, exist_ok=True)
    write(scratch, "aggregators_n16.json", [row("median", 16, 0.31), row("trimmed_mean", 16, 0.29)])
    write(scratch, "aggregators_n64.json", [row("krum", 64, 0.25)])
    write(scratch, "codecs.json", [{"codec": "fp16", "device": "test device", "encode_gbps": 10.0,
                                    "copy_gbps": 100.0, "to_host_gbps": 20.0,
                                    "floor_share": 0.25, "ratio": 2.0}])
    rc, out = run(scratch)
    assert rc == 0, out
    assert "| median | 16 | 3 | 16777216 | 31.0 | 100.0 | 0.310 | >= 0.3: met |" in out, out
    assert "| krum | 64 | 3 | 16777216 | 25.0 | 100.0 | 0.250 | >= 0.2: met |" in out, out
    assert "target missed: trimmed_mean n=16: 0.290 < 0.3" in out, out
    assert "| fp16 | 2 | 10.0 | 100.0 | 0.100 | 20.0 | 0.250 |" in out, out
    assert "every throughput target met" not in out, out

    write(scratch, "aggregators_n16.json", [row("median", 16, 0.31), row("trimmed_mean", 16, 0.3)])
    rc, out = run(scratch)
    assert rc == 0 and "every throughput target met" in out, out

    bad = row("krum", 64, 0.25)
    bad["ratio_vs_copy"] = None
    write(scratch, "aggregators_n64.json", [bad])
    rc, out = run(scratch)
    assert rc == 1 and "aggregators_n64.json: row without a finite ratio_vs_copy" in out, out

    os.remove(os.path.join(scratch, "codecs.json"))
    rc, out = run(scratch)
    assert rc == 1 and "codecs.json" in out, out
    print("gpu_targets.py: 4 cases passed")


if __name__ == "__main__":
    main()
