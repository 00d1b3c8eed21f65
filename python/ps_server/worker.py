"""ps_server.Worker: a training process's connection to the shards (the C++ ps::Worker).

    w = ps_server.Worker(["127.0.0.1:7070", "127.0.0.1:7071"], worker_id=0,
                         tensors=[("fc1.weight", 784 * 256), ("fc1.bias", 256), ...],
                         initial=[p.detach() for p in model.parameters()],
                         token_file=".../token-worker-0", codec="fp16")
    for t in range(w.start_version, steps):
        w.pull_all(t, params)            # parameters of version t, into the tensors' memory
        ...                              # forward, backward
        for i, g in enumerate(grads):
            w.push(i, t, g)              # encoded and queued; returns at once
        w.wait_pushes()                  # raises ps_server.Refused for a refused push

Arrays are float32, contiguous, in CPU memory (numpy arrays or torch tensors, any shape of
the tensor's size); nothing is copied on the way in except by the push's own encoding.
Every blocking call releases the GIL. See docs/python.md.
"""

import math
import os

from . import _arrays
from ._ps_server import Error
from ._ps_server import Worker as _Worker

__all__ = ["Worker"]


class Worker:
    """Joins every shard with the model's layout: `tensors` is a list of (name, numel) or
    (name, numel, priority[, row_elems[, optimizer]]) in the model's order (priority
    defaults to the index: the first tensor is the most urgent, as P3 wants for the input
    layer). `optimizer` is the spec the shards step that tensor with: "" (the default) is
    their own flags (--lr, --momentum, --weight-decay, --lr-schedule); otherwise one of
    "sgd(lr=F, momentum=F, dampening=F, nesterov=0|1, weight_decay=F)",
    "adam(lr=F, beta1=F, beta2=F, eps=F, weight_decay=F)" and "adamw(...)" (the same
    keys), which are torch.optim.SGD, Adam (amsgrad=False) and AdamW (decoupled weight
    decay) exactly, their state (momentum buffer, exp_avg, exp_avg_sq, step count) kept
    on the shards. Every argument is key=value, numbers as Python's repr writes floats
    (0.001, 1e-08); unknown keys are refused. The specs are part of the layout: every
    worker must register the same, or the join is refused naming the tensor that
    differs.
    The first worker to join registers the layout and uploads `initial` (one array per
    tensor). Keyword options: slice_elems (values per slice; 0, the default, takes the
    job's: the size registered on shard 0, or, for the first worker, one chosen from the
    link to shard 0 as measured at the start, 262,144 on links of 1 Gbit/s and more, else
    65,536; the `slice_elems` property tells it, docs/data-plane.md), token or token_file (the shards' token for this
    worker, written in their --run-dir), tls_ca (the shards' CA: TLS), tls_cert and tls_key
    (this worker's certificate, for shards that require mTLS), tls_server_name, codec ("fp32", "fp16",
    "topk(0.01)+varint+fp16", ...), error_feedback, momentum (the worker's), tensor_codecs
    ({name: spec}), codec_seed, rpc_timeout and connect_timeout (seconds), max_attempts,
    plan (Espresso: each tensor's codec chosen from measured costs among plan_candidates,
    docs/adaptive.md), data_plane (what pushes and pulls travel over, docs/data-plane.md:
    None, the default, follows the plane the shards run; "grpc" or "tcp" asks for that one,
    and a shard on the other refuses the join with ps_server.Refused, reason "data_plane";
    any other value is a ValueError), may_register (default True: a worker that finds a
    shard without the layout registers it; False: it waits, up to connect_timeout, for
    another worker, the root, to register the layout and its initial values: Horovod's
    broadcast from root_rank, which DistributedOptimizer's root_rank sets), run_id (the
    training run this worker belongs to: shards started with --run-id refuse a worker of
    another run or of none with ps_server.Refused, reason "wrong_run"; default: the
    environment's PS_RUN_ID, as the C++ trainer's --run-id; docs/operations.md, "One model
    per run"), borrow (default False; True: fp32 pushes over the TCP data plane leave from
    the array itself instead of a copy, so an array given to push() must not change until
    wait_pushes() returns, which holds a reference to it until then: horovod's *_async
    contract; docs/python.md, "Borrowed pushes").
    """

    def __init__(self, shards, worker_id, tensors, initial=None, **options):
        options.setdefault("run_id", os.environ.get("PS_RUN_ID", ""))
        if initial is not None:
            initial = [_arrays.as_float32(x, f"initial[{i}]") for i, x in enumerate(initial)]
        self._w = _Worker(list(shards), worker_id, [tuple(t) for t in tensors], initial=initial,
                          **options)
        self.tensor_names = self._w.tensor_names
        self._index = {name: i for i, name in enumerate(self.tensor_names)}

    def _tensor(self, tensor):
        if isinstance(tensor, str):
            if tensor not in self._index:
                raise ValueError(f"no tensor {tensor!r} in the layout")
            return self._index[tensor]
        return tensor

    @property
    def start_version(self):
        """The lowest version the shards had published at join: where training resumes."""
        return self._w.start_version

    @property
    def slice_elems(self):
        """Values per slice of this worker's layout: the size given, or the job's."""
        return self._w.slice_elems

    @property
    def shards(self):
        """What each shard said at join (id, workers, rule, optimizer, version, data
        plane)."""
        return self._w.shards

    @property
    def data_plane(self):
        """The data plane this worker's pushes and pulls travel over, "grpc" or "tcp": the
        one the shards named at join (every shard of a cluster runs the same)."""
        return self._w.shards[0]["data_plane"]

    def put_object(self, key, value):
        """Keeps `value` (bytes) on shard 0 under this worker's id and `key` (1 to 128 of
        letters, digits and _.:/-) for the other workers, replacing the last; returns the
        key's new version (1, 2, ...). docs/objects.md."""
        return self._w.put_object(key, bytes(value))

    def get_object(self, owner, key, min_version=1, timeout=60.0):
        """(version, bytes) of worker `owner`'s value under `key`, once it has a version of
        at least `min_version`; waits up to `timeout` seconds (ps_server.Error after)."""
        return self._w.get_object(owner, key, min_version=min_version, timeout=timeout)

    def push(self, tensor, round, grad, lr=None):
        """Encodes and queues tensor `tensor`'s (index or name) gradient for `round`;
        returns once it was encoded. Refusals come back from wait_pushes(). `lr` (a
        finite float >= 0, else ValueError before anything is queued) travels with this
        push and the tensor's later ones until another is given: the shard steps the
        slice with the median of the lrs its round's pushes carried (a lying minority
        cannot move it) instead of the tensor's spec lr (and --lr-schedule). lr=None
        leaves the tensor's last lr in place; a round whose pushes carried none steps
        with the spec's lr (or --lr) times --lr-schedule's factor. ps_server.torch sends
        each param_group's current lr with every push, so a scheduler reaches the
        shards."""
        index = self._tensor(tensor)
        grad = _arrays.as_float32(grad, "grad")
        if lr is None:
            self._w.push(index, round, grad)
            return
        lr = float(lr)
        if not (math.isfinite(lr) and lr >= 0):
            raise ValueError(f"lr must be a finite float >= 0, got {lr!r}")
        self._w.push(index, round, grad, lr=lr)

    def wait_pushes(self):
        """Waits until every push so far was answered; raises the first failure since the
        last call (ps_server.Refused with reason, tensor, slice, round and shard)."""
        self._w.wait_pushes()

    def pull(self, tensor, min_version, out, timeout=60.0):
        """Writes tensor `tensor` of at least `min_version` into `out`; its version."""
        return self._w.pull(self._tensor(tensor), min_version,
                            _arrays.as_float32(out, "out"), timeout)

    def pull_all(self, min_version, outs, timeout=60.0):
        """Writes every tensor (outs[i] for tensor i) of at least `min_version`; the lowest
        version received."""
        return self._w.pull_all(min_version, self._outs(outs), timeout)

    def start_pull_all(self, min_version, outs, timeout=60.0):
        """Starts pull_all and returns a ticket at once: ticket.wait_tensor(i) blocks until
        tensor i arrived (most urgent first), ticket.wait() until all did."""
        return self._w.start_pull_all(min_version, self._outs(outs), timeout)

    def adopt(self, round, root, values=None, timeout=60.0):
        """Mid-run broadcast of worker `root`'s values (docs/python.md, "Starting and
        resuming"): every shard replaces its parameters with the root's as version
        round + 1, where `round` is the version every worker pulled last. A collective:
        every worker calls it (a shard adopts once its quorum, n - f at least, asked for
        the same round and root, and resets its optimizer state). The root passes its
        `values` (one array per tensor) and waits up to `timeout` seconds for the others'
        votes; the others pass none and return after voting. Then pull round + 1."""
        self._w.adopt(round, root, None if values is None else self._outs(values), timeout)

    @property
    def published_loss(self):
        """The training losses the shards published with the highest version pulled
        ({"version", "loss", "first_loss"}: medians of the workers' reports), or None."""
        return self._w.published_loss

    def adacomm_period(self, tau0=8, tau_max=32, lr_ratio=1.0):
        """AdaComm's number of local steps for the next round, from published_loss
        (tau0 until a loss was published; docs/adaptive.md, "AdaComm")."""
        return self._w.adacomm_period(tau0, tau_max, lr_ratio)

    def report_loss(self, round, loss):
        """Attaches this worker's training loss to its pushes of `round` (AdaComm)."""
        self._w.report_loss(round, float(loss))

    def stats(self):
        """Counters since start: slices pushed, refused and pulled, bytes, retries, ..."""
        return self._w.stats()

    def leave(self, timeout=5.0):
        """Tells every shard that this worker leaves: no round waits for it until it pushes
        or joins again (docs/operations.md, "Workers that come and go"). close() does it."""
        self._w.leave(timeout)

    def close(self):
        """Leaves the shards (each told within a second, as far as it answers) and ends the
        sessions; the object is unusable afterwards."""
        try:
            self._w.leave(1.0)
        except (Error, ValueError):  # a shard gone or unreachable, or closed already
            pass
        self._w.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def _outs(outs):
        return [_arrays.as_float32(x, f"outs[{i}]") for i, x in enumerate(outs)]
