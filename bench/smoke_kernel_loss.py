#!/usr/bin/env python3
"""ctest bench_udp_kernel_loss_smoke: `ps-bench udp --quick --kernel-loss` runs every
transport at no loss and at 10% loss applied by the kernel in a network namespace of the
bench's own, and its JSON rows show the loss where it happened: no packet dropped
without loss, dropped packets on the TCP data plane's row (so the loss reaches TCP, not
only the UDP datagrams), ratios against the data planes at the same loss. Speed is not
asserted here. Exits 77 (ctest: skipped), saying why, where this machine cannot make a
network namespace (not root) or lacks nft (Debian: nftables).

    smoke_kernel_loss.py PS_BENCH WORK_DIR
"""
import json
import math
import os
import subprocess
import sys

SKIP = 77


def main(bench, work):
    if os.geteuid() != 0:
        print("skipped: a network namespace of its own needs root")
        sys.exit(SKIP)
    nft = next((p for p in ("/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft") if os.access(p, os.X_OK)),
               None)
    if nft is None:
        print("skipped: no nft program (Debian: apt-get install nftables)")
        sys.exit(SKIP)
    # A kernel without nf_tables (or a container without CAP_NET_ADMIN) cannot drop.
    probe = subprocess.run(["unshare", "--net", nft, "add", "table", "inet", "ps_probe"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        print(f"skipped: this machine cannot load an nftables rule in a network namespace "
              f"of its own: {probe.stderr.strip()}")
        sys.exit(SKIP)
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, "udp_kernel_loss.json")
    proc = subprocess.run([bench, "udp", "--quick", "--kernel-loss", "--json", out],
                          capture_output=True, text=True, timeout=240)
    if proc.returncode != 0:
        sys.exit(f"ps-bench udp --kernel-loss failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    with open(out) as f:
        data = json.load(f)
    want = [("grpc", 0), ("tcp", 0), ("udp", 0), ("grpc", 0.1), ("tcp", 0.1), ("udp", 0.1)]
    if [(r["transport"], r["loss"]) for r in data] != want:
        sys.exit(f"{out}: want rows {want}, got {data}")
    for i, r in enumerate(data):
        if r.get("loss_at") != "kernel":
            sys.exit(f"{out}: the kernel injects the loss: {r}")
        for key in ("goodput_gbps", "ratio_to_grpc", "ratio_to_tcp", "delivered_fraction"):
            value = r.get(key)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                sys.exit(f"{out}: {key} must be a positive number in {r}")
        group = data[i - i % 3:i - i % 3 + 3]
        for key, base in (("ratio_to_grpc", group[0]), ("ratio_to_tcp", group[1])):
            if abs(r[key] - r["goodput_gbps"] / base["goodput_gbps"]) > 1e-6 * r[key]:
                sys.exit(f"{out}: {key} is not goodput over {base['transport']}'s at the same "
                         f"loss: {r}")
        if not isinstance(r.get("packets_dropped"), int):
            sys.exit(f"{out}: packets_dropped missing: {r}")
    for r in data[:3]:
        if r["packets_dropped"] != 0:
            sys.exit(f"{out}: packets dropped without loss: {r}")
    # About 10% of a few hundred packets (the pulls, the pushes and their answers).
    if data[4]["packets_dropped"] == 0:
        sys.exit(f"{out}: the kernel dropped none of the TCP data plane's packets at 10%: "
                 f"{data[4]}")
    print(proc.stdout, end="")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
