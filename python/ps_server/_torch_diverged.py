"""ps_server.torch's message for a push that is not finite: the model diverged (and
whether the shards' rule is one a Byzantine worker moves arbitrarily far), or this
worker's gradient blew up on finite parameters."""

import torch

# Rules whose aggregate one Byzantine input moves arbitrarily far (docs/aggregators.md).
NOT_ROBUST = ("mean",)


def not_finite_error(names, params, i, round_, aggregators, error):
    """The ValueError step() raises when the push of parameter `i` (of `names`/`params`)
    in round `round_` was refused as not finite (`error`); `aggregators`: the shards'
    rule specs."""
    with torch.no_grad():
        diverged = [n for n, p in zip(names, params) if not bool(torch.isfinite(p).all())]
    if not diverged:
        return ValueError(f"the gradient of {names[i]!r} in round {round_} is not "
                          f"finite while the parameters are ({error}): a loss of inf or "
                          "nan, or a push_transform that makes one")
    rules = sorted(set(aggregators))
    weak = [r for r in rules if r.split("+")[-1].split("(")[0] in NOT_ROBUST]
    why = (f"the shards aggregate with {', '.join(weak)}, which one Byzantine worker can "
           "move arbitrarily far: run them with a robust rule (--aggregator trimmed_mean, "
           "median, krum, ...; docs/aggregators.md)" if weak else
           f"the shards' rule is {', '.join(rules)}: lower --lr or check the data and the "
           "number of Byzantine workers against --byzantine")
    return ValueError(f"the model diverged: after version {round_} the parameters "
                      f"{', '.join(repr(n) for n in diverged[:3])}"
                      f"{' ...' if len(diverged) > 3 else ''} are not finite; {why}")
