"""ps_server.torch's optimizer_on="shards": which torch optimizers the shards mirror, and
the optimizer spec each param_group is registered with (docs/optimizers.md)."""

import math

import torch

# What optimizer_on="shards" mirrors: exactly these classes (a subclass may change the
# update), with the group keys that fix the update beside lr (checked at every step).
MIRRORED = {torch.optim.SGD: ("sgd", ("momentum", "dampening", "nesterov", "weight_decay",
                                      "maximize")),
            torch.optim.Adam: ("adam", ("betas", "eps", "weight_decay", "amsgrad", "maximize")),
            torch.optim.AdamW: ("adamw", ("betas", "eps", "weight_decay", "amsgrad",
                                          "maximize"))}
_MIRRORED_TEXT = ("torch.optim.SGD (momentum, dampening, nesterov, weight_decay), "
                  "torch.optim.Adam and torch.optim.AdamW (amsgrad=False), all with "
                  "maximize=False")
_ANY_OPTIMIZER = ("pass DistributedOptimizer(..., optimizer_on='worker') with shards run "
                  "--aggregate-only for any other optimizer (each worker steps it on the "
                  "shards' robust aggregate)")
_FLAGS = ("nesterov", "amsgrad", "maximize")


def _hyperparameter(group, key):
    """A group's value of `key`, normalized for comparing (betas as a tuple of floats)."""
    value = group.get(key, False if key in _FLAGS else 0.0)
    if key == "betas":
        return tuple(float(b) for b in value)
    return bool(value) if key in _FLAGS else float(value)


def _number(x):
    return repr(float(x))  # Python's float repr: 0.001, 1e-08 (the spec grammar's)


def mirror_specs(optimizer):
    """optimizer_on="shards": each param_group's optimizer spec for the shards and the
    hyperparameters it fixes ([(spec, {key: value})] by group). ValueError for what the
    shards cannot mirror, naming it and what they can."""
    cls = type(optimizer)
    if cls not in MIRRORED:
        base = next((m for m in MIRRORED if isinstance(optimizer, m)), None)
        why = (f" (a subclass of {base.__module__}.{base.__name__}, which may change the "
               "update: the shards mirror the exact classes)" if base else "")
        raise ValueError(f"optimizer_on='shards': the shards cannot mirror "
                         f"{cls.__module__}.{cls.__qualname__}{why}; they mirror "
                         f"{_MIRRORED_TEXT}. {_ANY_OPTIMIZER}")
    kind, keys = MIRRORED[cls]
    out = []
    for g, group in enumerate(optimizer.param_groups):
        hyper = {k: _hyperparameter(group, k) for k in keys}
        where = f"optimizer_on='shards': param_groups[{g}] of torch.optim.{cls.__name__}"
        for flag in ("amsgrad", "maximize"):
            if hyper.get(flag):
                raise ValueError(f"{where} has {flag}=True, which the shards cannot mirror; "
                                 f"they mirror {_MIRRORED_TEXT}. {_ANY_OPTIMIZER}")
        if kind == "sgd" and hyper["nesterov"] and (hyper["momentum"] <= 0 or
                                                    hyper["dampening"] != 0):
            raise ValueError(f"{where} has nesterov=True with momentum "
                             f"{hyper['momentum']!r} and dampening {hyper['dampening']!r}: "
                             "Nesterov momentum needs a momentum > 0 and zero dampening "
                             "(torch.optim.SGD refuses it too)")
        # The spec's lr is the one the run started with (a scheduler's initial_lr, so a
        # worker that resumes with a decayed lr registers the same layout): every push
        # carries the current one, which the shards take instead.
        lr = float(group.get("initial_lr", group["lr"]))
        numbers = {"lr": lr, **{k: v for k, v in hyper.items() if k != "betas"}}
        if "betas" in hyper:
            numbers.update(beta1=hyper["betas"][0], beta2=hyper["betas"][1])
        bad = [k for k, v in numbers.items() if not math.isfinite(v)]
        if bad or lr < 0:
            key = bad[0] if bad else "lr"
            raise ValueError(f"{where} has {key}={numbers[key]!r}: the shards take finite "
                             "hyperparameters and an lr >= 0")
        if kind == "sgd":
            args = [("lr", _number(lr)), ("momentum", _number(hyper["momentum"])),
                    ("dampening", _number(hyper["dampening"])),
                    ("nesterov", "1" if hyper["nesterov"] else "0"),
                    ("weight_decay", _number(hyper["weight_decay"]))]
        else:
            args = [("lr", _number(lr)), ("beta1", _number(hyper["betas"][0])),
                    ("beta2", _number(hyper["betas"][1])), ("eps", _number(hyper["eps"])),
                    ("weight_decay", _number(hyper["weight_decay"]))]
        out.append((f"{kind}({', '.join(f'{k}={v}' for k, v in args)})", hyper))
    return out


def check_hyperparameters(optimizer, registered):
    """The shards mirror the hyperparameters registered at join (`registered`, as
    mirror_specs gave them), and only lr changes reach them (each push carries it); any
    other change of `optimizer`'s groups (a scheduler cycling momentum, a hand edit) is a
    ValueError, not a silent no-op."""
    groups = optimizer.param_groups
    if len(groups) != len(registered):
        raise ValueError(f"the wrapped optimizer has {len(groups)} param_groups, but the "
                         f"shards were registered with {len(registered)}: the layout "
                         "is fixed at join (add_param_group after wrapping?)")
    for g, (group, (_, hyper)) in enumerate(zip(groups, registered)):
        for key, was in hyper.items():
            now = _hyperparameter(group, key)
            if now != was:
                raise ValueError(
                    f"param_groups[{g}]['{key}'] is {now!r} now, but the shards were "
                    f"registered with {key}={was!r}: they mirror changes of lr only (each "
                    f"push carries it), not of {key}. Keep {key} fixed (a scheduler that "
                    "cycles momentum: OneCycleLR(..., cycle_momentum=False), "
                    "CyclicLR(..., cycle_momentum=False)), or pass "
                    "DistributedOptimizer(..., optimizer_on='worker') with shards run "
                    "--aggregate-only")
