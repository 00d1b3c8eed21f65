"""ps_server.torch's broadcasts, in horovod.torch's manner: broadcast_parameters (at start
the root's registration, mid-run the shards' collective adoption), broadcast_object and
broadcast_optimizer_state (through shard 0's object store, docs/objects.md). Public
through ps_server.torch."""

import warnings

import torch

from . import _objects
from ._ps_server import Error

_optimizers = []  # the DistributedOptimizers of this process (the last one joined is used)


def broadcast_parameters(params, root_rank=0):
    """horovod.torch's call: every worker's parameters become root_rank's.
    At start (before the first step): the shards start from the values root_rank had when
    its DistributedOptimizer joined (its root_rank, 0 by default; the others waited for it
    to register them), and this call pulls them. Where the shards already held parameters
    (restored from their checkpoint, or a run that went on while this worker restarted),
    theirs win and the root is warned. After training started it is a collective, as
    Horovod's is: every worker calls it at the same step, and once the shards' quorum of
    workers (n - f at least, so the f Byzantine workers alone never can) asked for the same
    root, the shards adopt the root's values as a new version, with their optimizer state
    (momentum, Adam's moments) started afresh, and every worker pulls it. Load a
    checkpoint mid-run after synchronize(). `params`: a state_dict or named parameters of
    the model a DistributedOptimizer trains; its buffers (BatchNorm statistics) and frozen
    parameters go from the root through shard 0's object store. With optimizer_on="worker"
    every tensor does (the aggregate-only shards hold no parameters)."""
    opt = _joined("broadcast_parameters")
    named = list(params.items()) if hasattr(params, "items") else list(params)
    if not all(isinstance(e, tuple) and len(e) == 2 and isinstance(e[0], str) for e in named):
        raise ValueError("broadcast_parameters takes a state_dict or named parameters "
                         "(model.state_dict(), model.named_parameters()), as horovod.torch")
    if opt.optimizer_on == "worker":
        # The shards hold aggregates, not parameters: every tensor goes through shard 0's
        # object store, from the root.
        _broadcast_tensors(opt, "parameters", named, root_rank)
        return
    if not 0 <= root_rank < opt._size:
        raise ValueError(f"root_rank {root_rank} outside [0, {opt._size})")
    opt.synchronize()
    trained = {p.data_ptr() for p in opt._params}
    if not any(torch.is_tensor(t) and t.data_ptr() in trained for _, t in named):
        raise ValueError("these parameters are not the ones the DistributedOptimizer trains")
    # What the shards do not train (buffers such as BatchNorm's statistics, frozen
    # parameters) is the root's too, through shard 0's object store.
    _broadcast_tensors(opt, "buffers", [(n, t) for n, t in named if torch.is_tensor(t) and
                                        t.data_ptr() not in trained], root_rank)
    is_root = opt._rank == root_rank
    if opt.round == opt._start_round and not (opt.comm == "adacomm" and opt.periods):
        if root_rank != opt.root_rank:
            raise ValueError(f"broadcast_parameters(root_rank={root_rank}) before the first "
                             f"step, but the DistributedOptimizer started the shards from rank "
                             f"{opt.root_rank}'s values: pass DistributedOptimizer(..., "
                             f"root_rank={root_rank})")
        if is_root and opt.root_values_adopted is False:
            warnings.warn(
                f"broadcast_parameters: the shards held parameters (version {opt.round}) before "
                f"rank {root_rank} joined, from their checkpoint or a run that went on, so "
                f"rank {root_rank}'s values were not adopted and every worker continues from "
                "the shards'. To start from rank 0's, start the shards without a checkpoint.",
                stacklevel=2)
        opt.worker.pull_all(opt.round, opt._params, timeout=opt._timeout)
        return
    # Mid-run: the collective adoption (docs/python.md, "Starting and resuming").
    values = [p.detach().contiguous() for p in opt._params] if is_root else None
    try:
        opt.worker.adopt(opt.round, root_rank, values, timeout=opt._timeout)
    except Error as e:
        if getattr(e, "reason", "") == "late":
            raise ValueError(
                f"broadcast_parameters at version {opt.round}: the shards are past it ({e}); "
                "every worker calls broadcast_parameters at the same step, after its "
                "step() (or synchronize())") from e
        raise
    version = opt.worker.pull_all(opt.round + 1, opt._params, timeout=opt._timeout)
    if version > opt.round + 1:
        warnings.warn(f"broadcast_parameters: asked for the adopted version {opt.round + 1}, "
                      f"got version {version}: the shards went on training meanwhile",
                      stacklevel=2)
    opt.round = version
    opt._begin_round()


def _joined(what):
    """The DistributedOptimizer whose worker talks to the shards (the last one made)."""
    if not _optimizers:
        raise ValueError(f"{what} needs a DistributedOptimizer first (it joins the shards)")
    return _optimizers[-1]


def _broadcast(opt, name, value, root_rank):
    """root_rank's `value` on every worker, through shard 0's object store (docs/objects.md):
    the root stores it under `name`; the others wait (up to the optimizer's timeout) for
    the version their count of calls under `name` expects, and decode it (never with
    pickle: another worker's bytes stay data). The store keeps the latest value of a
    name: a worker whose version was already replaced gets a ValueError saying so."""
    if not 0 <= root_rank < opt._size:
        raise ValueError(f"root_rank {root_rank} outside [0, {opt._size})")
    calls = opt._broadcasts.get(name, 0) + 1
    if opt._rank == root_rank:
        opt.worker.put_object(name, _objects.dumps(value))  # a TypeError counts no call
        opt._broadcasts[name] = calls
        return value
    version, data = opt.worker.get_object(root_rank, name, min_version=calls,
                                          timeout=opt._timeout)
    if version != calls:
        # The store keeps the root's latest value under a name: this one's is gone.
        raise ValueError(
            f"rank {root_rank} broadcast {name!r} {version} times, and this worker reads its "
            f"call {calls}, whose value was replaced: give broadcasts that may follow each "
            "other their own names (a worker that restarted counts its calls from 1 again)")
    opt._broadcasts[name] = calls
    return _objects.loads(data)


def _broadcast_tensors(opt, name, named, root_rank):
    """Copies root_rank's tensors into these (`named`: (name, tensor) pairs, the same names
    on every worker)."""
    if not named:
        return
    got = _broadcast(opt, name, {n: t.detach() for n, t in named}, root_rank)
    if opt._rank == root_rank:
        return
    missing = [n for n, _ in named if n not in got]
    if missing:
        raise ValueError(f"rank {root_rank} broadcast no {', '.join(map(repr, missing[:3]))}: "
                         "every worker must pass the same model's state")
    with torch.no_grad():
        for n, t in named:
            src = got[n]
            if src.shape != t.shape or src.dtype != t.dtype:
                raise ValueError(f"{n!r} is {tuple(src.shape)} {src.dtype} on rank {root_rank}, "
                                 f"{tuple(t.shape)} {t.dtype} here")
            t.copy_(src)


def _check_name(name):
    ok = name and len(name) <= 100 and all(c.isascii() and (c.isalnum() or c in "_.:/-")
                                           for c in name)
    if not ok:
        raise ValueError(f"name {name!r}: 1 to 100 of letters, digits and _.:/-")
    return name


def broadcast_object(obj, root_rank=0, name=None):
    """horovod.torch's call: returns root_rank's `obj` on every worker (the root gets its
    own back). It travels through shard 0's object store (docs/objects.md), encoded
    without pickle: None, bool, int, float, str, bytes, lists, tuples, dicts, numpy arrays
    and CPU tensors; anything else is a TypeError on the root. Every worker calls it the
    same number of times with the same `name` (default "object"); each call waits for
    the root's matching one, up to the DistributedOptimizer's timeout."""
    opt = _joined("broadcast_object")
    return _broadcast(opt, "object:" + _check_name(name or "object"), obj, root_rank)


def broadcast_optimizer_state(optimizer, root_rank=0):
    """horovod.torch's call: every worker's optimizer state becomes root_rank's. With
    optimizer_on="shards" (comm "sync", the default) the state lives on the shards, one
    for all workers (the shards' checkpoints keep it), so nothing moves and the call only
    checks root_rank. Otherwise (optimizer_on="worker", local updates) each worker steps
    the wrapped optimizer itself: its state_dict() goes from the root to the others
    through shard 0's object store, and they load it."""
    from .torch import DistributedOptimizer  # noqa: PLC0415 (torch.py imports this module)
    opt = optimizer if isinstance(optimizer, DistributedOptimizer) else _joined(
        "broadcast_optimizer_state")
    wrapped = optimizer.optimizer if isinstance(optimizer, DistributedOptimizer) else optimizer
    if opt._mirrored:
        if root_rank != opt.root_rank:
            raise ValueError(f"broadcast_optimizer_state(root_rank={root_rank}), but the shards "
                             f"hold the one optimizer state, started from rank "
                             f"{opt.root_rank}'s registration: pass root_rank={opt.root_rank}")
        return
    state = _broadcast(opt, "optimizer_state", wrapped.state_dict(), root_rank)
    if opt._rank != root_rank:
        wrapped.load_state_dict(state)
