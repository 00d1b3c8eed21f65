#!/usr/bin/python3
"""Push + pull goodput of a Python worker (ps_server.Worker) against the C++ worker
(ps-bench e2e) on the same workload and the same kind of shards, in one run.

Each measurement starts fresh ps-server processes (insecure, loopback, --workers 1, the
mean and SGD with lr 1e-6) and runs `ps-bench e2e`'s round: pull the whole model of
version r, push a gradient of the whole model for round r, wait for the answer. The C++
worker runs as `ps-bench e2e --shards-at ...`; the Python one from this script, with
numpy arrays and with CPU torch tensors. Goodput = (4 B pushed + 4 B pulled) x params x
rounds / seconds; the best of --repeats per client counts (the machine is shared).

    python3 bench/python_e2e.py                        # 2^22 parameters, 1 shard, 20 rounds
    python3 bench/python_e2e.py --params 2^20 --shards 2 --repeats 5
    python3 bench/python_e2e.py --borrow               # every client's pushes borrowed

docs/python.md, "Speed". Needs the Python package built (build/python) and ps-bench.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_size(text):
    if "^" in text:
        a, b = text.split("^")
        return int(a) ** int(b)
    return int(text)


def shards_for(launch, count, log_dir):
    return launch.Shards(count, 1, aggregator="mean", lr=1e-6, momentum=0.0, insecure=True,
                         server_args=["--round-deadline-ms", "60000", "--log-level", "warn"],
                         log_dir=log_dir)


def run_cpp(args, addresses):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        cmd = [args.bench, "e2e", "--shards-at", ",".join(addresses), "--workers", "1",
               "--params", str(args.params), "--rounds", str(args.rounds), "--warmup",
               str(args.warmup), "--no-raw", "--json", out.name] + (["--borrow"] if args.borrow else [])
        done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
        row = json.load(open(out.name))[0]
    return row["goodput_gbps"]


def run_python(args, addresses, kind):
    import numpy as np

    import ps_server

    values = np.full(args.params, 0.01, dtype=np.float32)
    grad = np.random.default_rng(1).normal(size=args.params).astype(np.float32)
    params = np.empty(args.params, dtype=np.float32)
    if kind == "torch":
        import torch

        values, grad, params = (torch.from_numpy(a) for a in (values, grad, params))
    w = ps_server.Worker(addresses, 0, [("w", args.params)], initial=[values],
                         rpc_timeout=120, connect_timeout=60, borrow=args.borrow)

    def round(r):
        w.pull_all(r, [params], timeout=120)
        w.push(0, r, grad)
        w.wait_pushes()

    for r in range(args.warmup):
        round(r)
    start = time.perf_counter()
    for r in range(args.warmup, args.warmup + args.rounds):
        round(r)
    seconds = time.perf_counter() - start
    w.close()
    return 8.0 * args.params * args.rounds * 8 / 1e9 / seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=parse_size, default=1 << 22)
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bench", default=os.path.join(REPO, "build", "bin", "ps-bench"))
    parser.add_argument("--python-path", default=os.path.join(REPO, "build", "python"))
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    parser.add_argument("--borrow", action="store_true",
                        help="borrowed pushes in every client (ps-bench e2e --borrow, "
                             "Worker(borrow=True)): sent from the gradient's array, not a copy")
    args = parser.parse_args()
    sys.path.insert(0, args.python_path)
    from ps_server import launch

    best = {"C++ (ps-bench e2e)": 0.0, "Python, numpy": 0.0, "Python, torch": 0.0}
    with tempfile.TemporaryDirectory(prefix="python_e2e.") as logs:
        for repeat in range(args.repeats):
            for client in best:  # interleaved, so drifts of the machine hit all three
                with shards_for(launch, args.shards, logs) as shards:
                    if client.startswith("C++"):
                        gbps = run_cpp(args, shards.addresses)
                    else:
                        gbps = run_python(args, shards.addresses, client.split(", ")[1])
                print(f"repeat {repeat + 1}: {client}: {gbps:.3f} Gbit/s", file=sys.stderr)
                best[client] = max(best[client], gbps)
    cpp = best["C++ (ps-bench e2e)"]
    print(f"{args.params} parameters, {args.shards} shard(s), {args.rounds} rounds after "
          f"{args.warmup}, best of {args.repeats}{', borrowed pushes' if args.borrow else ''}")
    for client, gbps in best.items():
        print(f"  {client:20s} {gbps:7.3f} Gbit/s   {gbps / cpp:5.3f} of C++")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"params": args.params, "shards": args.shards, "rounds": args.rounds,
                       "borrow": args.borrow,
                       "goodput_gbps": best,
                       "ratio_to_cpp": {k: v / cpp for k, v in best.items()}}, fh, indent=1)


if __name__ == "__main__":
    main()
