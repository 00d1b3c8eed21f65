"""ps_server.aggregators: the server's rules from Python, against plain numpy definitions
(docs/aggregators.md's table), on numpy arrays and torch tensors, and bad input."""

import threading

import numpy as np
import pytest

import ps_server
from ps_server import aggregators as agg

RNG = np.random.default_rng(7)


def honest_and_byzantine(k=11, f=2, d=257):
    x = RNG.normal(size=(k, d)).astype(np.float32)
    x[:f] = 50.0 + RNG.normal(size=(f, d)).astype(np.float32)  # far from the honest ones
    return x


# Plain numpy definitions, written from the table in docs/aggregators.md.
def ref_mean(x, f):
    return x.astype(np.float64).mean(axis=0)


def ref_median(x, f):
    return np.median(x.astype(np.float64), axis=0)


def ref_trimmed_mean(x, f):
    s = np.sort(x.astype(np.float64), axis=0)
    return s[f : len(x) - f].mean(axis=0)


def ref_meamed(x, f):
    x = x.astype(np.float64)
    med = np.median(x, axis=0)
    out = np.empty(x.shape[1])
    for c in range(x.shape[1]):
        # The k - f values nearest the median; ties: the smaller value first.
        order = sorted(range(len(x)), key=lambda i: (abs(x[i, c] - med[c]), x[i, c]))
        out[c] = x[order[: len(x) - f], c].mean()
    return out


def krum_scores(x, f):
    x = x.astype(np.float64)
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    k = len(x)
    return np.array([np.sort(np.delete(d2[i], i))[: k - f - 2].sum() for i in range(k)])


def ref_krum(x, f):
    return x[int(np.argmin(krum_scores(x, f)))].astype(np.float64)


def ref_multi_krum(x, f):
    chosen = np.argsort(krum_scores(x, f), kind="stable")[: len(x) - f]
    return x[chosen].astype(np.float64).mean(axis=0)


def ref_nnm_mean(x, f):
    x64 = x.astype(np.float64)
    d2 = ((x64[:, None, :] - x64[None, :, :]) ** 2).sum(axis=2)
    mixed = np.stack([x64[np.argsort(d2[i], kind="stable")[: len(x) - f]].mean(axis=0)
                      for i in range(len(x))])
    return mixed.mean(axis=0)


def top_eigen(x, w):
    """The w-weighted mean of the rows and the largest eigenpair of their w-weighted
    covariance, from numpy's dense d x d eigensolver."""
    x = x.astype(np.float64)
    mu = (w[:, None] * x).sum(axis=0) / w.sum()
    diffs = x - mu
    cov = (w[:, None] * diffs).T @ diffs / w.sum()
    values, vectors = np.linalg.eigh(cov)
    return mu, values[-1], vectors[:, -1]


def ref_caf(x, f):
    k = len(x)
    c = np.ones(k)
    best, best_lambda = x.astype(np.float64).mean(axis=0), np.inf
    while c.sum() > k - 2 * f:
        mu, lam, v = top_eigen(x, c)
        if lam < best_lambda:
            best, best_lambda = mu, lam
        tau = ((x.astype(np.float64) - mu) @ v) ** 2
        tau_max = tau[c > 0].max()
        if lam <= 0 or tau_max <= 0:
            break
        c = np.where(c > 0, c * np.maximum(0.0, 1 - tau / tau_max), 0.0)
    return best


def ref_smea(x, f):
    import itertools
    k = len(x)
    best, best_lambda = None, np.inf
    for subset in itertools.combinations(range(k), k - f):
        w = np.zeros(k)
        w[list(subset)] = 1.0
        mu, lam, _ = top_eigen(x, w)
        if lam < best_lambda * (1 - 1e-9):
            best, best_lambda = mu, lam
    return best


def ref_monna(x, f, idx=0):
    x64 = x.astype(np.float64)
    d2 = ((x64 - x64[idx]) ** 2).sum(axis=1)
    d2[idx] = -1.0  # itself first
    return x64[np.argsort(d2, kind="stable")[: len(x) - f]].mean(axis=0)


REFERENCES = {
    "caf": ref_caf,
    "smea": ref_smea,
    "monna": ref_monna,
    "monna(idx=5)": lambda x, f: ref_monna(x, f, 5),
    "mean": ref_mean,
    "median": ref_median,
    "trimmed_mean": ref_trimmed_mean,
    "meamed": ref_meamed,
    "krum": ref_krum,
    "multi_krum": ref_multi_krum,
    "nnm+mean": ref_nnm_mean,
}


@pytest.mark.parametrize("spec", sorted(REFERENCES))
def test_rule_matches_its_numpy_definition(spec):
    x = honest_and_byzantine()
    got = agg.aggregate(spec, x, f=2)
    assert got.dtype == np.float32 and got.shape == (x.shape[1],)
    np.testing.assert_allclose(got, REFERENCES[spec](x, 2), rtol=2e-5, atol=2e-5)


def test_robust_rules_stay_with_the_honest_inputs_while_the_mean_is_dragged():
    x = honest_and_byzantine()
    honest = x[2:].astype(np.float64)
    lo, hi = honest.min(axis=0), honest.max(axis=0)
    assert np.abs(agg.aggregate("mean", x, f=2)).mean() > 5
    for spec in ["median", "trimmed_mean", "krum", "multi_krum", "nnm+trimmed_mean", "caf", "smea",
                 "geometric_median", "bulyan" if len(x) >= 11 else "median"]:
        got = agg.aggregate(spec, x, f=2)
        assert np.all(got >= lo - 1e-4) and np.all(got <= hi + 1e-4), spec


def test_every_rule_the_server_knows_runs():
    x = honest_and_byzantine(k=15, f=3, d=64)
    for rule in agg.rules():
        got = agg.aggregate(rule, x, f=3)
        assert got.shape == (64,) and np.all(np.isfinite(got)), rule
    assert set(agg.preaggregators()) >= {"clip", "arc", "nnm", "bucketing"}


def test_same_result_from_torch_tensors_and_numpy_arrays_and_threads():
    torch = pytest.importorskip("torch")
    x = honest_and_byzantine()
    rule = agg.Aggregator("nnm+trimmed_mean", n=len(x), f=2)
    from_numpy = rule(x)
    from_torch = rule(torch.from_numpy(x))
    assert isinstance(from_torch, torch.Tensor) and from_torch.dtype == torch.float32
    np.testing.assert_array_equal(from_torch.numpy(), from_numpy)
    threaded = agg.Aggregator("nnm+trimmed_mean", n=len(x), f=2, threads=3)(x)
    np.testing.assert_array_equal(threaded, from_numpy)


def test_a_stateful_rule_keeps_its_centre_between_calls():
    x = np.ones((5, 8), dtype=np.float32)
    rule = agg.Aggregator("centered_clipping(tau=1)", n=5)
    first = rule(x)  # from 0, each step at most tau = 1 in norm
    np.testing.assert_allclose(np.linalg.norm(first), 1.0, rtol=1e-5)
    second = rule(x)
    assert np.linalg.norm(second) > np.linalg.norm(first)
    with pytest.raises(ValueError, match="one Aggregator per tensor"):
        rule(np.ones((5, 9), dtype=np.float32))


def test_bad_input_is_refused_clearly():
    x = honest_and_byzantine()
    with pytest.raises(ValueError, match="krum needs n >= 2f \\+ 3"):
        agg.Aggregator("krum", n=6, f=2)
    with pytest.raises(ValueError, match="unknown"):
        agg.aggregate("no_such_rule", x)
    with pytest.raises(TypeError, match="float32"):
        agg.aggregate("mean", x.astype(np.float64))
    with pytest.raises(ValueError, match="2 dimensions"):
        agg.aggregate("mean", x[0])
    with pytest.raises(ValueError, match="contiguous"):
        agg.aggregate("mean", x[:, ::2])
    with pytest.raises(TypeError, match="numpy array or a torch tensor"):
        agg.aggregate("mean", [[1.0, 2.0]])
    torch = pytest.importorskip("torch")
    # A tensor outside CPU memory ('meta' stands in for CUDA on machines without one).
    with pytest.raises(TypeError, match="CPU memory: pass tensor.cpu"):
        agg.aggregate("mean", torch.empty(3, 4, device="meta"))
    bad = x.copy()
    bad[3, 5] = np.nan
    with pytest.raises(ValueError, match=r"vectors\[3, 5\] is not finite \(nan\)"):
        agg.aggregate("trimmed_mean", bad, f=2)
    with pytest.raises(ValueError):
        agg.Aggregator("trimmed_mean", n=5, f=2)(x[:3])  # fewer than 2f + 1 inputs
    # A rule that tolerates f Byzantine inputs, called without f, is refused rather than
    # run with f = 0; rules whose result does not depend on f take f = 0.
    for spec in ("trimmed_mean", "krum", "nnm+mean", "clip(2)+bulyan"):
        with pytest.raises(ValueError, match=r"tolerates f Byzantine inputs .*pass f"):
            agg.aggregate(spec, x)
    with pytest.raises(ValueError, match="pass f"):
        agg.Aggregator("trimmed_mean", n=len(x))
    for spec in ("mean", "median", "geometric_median", "clip(2)+mean"):
        np.testing.assert_array_equal(agg.aggregate(spec, x), agg.aggregate(spec, x, f=0))


def test_aggregate_releases_the_gil():
    # While a thread aggregates 16 x 2^20 values, this thread keeps running Python: a
    # call that held the GIL would leave the counter near 0 until it returned.
    x = RNG.normal(size=(16, 1 << 20)).astype(np.float32)
    rule = agg.Aggregator("median", n=16)
    results = []
    started = threading.Event()

    def run():
        started.set()
        results.append(rule(x))
        results.append(rule(x))

    t = threading.Thread(target=run)
    t.start()
    started.wait()
    count = 0
    while t.is_alive():
        count += 1
    t.join()
    np.testing.assert_array_equal(results[0], results[1])
    assert count > 10000, f"only {count} iterations ran beside the aggregation"
    assert issubclass(ps_server.Error, RuntimeError)
