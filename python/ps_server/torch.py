"""ps_server.torch: ps-server for PyTorch training scripts, in the manner of horovod.torch.

    import ps_server.torch as pst

    pst.init()                                   # PS_SHARDS, PS_WORKER_ID, ... (ps-launch)
    model = Net()
    optimizer = pst.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-3),  # the shards mirror it (below)
        named_parameters=model.named_parameters(), model=model, codec="fp16")
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=1000)
    pst.broadcast_parameters(model.state_dict(), root_rank=0)
    for x, y in loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)            # each module waits for its own parameters
        loss.backward()                          # each gradient is pushed as autograd makes it
        optimizer.step()                         # the pushes' answers; the next pull starts
        scheduler.step()                         # the next pushes carry the new lr

How it maps onto the parameter server (docs/python.md, "ps_server.torch"):
- The shards own the update (optimizer_on="shards", the default): they aggregate the
  workers' gradients with their robust rule and step each tensor with the wrapped
  optimizer's update, which they mirror: at join every tensor is registered with a spec
  built from the wrapped optimizer's class and its parameter's param_group
  ("sgd(lr=..., momentum=..., dampening=..., nesterov=0|1, weight_decay=...)",
  "adam(lr=..., beta1=..., beta2=..., eps=..., weight_decay=...)", "adamw(...)"), and
  the optimizer's state (momentum buffer, exp_avg, exp_avg_sq, step count) lives on the
  shards, in their checkpoints. torch.optim.SGD, Adam and AdamW (exactly these classes,
  amsgrad=False, maximize=False) can be mirrored; anything else is refused before
  joining. Every push carries its parameter's group's current lr, and the shards step
  with the median of the round's lrs (a lying minority cannot move it), so a scheduler
  on this optimizer (StepLR, CosineAnnealingLR, LambdaLR, ...) reaches them; the other
  hyperparameters are fixed at join, and step() raises when one changed. The wrapped
  optimizer's own step is not taken (its state stays empty); it gives the parameters,
  param_groups and zero_grad(). The shards must not run --aggregate-only.
- optimizer_on="worker": the shards run --aggregate-only and publish each round's
  robust aggregate of the gradients; step() pulls it into every parameter's .grad and
  takes the wrapped optimizer's step on this worker, so any torch optimizer works. Each
  worker then holds its own parameters and optimizer state: every worker must start
  from the same values (the same seed, or the same checkpoint; broadcast_parameters
  refuses), and no one checks a worker's own step.
- Pushes: a hook on every parameter's gradient accumulator pushes the gradient as soon as
  autograd has it (the last layer's first), encoded with `codec`, so the shards aggregate
  while backward still runs. After `backward_passes_per_step` backward passes the
  accumulated .grad is pushed; a parameter without a gradient is pushed as zeros.
- Pulls (P3): step() starts pulling the next version straight into the parameters' memory
  and returns; with `model` given, a forward pre-hook makes each module wait for its own
  parameters only, so the first layers compute while later ones still arrive. Without it,
  step() waits for the whole pull. Call synchronize() before reading the parameters
  outside a forward pass (evaluation, saving).
- Parameters: contiguous float32 CPU tensors, one layout tensor each, named and ordered as
  named_parameters gives them (the first is the most urgent: the input layer's).
- Start: root_rank (0) registers its values (as loaded from a checkpoint, say) and the
  other workers wait for it, unless the shards restored a checkpoint; every worker then
  pulls that version, so all start from the root's parameters (broadcast_parameters).
- Clipping: with overlap=True (default) gradients leave during backward, and step()
  raises if one was edited afterwards (clip_grad_norm_); overlap=False pushes in step().
- DistributedOptimizer is a torch.optim.Optimizer: it shares the wrapped optimizer's
  param_groups, state and defaults, so LR schedulers attach to it.

Local updates (comm="adacomm", docs/adaptive.md "AdaComm"): the wrapped optimizer does
step, on this worker, for tau steps between synchronizations; then the change of the
parameters since the last pull is pushed (with the mean loss of those steps, which
step(loss=...) takes) and the shards add the aggregate of the changes as it is (they
must run --lr 1 --momentum 0 --weight-decay 0). tau follows AdaComm's rule on the losses
the shards publish, between 1 and tau_max, starting at tau0. comm="auto" is the C++
trainer's --comm auto: local updates with fp16 pushes and error feedback where the
shards add changes as they are, else a gradient push per step with each tensor's codec
planned (Espresso) and error feedback, stepped with the shards' own flags (--lr,
--momentum, --weight-decay, --lr-schedule), as the C++ trainer's.

Refusals come out of step() as ps_server.Refused (reason, tensor, slice, round, shard).
"""

import contextlib
import math
import os
import threading
import warnings

import torch

from . import _arrays, _objects
from ._ps_server import Error
from .launch import (ENV_NUM_WORKERS, ENV_RUN_DIR, ENV_SHARDS, ENV_TLS_CA, ENV_TLS_CERT,
                     ENV_TLS_KEY, ENV_TOKEN_FILE, ENV_WORKER_ID)
from .worker import Worker

__all__ = ["init", "rank", "size", "local_rank", "shards", "DistributedOptimizer", "broadcast_parameters",
           "broadcast_object", "broadcast_optimizer_state", "Error"]

_context = {}


def init(shards=None, worker_id=None, num_workers=None, token_file=None):
    """Reads this process's place in the job: the arguments, else the environment ps-launch
    (and the Kubernetes worker Job) sets: PS_SHARDS (host:port,...), PS_WORKER_ID,
    PS_NUM_WORKERS, PS_TOKEN_FILE (absent: no token, for --insecure shards), and for TLS
    PS_TLS_CA, PS_TLS_CERT, PS_TLS_KEY (the shards' CA, this worker's certificate and
    key). Under torchrun, its RANK, WORLD_SIZE and LOCAL_RANK stand in for PS_WORKER_ID,
    PS_NUM_WORKERS and the local rank (a PS_ value and torchrun's that disagree are an
    error), and PS_RUN_DIR (the shards' --run-dir) gives the token file of this rank,
    PS_RUN_DIR/token-worker-RANK, when PS_TOKEN_FILE is not set. PS_SHARDS has no torchrun
    counterpart: it is always needed."""
    env = os.environ

    def need(value, name, torchrun=None):
        if value is None:
            value = env.get(name) or None
            other = env.get(torchrun) or None if torchrun else None
            if value is not None and other is not None and int(value) != int(other):
                raise ValueError(f"ps_server.torch.init: {name}={value} but torchrun's "
                                 f"{torchrun}={other}; set one of them")
            if value is None:
                value = other
        if value is None or value == "":
            also = f" (or torchrun's {torchrun})" if torchrun else ""
            raise ValueError(f"ps_server.torch.init: {name}{also} is not set; run under "
                             "ps-launch or torchrun, or pass it")
        return value

    shard_list = shards if shards is not None else need(None, ENV_SHARDS)
    if isinstance(shard_list, str):
        shard_list = [s for s in shard_list.split(",") if s]
    rank_ = int(need(worker_id, ENV_WORKER_ID, "RANK"))
    if token_file is None:
        token_file = env.get(ENV_TOKEN_FILE) or None
    if token_file is None and env.get(ENV_RUN_DIR):
        token_file = os.path.join(env[ENV_RUN_DIR], f"token-worker-{rank_}")
    _context.clear()
    _context.update(shards=list(shard_list), rank=rank_,
                    size=int(need(num_workers, ENV_NUM_WORKERS, "WORLD_SIZE")),
                    local_rank=int(env.get("LOCAL_RANK") or 0),
                    token_file=token_file,
                    tls={k: env.get(v, "") for k, v in (("tls_ca", ENV_TLS_CA),
                                                         ("tls_cert", ENV_TLS_CERT),
                                                         ("tls_key", ENV_TLS_KEY))})
    if not 0 <= _context["rank"] < _context["size"]:
        raise ValueError(f"worker id {_context['rank']} outside [0, {_context['size']})")


def _need_init():
    if not _context:
        raise ValueError("call ps_server.torch.init() first")
    return _context


def rank():
    return _need_init()["rank"]


def size():
    return _need_init()["size"]


def local_rank():
    """This worker's rank among the workers on its host: torchrun's and ps-launch's
    LOCAL_RANK, else 0 (one worker per host, as in the Kubernetes worker Job)."""
    return _need_init()["local_rank"]


def shards():
    return list(_need_init()["shards"])


_optimizers = []  # the DistributedOptimizers of this process (broadcast_parameters pulls)


# comm="auto" where the shards apply SGD: Espresso's plan over these (the C++ trainer's).
AUTO_CANDIDATES = ["fp32", "fp16", "topk(0.01)+varint+fp16", "3lc(s=1.9)",
                   "topk(0.1, level=cat, min=0.001)+varint+fp16"]

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
_AGGREGATE_ONLY = ("ps_server.torch with optimizer_on='shards' (the default) needs shards "
                   "that apply the update; these run --aggregate-only and publish the "
                   "aggregate gradient instead: pass DistributedOptimizer(..., "
                   "optimizer_on='worker'), which steps the wrapped optimizer on it on each "
                   "worker, or start the shards without --aggregate-only")


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


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps `optimizer`: its parameters are trained through the shards (see the module's
    documentation). It is a torch.optim.Optimizer sharing the wrapped one's param_groups,
    state and defaults, so LR schedulers attach to it. Keyword options: optimizer_on
    ("shards", the default: the shards mirror the wrapped optimizer, torch.optim.SGD, Adam
    or AdamW, and each push carries its group's current lr; "worker": shards run
    --aggregate-only publish each round's robust aggregate gradient, and the wrapped
    optimizer, any torch optimizer, steps on it on each worker), codec (push codec spec,
    default "fp32"; "auto" plans each tensor's codec from measured costs,
    docs/adaptive.md), error_feedback, momentum
    (the worker's), tensor_codecs ({name: spec}), backward_passes_per_step, model (a
    torch.nn.Module: per-module waits for the pull), comm ("sync", "adacomm" or "auto"),
    tau0 and tau_max (AdaComm's first and largest period), push_transform (a function
    (name, tensor) -> tensor applied to every tensor before it is pushed, a gradient or,
    with local updates, a change: for simulating a Byzantine worker), slice_elems, timeout
    (seconds a pull may wait), root_rank (the worker whose values the shards start from:
    the others wait for it to register them, as broadcast_parameters from root_rank
    expects), overlap (True: each gradient is pushed as backward makes it, so the shards
    aggregate while backward runs, and an edit of a gradient after backward, such as
    clip_grad_norm_, reaches no shard: step() raises if one happens; False: step() pushes
    the gradients as they are then, after clipping), and the ps_server.Worker options (rpc_timeout,
    connect_timeout, max_attempts, codec_seed, tls_ca, data_plane: None follows the
    shards' data plane). `specs` ({name: optimizer spec}) says what each tensor was
    registered with ("" where the shards' own flags step it)."""

    def __init__(self, optimizer, named_parameters=None, codec="fp32", error_feedback=False,
                 backward_passes_per_step=1, model=None, timeout=60.0, comm="sync", tau0=8,
                 tau_max=32, push_transform=None, root_rank=0, overlap=True,
                 optimizer_on="shards", **worker_options):
        # torch.optim.Optimizer.__init__ is not called: this object keeps no groups or
        # state of its own (the properties below are the wrapped optimizer's).
        ctx = _need_init()
        if not 0 <= root_rank < ctx["size"]:
            raise ValueError(f"root_rank {root_rank} outside [0, {ctx['size']})")
        self.root_rank = root_rank
        self._rank, self._size = ctx["rank"], ctx["size"]  # this worker's, whatever init() says later
        if comm not in ("sync", "adacomm", "auto"):
            raise ValueError(f"comm {comm!r} is not one of: sync, adacomm, auto")
        if optimizer_on not in ("shards", "worker"):
            raise ValueError(f"optimizer_on {optimizer_on!r} is not one of: shards, worker")
        if optimizer_on == "worker" and comm != "sync":
            raise ValueError(f"optimizer_on='worker' steps the wrapped optimizer on each "
                             f"round's aggregate gradient, a comm='sync' round; comm={comm!r} "
                             "steps it locally already (pass comm='sync')")
        if not 1 <= tau0 <= tau_max:
            raise ValueError(f"AdaComm needs 1 <= tau0 <= tau_max, got tau0 {tau0}, "
                             f"tau_max {tau_max}")
        if not isinstance(optimizer, torch.optim.Optimizer) or isinstance(
                optimizer, DistributedOptimizer):
            raise TypeError(f"DistributedOptimizer wraps a torch.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = optimizer
        self.optimizer_on = optimizer_on
        if named_parameters is None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
            named_parameters = [(f"param.{i}", p) for i, p in enumerate(params)]
        self._names, self._params = [], []
        self.frozen = []  # names of parameters with requires_grad=False: never registered
        seen = set()
        for name, p in named_parameters:
            if id(p) in seen:
                continue
            seen.add(id(p))
            if not p.requires_grad:
                # Frozen: not part of the shards' model, so nothing is pushed for it and
                # the shards' weight decay cannot move it; it keeps this worker's values.
                self.frozen.append(name)
                continue
            _arrays.as_float32(p.detach(), f"parameter {name!r}")  # fp32, contiguous, CPU
            self._names.append(name)
            self._params.append(p)
        if not self._params:
            raise ValueError("no parameters to train" +
                             (f" (frozen: {', '.join(self.frozen)})" if self.frozen else ""))
        if backward_passes_per_step < 1:
            raise ValueError("backward_passes_per_step must be at least 1")
        # Each trained parameter's param_group (its lr travels with its pushes).
        group_of = {id(p): g for g, group in enumerate(optimizer.param_groups)
                    for p in group["params"]}
        self._group_of = [group_of.get(id(p)) for p in self._params]
        if comm == "sync":
            # The shards step exactly what the wrapped optimizer would: its parameters.
            outside = [n for n, g in zip(self._names, self._group_of) if g is None]
            if outside:
                raise ValueError(
                    f"parameters {', '.join(repr(n) for n in outside[:3])}"
                    f"{' ...' if len(outside) > 3 else ''} are in named_parameters but in no "
                    "param_group of the wrapped optimizer, which would never update them: "
                    "give the optimizer every trained parameter, or freeze these "
                    "(requires_grad_(False))")
            unnamed = sum(1 for group in optimizer.param_groups for p in group["params"]
                          if p.requires_grad and id(p) not in seen)
            if unnamed:
                raise ValueError(
                    f"the wrapped optimizer holds {unnamed} parameter(s) that named_parameters "
                    "does not name, which no worker would push: pass the named_parameters "
                    "of the model the optimizer trains")
        # optimizer_on="shards", comm="sync": what the shards mirror (refused before
        # joining when they cannot), and the hyperparameters fixed by it.
        self._mirrored = comm == "sync" and optimizer_on == "shards"
        self._registered = mirror_specs(optimizer) if self._mirrored else []
        if self._mirrored and all(float(g.get("initial_lr", g["lr"])) == 0
                                  for g in optimizer.param_groups):
            # The old convention (the shards' --lr trained, the wrapped lr was unused).
            warnings.warn("the wrapped optimizer's lr is 0 in every param_group, and the "
                          "shards step with it: nothing will train. ps_server.torch no longer "
                          "ignores the wrapped optimizer (its lr, momentum, weight decay, ... "
                          "are what the shards apply); give it the lr to train with",
                          stacklevel=2)
        specs = ([self._registered[g][0] for g in self._group_of] if self._mirrored
                 else [""] * len(self._params))
        self.specs = dict(zip(self._names, specs))
        self._passes = backward_passes_per_step
        self._overlap = overlap
        self._timeout = timeout
        self._tau0, self._tau_max = tau0, tau_max
        self._transform = push_transform

        def join(codec, error_feedback, candidates=None):
            plan = codec == "auto"
            options = {**ctx["tls"], **worker_options}
            if candidates:
                options["plan_candidates"] = candidates
            layout = []
            for i, (n, p, spec) in enumerate(zip(self._names, self._params, specs)):
                entry = (n, p.numel(), i, _row_elems(p))
                layout.append(entry + (spec,) if spec else entry)
            return Worker(
                ctx["shards"], ctx["rank"], layout,
                initial=[p.detach() for p in self._params],
                token_file=ctx["token_file"] or "", codec="fp32" if plan else codec,
                error_feedback=error_feedback, plan=plan,
                may_register=ctx["rank"] == root_rank, **options)

        if comm == "auto":
            # Local updates with fp16 where the shards add changes as they are; otherwise
            # a planned codec per tensor. Both with error feedback. (A second join when
            # the first guess was wrong, as the C++ trainer does.)
            self.worker = join("fp16", True)
            if all(s["adds_changes_as_they_are"] for s in self.worker.shards):
                comm = "adacomm"
            else:
                self.worker.close()
                self.worker = join("auto", True, AUTO_CANDIDATES)
                comm = "sync"
        else:
            try:
                self.worker = join(codec, error_feedback)
            except Error as e:
                # Aggregate-only shards refuse a layout with optimizer specs at
                # registration (they apply no update): say what to do instead.
                if (self._mirrored and getattr(e, "reason", "") == "bad_layout"
                        and "aggregate" in str(e).lower()):
                    raise ValueError(f"{_AGGREGATE_ONLY} ({e})") from e
                raise
        self.comm = comm
        if optimizer_on == "shards" and any(s["aggregate_only"] for s in self.worker.shards):
            self.worker.close()
            raise ValueError(_AGGREGATE_ONLY)
        if optimizer_on == "worker":
            applying = [s for s in self.worker.shards if not s["aggregate_only"]]
            if applying:
                s = applying[0]
                self.worker.close()
                raise ValueError(
                    f"optimizer_on='worker' steps the wrapped optimizer on each round's robust "
                    f"aggregate gradient, which only shards run with --aggregate-only publish; "
                    f"shard {s['shard_id']} applies the update itself: start every ps-server "
                    "with --aggregate-only (ps-launch --server-arg=--aggregate-only), or use "
                    "optimizer_on='shards' (torch.optim.SGD, Adam, AdamW)")
        if comm == "adacomm":
            adds = [s for s in self.worker.shards if not s["adds_changes_as_they_are"]]
            if adds:
                s = adds[0]
                self.worker.close()
                raise ValueError(
                    f"comm='adacomm' pushes the change of this worker's local steps, which the "
                    f"shards must add as it is; shard {s['shard_id']} applies SGD with lr "
                    f"{s['learning_rate']:g}, momentum {s['momentum']:g}, weight decay "
                    f"{s['weight_decay']:g} (start ps-server with --lr 1 --momentum 0 "
                    "--weight-decay 0)")
        self.round = self.worker.start_version
        self._lock = threading.Lock()
        self._broadcasts = {}  # calls per object name (broadcast_object and the like)
        self._new_round()
        self._hook_error = None
        self._ticket = None
        self._hooks, self._accumulators = [], []
        for i, p in enumerate(self._params):
            if p.requires_grad and comm == "sync":
                # The gradient accumulator's hook runs once .grad holds this pass's gradient
                # (horovod's way; torch 1.13 has no post-accumulate hook on tensors).
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hooks.append(acc.register_hook(self._make_hook(i)))
                self._accumulators.append(acc)  # the hook lives as long as its accumulator
        self._waits = []
        if model is not None and comm == "sync" and optimizer_on == "shards":
            index = {id(p): i for i, p in enumerate(self._params)}
            for module in model.modules():
                own = [index[id(p)] for p in module.parameters(recurse=False) if id(p) in index]
                if own:
                    self._waits.append(module.register_forward_pre_hook(self._make_wait(own)))
        self._start_round = self.round
        if optimizer_on == "worker":
            # The shards hold aggregates, not parameters: each worker keeps its own.
            self.root_values_adopted = None
        else:
            # Every worker starts from the registered (or restored) parameters: root_rank's
            # own where it registered them, the others waited for it.
            mine = ([p.detach().clone() for p in self._params] if ctx["rank"] == root_rank
                    else None)
            self.worker.pull_all(self.round, self._params, timeout=self._timeout)
            # On the root: whether the shards hold its values (False: they had parameters
            # already, from their checkpoint or a run that went on; broadcast_parameters
            # warns).
            self.root_values_adopted = None if mine is None else all(
                torch.equal(a, p.detach()) for a, p in zip(mine, self._params))
        # Local updates: where this round started, its steps so far, and the periods the
        # synchronized rounds had.
        self.periods = []
        self._local_steps, self._loss_sum = 0, 0.0
        self._begin_round()
        _optimizers.append(self)

    # -- what torch.optim.Optimizer users reach for: the wrapped optimizer's -----------
    # One list, one dict: an edit through either object (a scheduler's lr) is the other's.
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, groups):
        self.optimizer.param_groups = groups

    @property
    def state(self):
        return self.optimizer.state

    @state.setter
    def state(self, state):
        self.optimizer.state = state

    @property
    def defaults(self):
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, defaults):
        self.optimizer.defaults = defaults

    def zero_grad(self, set_to_none=False):
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        """The wrapped optimizer's. With optimizer_on="shards" its state is empty: the
        shards hold it (and checkpoint it); its param_groups (lr, initial_lr) are real."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state):
        self.optimizer.load_state_dict(state)

    def add_param_group(self, param_group):
        if self.comm == "sync":
            raise ValueError("add_param_group after DistributedOptimizer joined: the shards' "
                             "layout is fixed at join; give the wrapped optimizer every group "
                             "before wrapping it")
        self.optimizer.add_param_group(param_group)

    def __getstate__(self):
        raise TypeError("a DistributedOptimizer holds a connection to the shards and cannot "
                        "be pickled or copied; save state_dict() instead")

    def __repr__(self):
        return (f"DistributedOptimizer(optimizer_on={self.optimizer_on!r}, comm="
                f"{self.comm!r}, {self.optimizer!r})")

    # -- the step ----------------------------------------------------------------------
    def _lr(self, i):
        """What a push of parameter i carries: its group's current lr (optimizer_on
        "shards", comm "sync"), else None (the shards' own flags, or aggregate-only)."""
        if not self._mirrored:
            return None
        g = self._group_of[i]
        lr = self.optimizer.param_groups[g]["lr"]
        lr = float(lr)
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError(f"param_groups[{g}]['lr'] is {lr!r}: the shards step with a "
                             "finite lr >= 0")
        return lr

    def _push(self, i, tensor):
        lr = self._lr(i)
        if self._transform is not None:
            tensor = self._transform(self._names[i], tensor)
        try:
            self.worker.push(i, self.round, tensor.detach().contiguous(), lr=lr)
        except ValueError as e:
            if "not finite" not in str(e):
                raise
            raise self._not_finite(i, e) from e

    def _check_hyperparameters(self):
        """optimizer_on="shards": the shards mirror the hyperparameters registered at
        join, and only lr changes reach them (each push carries it); any other change
        (a scheduler cycling momentum, a hand edit) is an error, not a silent no-op."""
        groups = self.optimizer.param_groups
        if len(groups) != len(self._registered):
            raise ValueError(f"the wrapped optimizer has {len(groups)} param_groups, but the "
                             f"shards were registered with {len(self._registered)}: the layout "
                             "is fixed at join (add_param_group after wrapping?)")
        for g, (group, (_, registered)) in enumerate(zip(groups, self._registered)):
            for key, was in registered.items():
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

    # Rules whose aggregate one Byzantine input moves arbitrarily far (docs/aggregators.md).
    _NOT_ROBUST = ("mean",)

    def _not_finite(self, i, error):
        """What a non-finite push means, for step() to raise: the model diverged (the
        parameters pulled from the shards are not finite, so every gradient is not), or
        this worker's gradient blew up on finite parameters."""
        with torch.no_grad():
            diverged = [n for n, p in zip(self._names, self._params)
                        if not bool(torch.isfinite(p).all())]
        if not diverged:
            return ValueError(f"the gradient of {self._names[i]!r} in round {self.round} is not "
                              f"finite while the parameters are ({error}): a loss of inf or "
                              "nan, or a push_transform that makes one")
        rules = sorted({s["aggregator"] for s in self.worker.shards})
        weak = [r for r in rules if r.split("+")[-1].split("(")[0] in self._NOT_ROBUST]
        why = (f"the shards aggregate with {', '.join(weak)}, which one Byzantine worker can "
               "move arbitrarily far: run them with a robust rule (--aggregator trimmed_mean, "
               "median, krum, ...; docs/aggregators.md)" if weak else
               f"the shards' rule is {', '.join(rules)}: lower --lr or check the data and the "
               "number of Byzantine workers against --byzantine")
        return ValueError(f"the model diverged: after version {self.round} the parameters "
                          f"{', '.join(repr(n) for n in diverged[:3])}"
                          f"{' ...' if len(diverged) > 3 else ''} are not finite; {why}")

    def _new_round(self):
        """Forgets the round's backward passes: none seen, nothing pushed yet."""
        self._counts = [0] * len(self._params)  # backward passes seen per parameter
        self._pushed = [False] * len(self._params)
        self._pushed_grads = [None] * len(self._params)  # (storage, version) when pushed

    def _make_hook(self, i):
        def hook(*_):
            with self._lock:
                self._counts[i] += 1
                if self._counts[i] > self._passes:
                    # Its round's gradient is complete: a pass too many before step().
                    self._hook_error = self._hook_error or ValueError(
                        f"parameter {self._names[i]!r} got gradient {self._counts[i]} of round "
                        f"{self.round}, but backward_passes_per_step is {self._passes}: call "
                        "step() after that many backward passes")
                    return
                if self._counts[i] < self._passes or not self._overlap:
                    return
                self._pushed[i] = True
            p = self._params[i]
            try:
                # What was pushed, so step() can tell an edit after the push (clipping).
                self._pushed_grads[i] = (p.grad.data_ptr(), p.grad._version)
                self._push(i, p.grad)
            except Exception as e:  # recorded; raised by step(), never through autograd
                with self._lock:
                    self._hook_error = self._hook_error or e
        return hook

    def _make_wait(self, tensors):
        def wait(_module, _inputs):
            ticket = self._ticket
            if ticket is not None:
                for i in tensors:
                    ticket.wait_tensor(i)
        return wait

    def step(self, closure=None, loss=None):
        """comm "sync": pushes what backward did not (parameters without a gradient:
        zeros), waits for the shards' answers (raising a refusal), and starts pulling the
        next version into the parameters; with optimizer_on="worker" it pulls the round's
        aggregate gradient into each .grad instead and takes the wrapped optimizer's step.
        comm "adacomm": takes the wrapped optimizer's step here, and after the round's tau
        steps pushes the change and pulls; `loss` (or the closure's) is this step's
        training loss, which AdaComm needs. Returns the closure's loss, if one was
        given."""
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.comm == "adacomm":
            if loss is None:
                raise ValueError("comm='adacomm' needs each step's training loss: "
                                 "step(loss=loss) or step(closure)")
            self.optimizer.step()
            self._local_steps += 1
            self._loss_sum += float(loss)
            if self._local_steps >= self.period:
                self._synchronize_round()
            return loss if closure is not None else None
        error, self._hook_error = self._hook_error, None
        if error is not None:
            self._new_round()
            raise error
        if self._mirrored:
            try:
                self._check_hyperparameters()
            except ValueError:
                self._new_round()
                raise
        edited = [n for n, p, pushed, was in zip(self._names, self._params, self._pushed,
                                                  self._pushed_grads)
                  if pushed and (p.grad is None or (p.grad.data_ptr(), p.grad._version) != was)]
        if edited:
            self._new_round()
            raise ValueError(
                f"the gradients of {', '.join(repr(n) for n in edited[:3])}"
                f"{' ...' if len(edited) > 3 else ''} changed after backward pushed them "
                "(clip_grad_norm_ or another edit between backward() and step()?), so no shard "
                "saw the change: pass DistributedOptimizer(..., overlap=False), which pushes in "
                "step(), after such edits (Horovod's synchronize() / skip_synchronize() "
                "pattern works then too)")
        for i, p in enumerate(self._params):
            if not self._pushed[i]:
                self._push(i, p.grad if p.grad is not None else torch.zeros_like(p))
        self._new_round()
        self.worker.wait_pushes()
        self.round += 1
        if self.optimizer_on == "worker":
            self._step_on_aggregate()
            return loss if closure is not None else None
        self._ticket = self.worker.start_pull_all(self.round, self._params, self._timeout)
        if not self._waits:
            self.synchronize()
        return loss if closure is not None else None

    def _step_on_aggregate(self):
        """optimizer_on="worker": the round's robust aggregate (version round + 1 of
        --aggregate-only shards) into every parameter's .grad, then the wrapped
        optimizer's step on this worker."""
        grads = []
        for p in self._params:
            if p.grad is None or not p.grad.is_contiguous() or p.grad.dtype != p.dtype:
                p.grad = torch.zeros_like(p, memory_format=torch.contiguous_format)
            grads.append(p.grad)
        version = self.worker.pull_all(self.round, grads, timeout=self._timeout)
        if version > self.round:
            # The shards went on without this worker (it restarted): it has missed
            # aggregates the others stepped on, and steps on the newest.
            warnings.warn(f"optimizer_on='worker': asked for the aggregate of round "
                          f"{self.round - 1}, got version {version}'s: this worker missed "
                          "rounds, and its parameters no longer equal the others'",
                          stacklevel=3)
            self.round = version
        self.optimizer.step()

    def _begin_round(self):
        """Local updates: remembers the pulled parameters and takes the round's period."""
        if self.comm != "adacomm":
            self.period = 1
            return
        self._pulled = [p.detach().clone() for p in self._params]
        self.period = self.worker.adacomm_period(self._tau0, self._tau_max)
        self._local_steps, self._loss_sum = 0, 0.0

    def _synchronize_round(self):
        """Local updates: pushes the change since the pull with the steps' mean loss,
        waits for the answers, pulls the next version into the parameters."""
        with torch.no_grad():
            changes = [(x0 - p.detach()).contiguous() for x0, p in zip(self._pulled,
                                                                        self._params)]
        self.worker.report_loss(self.round, self._loss_sum / self._local_steps)
        for i, change in enumerate(changes):
            self._push(i, change)
        self.worker.wait_pushes()
        self.periods.append(self._local_steps)
        self.round += 1
        version = self.worker.pull_all(self.round, self._params, timeout=self._timeout)
        self.round = max(self.round, version)
        self._begin_round()

    def synchronize(self):
        """Waits until the pull started by the last step() wrote every parameter; the
        version received (it may be ahead when the shards moved on without this worker).
        With local updates, a round with steps not yet pushed is synchronized now."""
        if self.comm == "adacomm":
            if self._local_steps > 0:
                self._synchronize_round()
            return self.round
        ticket, self._ticket = self._ticket, None
        if ticket is None:
            return self.round
        version = ticket.wait()
        if version > self.round:
            self.round = version
        return version

    @contextlib.contextmanager
    def skip_synchronize(self):
        """horovod.torch's context for `step()` after an explicit synchronize() and a
        gradient edit (clipping). Here step() never waits for an exchange of gradients
        (the shards hold the aggregate), so the context changes nothing; with
        overlap=False the edit reaches the shards, with overlap=True step() raises."""
        yield

    def close(self):
        """Removes the hooks and leaves the shards (local steps not yet pushed stay
        local)."""
        if self.comm == "sync":
            self.synchronize()
        for h in self._hooks + self._waits:
            h.remove()
        self._hooks, self._waits, self._accumulators = [], [], []
        if self in _optimizers:
            _optimizers.remove(self)
        self.worker.close()


def _row_elems(p):
    """A weight's row length, so its slices hold whole rows (PowerSGD); 0 for vectors."""
    return p.numel() // p.shape[0] if p.dim() >= 2 and p.shape[0] > 0 else 0


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
