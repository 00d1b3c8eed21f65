#!/usr/bin/env python3
"""ctest bench_transport_smoke: `ps-bench p3 --quick`, `ps-bench udp --quick` and
`ps-bench e2e --quick` run, and their JSON rows carry the documented keys with sane
values (a fifo and a p3 row per bandwidth; a grpc and a tcp row, and a udp row per loss; e2e rows
starting with exactly the documented keys, ratio = goodput / raw, the one-copy
baseline's ratio, the warm-up, pull_codec, also with --pull-codec; several --aggregator rules
with vs_mean against mean of the same run). Speed is not asserted here.

    smoke_transport.py PS_BENCH WORK_DIR
"""
import json
import math
import os
import subprocess
import sys

E2E_KEYS = ["workers", "shards", "model_params", "codec", "goodput_gbps", "raw_tcp_gbps",
            "ratio"]


def run(args):
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")


def rows(path, keys):
    with open(path) as f:
        data = json.load(f)
    if not data:
        sys.exit(f"{path}: no rows")
    for row in data:
        for key in keys:
            if key not in row:
                sys.exit(f"{path}: row {row} lacks '{key}'")
    return data


def positive(row, key):
    value = row[key]
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        sys.exit(f"{key} must be a positive number in {row}")


def main(bench, work):
    os.makedirs(work, exist_ok=True)
    p3 = os.path.join(work, "p3.json")
    run([bench, "p3", "--quick", "--json", p3])
    data = rows(p3, ["mode", "bandwidth_mbps", "iteration_seconds", "first_layer_seconds"])
    if sorted(r["mode"] for r in data) != ["fifo", "p3"]:
        sys.exit(f"{p3}: want one fifo and one p3 row, got {data}")
    for r in data:
        positive(r, "iteration_seconds")
        positive(r, "first_layer_seconds")
    udp = os.path.join(work, "udp.json")
    run([bench, "udp", "--quick", "--json", udp])
    data = rows(udp, ["transport", "loss", "goodput_gbps", "ratio_to_grpc", "ratio_to_tcp",
                      "delivered_fraction"])
    if [(r["transport"], r["loss"]) for r in data] != [("grpc", 0), ("tcp", 0), ("udp", 0),
                                                       ("udp", 0.1)]:
        sys.exit(f"{udp}: unexpected rows {data}")
    for r in data:
        positive(r, "goodput_gbps")
        if r.get("loss_at") != "sender":
            sys.exit(f"without --kernel-loss the sender injects the loss: {r}")
        if not 0 < r["delivered_fraction"] <= 1:
            sys.exit(f"delivered_fraction out of (0, 1] in {r}")
    # Without injected loss only a full kernel receive buffer loses datagrams.
    if data[1]["delivered_fraction"] < 0.9:
        sys.exit(f"too much lost without injected loss on loopback: {data[1]}")
    e2e = os.path.join(work, "e2e.json")
    run([bench, "e2e", "--quick", "--codec", "fp32,int8", "--json", e2e])
    data = rows(e2e, E2E_KEYS)
    if [(r["workers"], r["shards"], r["codec"]) for r in data] != [(2, 2, "fp32"), (2, 2, "int8")]:
        sys.exit(f"{e2e}: unexpected rows {data}")
    for r in data:
        if list(r)[:len(E2E_KEYS)] != E2E_KEYS:
            sys.exit(f"{e2e}: keys must start with {E2E_KEYS}: {r}")
        for key in ("goodput_gbps", "raw_tcp_gbps", "ratio", "model_params"):
            positive(r, key)
        if abs(r["ratio"] - r["goodput_gbps"] / r["raw_tcp_gbps"]) > 1e-6 * r["ratio"]:
            sys.exit(f"ratio is not goodput / raw TCP: {r}")
        if r.get("pull_codec") != "":
            sys.exit(f"{e2e}: dense pulls must say pull_codec \"\": {r}")
        for key in ("round_seconds_p50", "round_seconds_p99", "rss_bytes_per_param",
                    "one_copy_tcp_gbps"):
            positive(r, key)
        if abs(r["one_copy_ratio"] - r["one_copy_tcp_gbps"] / r["raw_tcp_gbps"]) > 1e-6:
            sys.exit(f"one_copy_ratio is not one-copy TCP / raw TCP: {r}")
        if r.get("warmup_rounds") != 2:
            sys.exit(f"{e2e}: want the default of 2 warm-up rounds: {r}")
        if r["round_seconds_p50"] > r["round_seconds_p99"]:
            sys.exit(f"{e2e}: round latency median above its p99: {r}")
    # Several aggregation rules in one run (--aggregator): mean added first as the
    # baseline, each row's vs_mean its goodput over mean's, the rule's f (2 workers: 0),
    # and a rule the worker count cannot hold refused before anything runs.
    rules = os.path.join(work, "e2e_rules.json")
    specs = ["mean", "trimmed_mean", "caf", "clip(0.5)+nnm+trimmed_mean"]
    run([bench, "e2e", "--quick", "--repeats", "2", "--aggregator", ",".join(specs[1:]),
         "--json", rules])
    data = rows(rules, E2E_KEYS + ["aggregator", "num_byzantine", "aggregation_scope", "vs_mean"])
    if [r["aggregator"] for r in data] != specs:
        sys.exit(f"{rules}: want rows for {specs} in that order: {data}")
    for r in data:
        if list(r)[:len(E2E_KEYS)] != E2E_KEYS or r["num_byzantine"] != 0 or \
                r["aggregation_scope"] != "model" or r["repeats"] != 2:
            sys.exit(f"{rules}: unexpected row {r}")
        positive(r, "vs_mean")
        if abs(r["vs_mean"] - r["goodput_gbps"] / data[0]["goodput_gbps"]) > 1e-6 * r["vs_mean"]:
            sys.exit(f"vs_mean is not goodput / mean's goodput: {r}")
    refused = subprocess.run([bench, "e2e", "--quick", "--aggregator", "krum"],
                             capture_output=True, text=True, timeout=60)
    if refused.returncode != 2 or "more --workers" not in refused.stderr:
        sys.exit(f"krum at 2 workers must be refused naming the fix: {refused.returncode} "
                 f"{refused.stderr}")
    # Both data planes (--data-plane): a row per plane and rule, vs_mean within the plane,
    # vs_grpc on the TCP rows only, vs_one_copy the goodput over the one-copy baseline.
    planes = os.path.join(work, "e2e_planes.json")
    run([bench, "e2e", "--quick", "--data-plane", "grpc,tcp", "--aggregator", "median",
         "--json", planes])
    data = rows(planes, E2E_KEYS + ["data_plane", "vs_one_copy", "vs_mean"])
    if [(r["data_plane"], r["aggregator"]) for r in data] != \
            [("grpc", "mean"), ("grpc", "median"), ("tcp", "mean"), ("tcp", "median")]:
        sys.exit(f"{planes}: want mean and median on grpc, then on tcp: {data}")
    for i, r in enumerate(data):
        positive(r, "vs_one_copy")
        if abs(r["vs_one_copy"] - r["goodput_gbps"] / r["one_copy_tcp_gbps"]) > 1e-6:
            sys.exit(f"vs_one_copy is not goodput / one-copy TCP: {r}")
        base = data[0 if i < 2 else 2]
        if abs(r["vs_mean"] - r["goodput_gbps"] / base["goodput_gbps"]) > 1e-6 * r["vs_mean"]:
            sys.exit(f"vs_mean is not goodput / mean's on the same plane: {r}")
        if (r["data_plane"] == "tcp") != ("vs_grpc" in r):
            sys.exit(f"vs_grpc belongs to the tcp rows only: {r}")
        if "vs_grpc" in r and abs(r["vs_grpc"] - r["goodput_gbps"] / data[i - 2]["goodput_gbps"]) > \
                1e-6 * r["vs_grpc"]:
            sys.exit(f"vs_grpc is not goodput / the same rule's over grpc: {r}")
    # Compressed pulls (--pull-codec): the same keys first, the spec at the end.
    pulled = os.path.join(work, "e2e_pull.json")
    run([bench, "e2e", "--quick", "--codec", "3lc(s=1.9)", "--pull-codec", "3lc(s=1.9)",
         "--json", pulled])
    data = rows(pulled, E2E_KEYS)
    for r in data:
        if list(r)[:len(E2E_KEYS)] != E2E_KEYS or r.get("pull_codec") != "3lc(s=1.9)":
            sys.exit(f"{pulled}: unexpected row {r}")
        for key in ("goodput_gbps", "raw_tcp_gbps", "ratio"):
            positive(r, key)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
