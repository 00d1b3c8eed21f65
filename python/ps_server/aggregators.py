"""ps-server's robust aggregation rules on numpy arrays and CPU torch tensors.

The rules are the server's own code (docs/aggregators.md): the same definitions, the
same floating-point results.

    >>> import numpy as np, ps_server.aggregators as agg
    >>> vectors = np.random.default_rng(0).normal(size=(10, 1000)).astype(np.float32)
    >>> agg.aggregate("nnm+trimmed_mean", vectors, f=2).shape
    (1000,)

Specs: pre-aggregators joined by '+' in front of one rule, each with optional
arguments: "clip(2)+nnm+trimmed_mean", "bucketing(s=2)+centered_clipping(tau=10)".
"""

from . import _arrays
from ._ps_server import Aggregator as _Aggregator
from ._ps_server import aggregator_names, preaggregator_names

__all__ = ["Aggregator", "aggregate", "rules", "preaggregators"]


def rules():
    """Rule names a spec may end with."""
    return aggregator_names()


def preaggregators():
    """Pre-aggregator names a spec may put in front of its rule."""
    return preaggregator_names()


class Aggregator:
    """One rule for n workers of which f may be Byzantine, kept between calls (a stateful
    rule such as centered clipping keeps its centre; use one per tensor). f is required
    for the rules whose result depends on it (their bound names f: trimmed_mean, krum,
    bulyan, nnm, ...); the others take f=0 without one.

    Keyword options, as ps-server's flags: threads (1: the calling thread), multi_krum_m,
    krum_neighbours ("paper" or "byzfl"), even_median ("midpoint", "lower", "upper"),
    weiszfeld_nu, weiszfeld_iterations, weiszfeld_tolerance, clipping_tau,
    clipping_iterations, mda_max_subsets, seed.
    """

    def __init__(self, spec, n, f=None, **options):
        self._rule = _Aggregator(spec, n, _f_for(spec, n, f), **options)

    @property
    def name(self):
        """The canonical spec."""
        return self._rule.name

    @property
    def min_inputs(self):
        """The fewest vectors the rule accepts with this f."""
        return self._rule.min_inputs

    @property
    def bound(self):
        """The rule's bound as text: "n >= 2f + 3"."""
        return self._rule.bound

    def __call__(self, vectors, round=0):
        """The aggregate of the rows of `vectors` (k x d float32, C order, k >= min_inputs):
        a new array of d values, a torch tensor when `vectors` is one."""
        array = _arrays.as_float32(vectors, "vectors", 2)
        return _arrays.like(self._rule.aggregate(array, round), vectors)

    aggregate = __call__

    def __repr__(self):
        return f"Aggregator({self.name!r})"


def _f_for(spec, n, f):
    """f as given; without one, 0 for a spec whose result does not depend on f (mean,
    median, geometric_median, centered_clipping, clip, bucketing), else a ValueError: a
    rule that tolerates f Byzantine inputs given none would silently tolerate none."""
    if f is not None:
        return f
    bound = _Aggregator(spec, max(int(n), 8), 1).bound  # unknown specs fail here, by name
    if "f" in bound:
        raise ValueError(f"{spec} tolerates f Byzantine inputs ({bound}): pass f, the "
                         "number of Byzantine workers (f=0 to tolerate none)")
    return 0


def aggregate(spec, vectors, f=None, n=None, round=0, **options):
    """The aggregate of the rows of `vectors` by `spec` with f Byzantine inputs tolerated
    (required for the rules that use it: trimmed_mean, krum, nnm, ...). n (the number of
    workers the bound is checked against) defaults to the number of rows."""
    k = len(vectors)
    return Aggregator(spec, k if n is None else n, f, **options)(vectors, round=round)
