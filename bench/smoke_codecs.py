#!/usr/bin/env python3
"""ctest bench_codecs_smoke: `ps-bench codecs --quick` on Gaussian data and on a small
gradients file written here, rows checked by check_bench_json.py --codecs, and the
refusals of bad gradients files and of --data real without a file.

    smoke_codecs.py PS_BENCH WORK_DIR
"""
import json
import os
import random
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_bench_json  # noqa: E402

SPECS = ["fp32", "fp16", "bf16"]


def run(args, expect_ok):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    if expect_ok and proc.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    if not expect_ok and proc.returncode == 0:
        sys.exit(f"{' '.join(args)} should have failed:\n{proc.stdout}{proc.stderr}")
    return proc


def refuse(bench, args, message):
    proc = run([bench, "codecs", "--quick"] + args, expect_ok=False)
    if message not in proc.stderr:
        sys.exit(f"ps-bench codecs {' '.join(args)}: expected '{message}' in:\n{proc.stderr}")


def main(bench, work):
    os.makedirs(work, exist_ok=True)
    rng = random.Random(1)
    grads = os.path.join(work, "gradients.f32")
    # Two "steps" of a 30000-value model: mostly small values, some exact zeros.
    values = [0.0 if rng.random() < 0.1 else rng.gauss(0, 1e-3) for _ in range(60000)]
    with open(grads, "wb") as f:
        f.write(struct.pack(f"<{len(values)}f", *values))
    out = os.path.join(work, "codecs_smoke.json")
    # Commas inside the list and ';' both separate specs.
    run([bench, "codecs", "--quick", "--codecs", "fp32,fp16;bf16", "--data", "both",
         "--gradients", grads, "--json", out], expect_ok=True)
    check_bench_json.check_codecs(out, SPECS, ["gaussian", "real"])

    # --apply: a fused codec and one on the default path, with the two apply columns.
    out_apply = os.path.join(work, "codecs_smoke_apply.json")
    run([bench, "codecs", "--quick", "--apply", "--codecs", "3lc;sign", "--json", out_apply],
        expect_ok=True)
    check_bench_json.check_codecs(out_apply, ["3lc", "sign"], ["gaussian"])
    with open(out_apply) as f:
        if "apply_unfused_gbps" not in json.load(f)[0]:
            sys.exit("ps-bench codecs --apply: rows without apply_unfused_gbps")

    odd = os.path.join(work, "odd.f32")
    with open(odd, "wb") as f:
        f.write(b"\0" * 10)
    nan = os.path.join(work, "nan.f32")
    with open(nan, "wb") as f:
        f.write(struct.pack("<3f", 1.0, float("nan"), 2.0))
    refuse(bench, ["--gradients", odd], "not a multiple of 4")
    refuse(bench, ["--gradients", nan], "value 1 (byte offset 4) is not finite")
    refuse(bench, ["--data", "real"], "--dump-gradients FILE")
    refuse(bench, ["--codecs", "fp16;no_such_codec"], "unknown codec 'no_such_codec'")

    # The default list (every ExampleSpecs() entry plus the bench's aggressive settings)
    # on a tiny input: every spec of the build runs through the bench. A default spec may
    # only be skipped because its codec is not in this build, not for bad arguments.
    default_specs = run([bench, "codecs", "--list"], expect_ok=True).stdout.split("\n")
    default_specs = [s for s in default_specs if s]
    out_all = os.path.join(work, "codecs_smoke_all.json")
    proc = run([bench, "codecs", "--quick", "--numel", "2^12", "--slice-elems", "2^10",
                "--json", out_all], expect_ok=True)
    skipped = []
    if "\nskipped" in proc.stdout:
        for line in proc.stdout.split("\nskipped", 1)[1].split("\n")[1:]:
            if not line.startswith("  "):
                break
            spec, why = line.strip().split(": ", 1)
            if not why.startswith("unknown codec"):
                sys.exit(f"default spec {spec} refused by its codec (update kAggressiveSpecs "
                         f"in bench/codecs_bench.cc): {why}")
            skipped.append(spec)
    check_bench_json.check_codecs(out_all, [s for s in default_specs if s not in skipped],
                                  ["gaussian"])
    print("bench_codecs_smoke: rows and refusals as documented")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
