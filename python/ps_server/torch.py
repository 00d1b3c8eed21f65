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
  from the same values (the same seed, the same checkpoint, or broadcast_parameters
  through shard 0's object store), and no one checks a worker's own step.
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
  Mid-run, broadcast_parameters is a collective: the shards adopt the root's values once
  their quorum of workers called it (docs/python.md).
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

Refusals come out of step() as ps_server.Refused (reason, tensor, slice, round, shard),
but one: a push refused as late (its round closed without this worker, which was slow,
or expired and came back: docs/operations.md) is a RuntimeWarning, counted in
late_rounds, and the worker goes on from the shards' next version (`round` may then jump
ahead), as the C++ trainer does. A loop `while opt.round < steps` ends with the others.
"""

import contextlib
import math
import threading
import warnings

import torch

from . import _arrays
from ._ps_server import Error, Refused
from ._torch_broadcast import (_optimizers, broadcast_object, broadcast_optimizer_state,
                               broadcast_parameters)
from ._torch_env import _context, _need_init, init, local_rank, rank, shards, size  # noqa: F401
from ._torch_diverged import not_finite_error
from ._torch_mirror import check_hyperparameters, mirror_specs
from .worker import Worker

__all__ = ["init", "rank", "size", "local_rank", "shards", "DistributedOptimizer", "broadcast_parameters",
           "broadcast_object", "broadcast_optimizer_state", "Error"]

# comm="auto" where the shards apply SGD: Espresso's plan over these (the C++ trainer's).
AUTO_CANDIDATES = ["fp32", "fp16", "topk(0.01)+varint+fp16", "3lc(s=1.9)",
                   "topk(0.1, level=cat, min=0.001)+varint+fp16"]

_AGGREGATE_ONLY = ("ps_server.torch with optimizer_on='shards' (the default) needs shards "
                   "that apply the update; these run --aggregate-only and publish the "
                   "aggregate gradient instead: pass DistributedOptimizer(..., "
                   "optimizer_on='worker'), which steps the wrapped optimizer on it on each "
                   "worker, or start the shards without --aggregate-only")

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
    shards' data plane; borrow=True sends each gradient from its .grad without a copy,
    held until step() has waited for the answers). `specs` ({name: optimizer spec}) says what each tensor was
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
                error_feedback=error_feedback, plan=plan, run_id=ctx["run_id"],
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
        # Rounds whose push came late (closed without this worker's gradient).
        self.late_rounds = 0
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
            raise not_finite_error(self._names, self._params, i, self.round,
                                   [s["aggregator"] for s in self.worker.shards], e) from e

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
                check_hyperparameters(self.optimizer, self._registered)
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
        try:
            self.worker.wait_pushes()
        except Refused as e:
            if e.reason != "late":
                raise
            self.late_rounds += 1
            warnings.warn(f"round {self.round} closed without this worker's gradient ({e}); "
                          "going on from the shards' next version", RuntimeWarning, stacklevel=2)
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
