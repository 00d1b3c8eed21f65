#!/usr/bin/env python3
"""Times the aggregation rules written the straightforward way in PyTorch against ours.

For each rule, the PyTorch version runs on the same inputs as `ps-bench aggregators`
(the script rebuilds ps-bench's seeded generator bit for bit), with the same n, f and d,
on one thread by default. Ours are timed by running
`ps-bench aggregators --rules ... --n N --d D --threads T --json ...`, which also dumps
each rule's output so the two results can be compared. See docs/bench.md.

With the Python package built (build/python, docs/python.md), each rule is also timed
as ps_server.aggregators called from this script on the same numpy array (the column
"python s"), and its output compared bit for bit with ps-bench's.

Needs Debian's python3-torch (and python3-numpy, which it pulls in).

    python3 bench/compare_torch.py                      # n = 16, d = 2^20, 1 thread
    python3 bench/compare_torch.py --n 32 --d 2^22 --rules krum,bulyan
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MASK64 = (1 << 64) - 1

# ---- ps-bench's input generator (bench/bench_util.cc), bit for bit ----------------


def splitmix64_scalar(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def splitmix64(x):
    """Vectorized over a uint64 array; numpy's uint64 arithmetic wraps like C's."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


GAUSSIAN_SCALE = np.float32(1.7320508075688772 / 65536.0)


def gaussian(seed, stream, d):
    base = splitmix64_scalar((splitmix64_scalar(seed) + stream) & MASK64)
    with np.errstate(over="ignore"):
        r = splitmix64(np.arange(d, dtype=np.uint64) + np.uint64(base))
    m = np.uint64(0xFFFF)
    s = (r & m) + ((r >> np.uint64(16)) & m) + ((r >> np.uint64(32)) & m) + (r >> np.uint64(48))
    return (s.astype(np.int64) - 131070).astype(np.float32) * GAUSSIAN_SCALE


def make_inputs(seed, n, d):
    """n x d float32: honest rows c + 0.5 g_i, the last max(1, n / 8) rows -4 c + 8 g_i."""
    c = gaussian(seed, 0, d)
    first_outlier = n - max(1, n // 8)
    x = np.empty((n, d), dtype=np.float32)
    for i in range(n):
        g = gaussian(seed, i + 1, d)
        if i >= first_outlier:
            x[i] = np.float32(-4.0) * c + np.float32(8.0) * g
        else:
            x[i] = c + np.float32(0.5) * g
    return torch.from_numpy(x)


# ---- The rules, the straightforward way ---------------------------------------------


def midpoint_median(s):
    """Coordinate-wise median of column-sorted s; even count: midpoint."""
    k = s.shape[0]
    if k % 2 == 1:
        return s[k // 2]
    return (s[k // 2 - 1] + s[k // 2]) / 2


def mean_nearest(x, centre, keep):
    """Per coordinate, the mean of the `keep` values nearest `centre`."""
    idx = (x - centre).abs().argsort(dim=0)[:keep]
    return x.gather(0, idx).mean(dim=0)


def rule_mean(x, f):
    return x.mean(dim=0)


def rule_median(x, f):
    return midpoint_median(x.sort(dim=0).values)


def rule_trimmed_mean(x, f):
    n = x.shape[0]
    return x.sort(dim=0).values[f:n - f].mean(dim=0)


def rule_meamed(x, f):
    return mean_nearest(x, rule_median(x, f), x.shape[0] - f)


def rule_phocas(x, f):
    return mean_nearest(x, rule_trimmed_mean(x, f), x.shape[0] - f)


def squared_distances(x):
    return torch.cdist(x, x) ** 2


def krum_scores(dist, f):
    """Sum of squared distances to the k - f - 2 nearest others (Blanchard et al.)."""
    k = dist.shape[0]
    m = max(1, min(k - f - 2, k - 1))
    others = dist + torch.diag(torch.full((k,), float("inf")))
    return others.sort(dim=1).values[:, :m].sum(dim=1)


def rule_krum(x, f):
    return x[int(torch.argmin(krum_scores(squared_distances(x), f)))].clone()


def rule_multi_krum(x, f):
    scores = krum_scores(squared_distances(x), f)
    order = torch.sort(scores, stable=True).indices[: x.shape[0] - f]
    return x[order].mean(dim=0)


def rule_bulyan(x, f):
    n = x.shape[0]
    dist = squared_distances(x)
    remaining = list(range(n))
    chosen = []
    while len(chosen) < n - 2 * f:
        sub = dist[remaining][:, remaining]
        pick = int(torch.argmin(krum_scores(sub, f)))
        chosen.append(remaining.pop(pick))
    s = x[chosen]
    return mean_nearest(s, rule_median(s, f), n - 4 * f)


def rule_geometric_median(x, f, nu=0.1, iterations=100, tolerance=1e-6):
    v = x.mean(dim=0)
    dist = torch.linalg.norm(x - v, dim=1)
    objective = float(dist.sum())
    for _ in range(iterations):
        w = 1.0 / torch.clamp(dist, min=nu)
        v = (w[:, None] * x).sum(dim=0) / w.sum()
        dist = torch.linalg.norm(x - v, dim=1)
        previous, objective = objective, float(dist.sum())
        if abs(previous - objective) <= tolerance * objective:
            break
    return v


def rule_centered_clipping(x, f, tau=100.0, iterations=1):
    v = torch.zeros(x.shape[1], dtype=x.dtype)  # a first round: the kept centre is zero
    for _ in range(iterations):
        diff = x - v
        norms = torch.linalg.norm(diff, dim=1)
        scale = torch.clamp(tau / norms, max=1.0)
        v = v + (scale[:, None] * diff).mean(dim=0)
    return v


def rule_mda(x, f):
    n = x.shape[0]
    dist = torch.cdist(x, x)
    best, best_diameter = None, float("inf")
    for subset in itertools.combinations(range(n), n - f):
        idx = torch.tensor(subset)
        diameter = float(dist[idx][:, idx].max())
        if diameter < best_diameter:
            best, best_diameter = subset, diameter
    return x[list(best)].mean(dim=0)


RULES = {
    "mean": rule_mean,
    "median": rule_median,
    "trimmed_mean": rule_trimmed_mean,
    "meamed": rule_meamed,
    "phocas": rule_phocas,
    "krum": rule_krum,
    "multi_krum": rule_multi_krum,
    "bulyan": rule_bulyan,
    "geometric_median": rule_geometric_median,
    "centered_clipping": rule_centered_clipping,
    "mda": rule_mda,
}

# ---- Driver -------------------------------------------------------------------------


def parse_size(text):
    text = text.strip()
    if "^" in text:
        a, b = text.split("^")
        return int(a) ** int(b)
    if "<<" in text:
        a, b = text.split("<<")
        return int(a) << int(b)
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text and text[-1].upper() in units:
        return int(text[:-1]) * units[text[-1].upper()]
    return int(text)


def time_best(fn, repeats):
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def run_ours(args, rules, json_path, dump_dir):
    cmd = [args.bin, "aggregators", "--rules", ",".join(rules), "--n", str(args.n),
           "--d", str(args.d), "--threads", str(args.threads), "--repeats", str(args.repeats),
           "--seed", str(args.seed), "--json", json_path, "--dump-dir", dump_dir]
    if args.f is not None:
        cmd += ["--f", str(args.f)]
    print("running:", " ".join(cmd), file=sys.stderr)
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout + done.stderr)
        sys.exit(f"ps-bench failed with status {done.returncode}")
    with open(json_path) as fh:
        return {row["rule"]: row for row in json.load(fh)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=16, help="number of inputs (default 16)")
    parser.add_argument("--d", type=parse_size, default=1 << 20,
                        help="coordinates per input: 1048576, 2^20, 1<<20 or 1M (default 2^20)")
    parser.add_argument("--f", type=int, default=None,
                        help="f for every rule (default: ps-bench's choice, the largest the "
                             "rule accepts up to n/4)")
    parser.add_argument("--rules", default=",".join(RULES),
                        help="comma-separated rules (default: all implemented here)")
    parser.add_argument("--threads", type=int, default=1,
                        help="threads for both sides (default 1)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed repeats after a warm-up; the best is reported (default 3)")
    parser.add_argument("--seed", type=int, default=1, help="input generator seed (default 1)")
    parser.add_argument("--bin", default=os.path.join(REPO, "build", "bin", "ps-bench"),
                        help="the ps-bench binary (default build/bin/ps-bench)")
    parser.add_argument("--python-path", default=os.path.join(REPO, "build", "python"),
                        help="where the ps_server package is built (default build/python); "
                             "'' leaves the Python column out")
    args = parser.parse_args()
    args.d = int(args.d)

    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    unknown = [r for r in rules if r not in RULES]
    if unknown:
        sys.exit(f"no PyTorch version of {', '.join(unknown)}; known: {', '.join(RULES)}")
    if not os.access(args.bin, os.X_OK):
        sys.exit(f"{args.bin} not found; build it (cmake --build build --target ps-bench) "
                 "or pass --bin")
    torch.set_num_threads(args.threads)
    py_agg = None
    if args.python_path:
        sys.path.insert(0, args.python_path)
        try:
            from ps_server import aggregators as py_agg
        except ImportError as e:
            print(f"no ps_server package under {args.python_path} ({e}); Python column left out",
                  file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="compare_torch.") as tmp:
        ours = run_ours(args, rules, os.path.join(tmp, "ours.json"), tmp)
        x = make_inputs(args.seed, args.n, args.d)
        header = ["rule", "n", "f", "d", "torch s", "ours s", "speed-up", "max |diff|",
                  "rel L2 diff", "coords off"]
        if py_agg is not None:
            header += ["python s", "python speed-up", "python = ours"]
        table = []
        missing = []
        for rule in rules:
            row = ours.get(rule)
            if row is None:
                missing.append(rule)
                continue
            f = row["f"]
            fn = RULES[rule]
            torch_seconds = time_best(lambda: fn(x, f), args.repeats)
            expected = fn(x, f)
            got = torch.from_numpy(np.fromfile(row["output_file"], dtype=np.float32))
            diff = (got.double() - expected.double())
            rel = float(diff.norm() / max(float(expected.double().norm()), 1e-30))
            # Coordinates off by more than float rounding: near-ties that ours settles in
            # double and PyTorch in float32 (Bulyan, Meamed), or a different selection.
            off = int((diff.abs() > 1e-5 * torch.clamp(expected.double().abs(), min=1.0)).sum())
            table.append([rule, str(args.n), str(f), str(args.d), f"{torch_seconds:.4g}",
                          f"{row['seconds']:.4g}", f"{torch_seconds / row['seconds']:.1f}x",
                          f"{float(diff.abs().max()):.3g}", f"{rel:.3g}", str(off)])
            if py_agg is not None:
                # ps_server.aggregators from Python, the rule made once as a caller would.
                rule_obj = py_agg.Aggregator(rule, args.n, f, threads=args.threads)
                array = x.numpy()
                py_seconds = time_best(lambda: rule_obj(array), args.repeats)
                # A fresh instance for the comparison: centered clipping keeps its centre.
                fresh = py_agg.Aggregator(rule, args.n, f, threads=args.threads)
                same = bool(np.array_equal(fresh(array), got.numpy()))
                table[-1] += [f"{py_seconds:.4g}", f"{torch_seconds / py_seconds:.1f}x",
                              "yes" if same else "NO"]
            print(f"{rule}: torch {torch_seconds:.4g} s, ours {row['seconds']:.4g} s",
                  file=sys.stderr)

    widths = [max(len(h), *(len(r[i]) for r in table)) if table else len(h)
              for i, h in enumerate(header)]
    print(f"PyTorch {torch.__version__} vs ps-bench, {args.threads} thread(s), "
          f"best of {args.repeats}; d = {args.d}")
    for r in [header, ["-" * w for w in widths]] + table:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                        for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    if missing:
        print(f"\nnot run by ps-bench (unknown rule or bound; see its messages): "
              f"{', '.join(missing)}")


if __name__ == "__main__":
    main()
