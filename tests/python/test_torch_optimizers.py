"""ps_server.torch's DistributedOptimizer as a torch.optim.Optimizer: the shards mirror the
wrapped torch.optim.SGD, Adam or AdamW per tensor (optimizer_on="shards"), a scheduler's
lr reaches them with every push (the median of the round's), what they cannot mirror is
refused before joining, and optimizer_on="worker" steps any optimizer on each worker on
the robust aggregate of --aggregate-only shards.

The workers run as threads of this process, each with its own model, optimizer and
scheduler, against real ps-server processes (ps_server.launch.Shards; ps-launch itself is
test_torch.py's). Each run is compared step for step with plain PyTorch: the same
optimizer and scheduler stepping on the mean over the workers of their gradients, from
the same start (the shards' rule is the mean).

Tolerance: float32 throughout; the shards' update is the same arithmetic as torch's but
not necessarily in the same order (the mean of the pushes, the bias corrections), so
values may differ in the last bits. Measured on the 2-core development machine over
these runs (parameters of magnitude 0.01-1): at most 3e-8 apart in absolute terms (Adam
1.5e-8, AdamW 3e-8, SGD 3e-8, StepLR 7e-9), optimizer_on="worker" equal bit for bit
(the same torch step on the same mean). RTOL 1e-5 with ATOL 1e-6, as test_torch.py,
leaves a margin of 30x; a wrong update (a damped first step, a missing bias correction,
the shards' own flags) is off by 1e-3 or more."""

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

WORKERS = 2
STEPS = 6
RTOL, ATOL = 1e-5, 1e-6
JOIN_TIMEOUT = 120.0  # seconds the training threads may take, all steps together


def make_model():
    torch.manual_seed(0)  # every worker and the reference build the same model
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def loss_of(model, gen):
    x = torch.randn(8, 4, generator=gen)
    y = torch.randn(8, 2, generator=gen)
    return torch.nn.functional.mse_loss(model(x), y)


def reference(make_optimizer, make_scheduler=None, steps=STEPS, workers=WORKERS):
    """Plain PyTorch: the optimizer (and scheduler) stepping on the mean over workers of
    each worker's gradient; the parameters after every step."""
    model = make_model()
    opt = make_optimizer(model)
    sched = make_scheduler(opt) if make_scheduler else None
    gens = [torch.Generator().manual_seed(100 + w) for w in range(workers)]
    history = []
    for _ in range(steps):
        grads = []
        for w in range(workers):
            model.zero_grad()
            loss_of(model, gens[w]).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = torch.stack([g[i] for g in grads]).mean(dim=0)
        opt.step()
        history.append([p.detach().clone() for p in model.parameters()])
        if sched is not None:
            sched.step()
    return history


def distributed(shards, make_optimizer, make_scheduler=None, steps=STEPS, workers=WORKERS,
                with_model=False, lie=None, before_close=None, **options):
    """The same through DistributedOptimizer: `workers` threads, each a worker with its
    own model, optimizer and scheduler (on the DistributedOptimizer). Returns each
    worker's parameters after every step, and the optimizers (closed; before_close(opts)
    runs first)."""
    import ps_server.torch as pst

    models, opts, scheds = [], [], []
    for w in range(workers):  # in turn: rank 0 registers, the others pull its values
        pst.init(shards=shards.addresses, worker_id=w, num_workers=workers,
                 token_file=shards.token_file(w))
        model = make_model()
        opt = pst.DistributedOptimizer(make_optimizer(model),
                                       named_parameters=model.named_parameters(),
                                       model=model if with_model else None, timeout=60.0,
                                       **options)
        if lie is not None:
            lie(w, opt)
        models.append(model)
        opts.append(opt)
        scheds.append(make_scheduler(opt) if make_scheduler else None)
    histories = [[] for _ in range(workers)]
    errors = []

    def train(w):
        try:
            gen = torch.Generator().manual_seed(100 + w)
            for _ in range(steps):
                opts[w].zero_grad()
                loss_of(models[w], gen).backward()
                opts[w].step()
                opts[w].synchronize()
                histories[w].append([p.detach().clone() for p in models[w].parameters()])
                if scheds[w] is not None:
                    scheds[w].step()
        except BaseException as e:  # noqa: B902 -- raised in the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=train, args=(w,), daemon=True) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a worker thread hangs"
    try:
        if errors:
            raise errors[0]
        if before_close is not None:
            before_close(opts)
    finally:
        for opt in opts:
            opt.close()
    return histories, opts


def assert_matches(histories, want, what):
    for w, history in enumerate(histories):
        assert len(history) == len(want)
        for step, (got_params, want_params) in enumerate(zip(history, want)):
            for i, (got, expected) in enumerate(zip(got_params, want_params)):
                np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=RTOL, atol=ATOL,
                                           err_msg=f"{what}: worker {w}, step {step}, "
                                                   f"parameter {i}")


def shards_for(server_bin, workers=WORKERS, num_shards=2, **kwargs):
    from ps_server.launch import Shards

    # The shards' own SGD flags (lr 0.5, momentum 0.3, weight decay 0.2) differ from every
    # wrapped optimizer here: a tensor stepped with them instead would not match.
    kwargs.setdefault("lr", 0.5)
    kwargs.setdefault("momentum", 0.3)
    kwargs.setdefault("server_args", ("--weight-decay", "0.2"))
    return Shards(num_shards, workers, aggregator="mean", server=server_bin, **kwargs)


def cosine(opt):
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)


ADAMS = {
    "adam": (lambda m: torch.optim.Adam(m.parameters(), lr=0.05, betas=(0.8, 0.99), eps=1e-6,
                                        weight_decay=0.01),
             "adam(lr=0.05, beta1=0.8, beta2=0.99, eps=1e-06, weight_decay=0.01)"),
    "adamw": (lambda m: torch.optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.1),
              "adamw(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-08, weight_decay=0.1)"),
}


@pytest.mark.parametrize("kind", sorted(ADAMS))
def test_adam_and_adamw_with_cosine_annealing_match_plain_pytorch(server_bin, kind):
    make_optimizer, spec = ADAMS[kind]
    want = reference(make_optimizer, cosine)
    with shards_for(server_bin) as shards:
        # With the per-module waits (model=): the pulls land while the next forward runs.
        got, opts = distributed(shards, make_optimizer, cosine, with_model=True)
    assert opts[0].specs == {n: spec for n in ("0.weight", "0.bias", "2.weight", "2.bias")}
    assert_matches(got, want, kind)


def sgd_groups(model):
    # Two groups, the last layer's first (a group order other than the parameters'):
    # momentum with dampening and no weight decay there; Nesterov with weight decay at
    # another lr for the first layer.
    return torch.optim.SGD(
        [{"params": model[2].parameters(), "lr": 0.05, "dampening": 0.3, "nesterov": False,
          "weight_decay": 0.0},
         {"params": model[0].parameters()}],
        lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)


def test_sgd_momentum_dampening_nesterov_and_param_groups_match_plain_pytorch(server_bin):
    want = reference(sgd_groups)
    with shards_for(server_bin) as shards:
        got, opts = distributed(shards, sgd_groups)
    last = "sgd(lr=0.05, momentum=0.9, dampening=0.3, nesterov=0, weight_decay=0.0)"
    first = "sgd(lr=0.1, momentum=0.9, dampening=0.0, nesterov=1, weight_decay=0.01)"
    assert opts[1].specs == {"0.weight": first, "0.bias": first, "2.weight": last,
                             "2.bias": last}
    assert_matches(got, want, "sgd")


def step_lr(opt):
    return torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)


# Over each data plane: the lr travels in the gRPC Push request and in the TCP PUSH frame.
@pytest.mark.parametrize("plane", ["grpc", "tcp"])
def test_step_lr_attaches_and_its_lr_reaches_the_shards(server_bin, plane):
    def make_optimizer(model):
        return torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5)

    want = reference(make_optimizer, step_lr)
    # Without the lr drops (a constant 0.2) the run ends elsewhere: what is compared
    # below depends on them.
    constant = reference(make_optimizer)
    assert not np.allclose(constant[-1][0].numpy(), want[-1][0].numpy(), rtol=1e-3)
    planes = []
    with shards_for(server_bin, data_plane=plane) as shards:
        got, opts = distributed(shards, make_optimizer, step_lr, before_close=lambda opts:
                                planes.extend(o.worker.data_plane for o in opts))
    assert planes == [plane] * WORKERS
    assert_matches(got, want, f"StepLR over {plane}")

    # The Optimizer a scheduler needs: the same groups, state and defaults as the wrapped
    # optimizer (one object each, so an edit through either is the other's).
    opt = opts[0]
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups is opt.optimizer.param_groups
    assert opt.state is opt.optimizer.state and opt.defaults is opt.optimizer.defaults
    assert opt._step_count == STEPS  # the scheduler's counter on step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * 0.1 ** (STEPS // 2))
    saved = opt.state_dict()
    opt.param_groups[0]["lr"] = 5.0
    assert opt.optimizer.param_groups[0]["lr"] == 5.0
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2 * 0.1 ** (STEPS // 2))
    assert opt.param_groups is opt.optimizer.param_groups
    with pytest.raises(ValueError, match="layout is fixed at join"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))]})


def test_what_the_shards_cannot_mirror_is_refused_before_joining():
    """Nothing listens at 127.0.0.1:1: each refusal comes before any join."""
    import ps_server.torch as pst

    pst.init(shards="127.0.0.1:1", worker_id=0, num_workers=1)
    model = torch.nn.Linear(3, 2)
    mirrorable = (r"they mirror torch.optim.SGD \(momentum, dampening, nesterov, "
                  r"weight_decay\), torch.optim.Adam and torch.optim.AdamW \(amsgrad=False\), "
                  r"all with maximize=False\. pass DistributedOptimizer\(\.\.\., "
                  r"optimizer_on='worker'\) with shards run --aggregate-only")

    class MySGD(torch.optim.SGD):
        pass

    def refused(optimizer, match, **options):
        with pytest.raises(ValueError, match=match):
            pst.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     connect_timeout=1, **options)

    refused(torch.optim.RMSprop(model.parameters()),
            r"the shards cannot mirror torch.optim.rmsprop.RMSprop; " + mirrorable)
    refused(torch.optim.Adagrad(model.parameters()), r"cannot mirror torch.optim.adagrad.Adagrad")
    refused(MySGD(model.parameters(), lr=0.1),
            r"MySGD \(a subclass of torch.optim.sgd.SGD, which may change the update")
    refused(torch.optim.Adam(model.parameters(), amsgrad=True),
            r"param_groups\[0\] of torch.optim.Adam has amsgrad=True, which the shards cannot "
            r"mirror; " + mirrorable)
    refused(torch.optim.AdamW(model.parameters(), maximize=True),
            r"torch.optim.AdamW has maximize=True")
    refused(torch.optim.SGD([{"params": [model.weight], "nesterov": True, "dampening": 0.5},
                             {"params": [model.bias]}], lr=0.1, momentum=0.9),
            r"param_groups\[0\] of torch.optim.SGD has nesterov=True with momentum 0.9 and "
            r"dampening 0.5")
    # Every trained parameter must be the wrapped optimizer's, and the other way round.
    refused(torch.optim.SGD([model.weight], lr=0.1),
            r"parameters 'bias' are in named_parameters but in no param_group")
    with pytest.raises(ValueError, match=r"holds 1 parameter\(s\) that named_parameters does "
                                         r"not name"):
        pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("weight", model.weight)])
    refused(torch.optim.SGD(model.parameters(), lr=0.1), r"optimizer_on 'both' is not one of",
            optimizer_on="both")
    refused(torch.optim.SGD(model.parameters(), lr=0.1),
            r"optimizer_on='worker' steps the wrapped optimizer .* comm='adacomm'",
            optimizer_on="worker", comm="adacomm")
    with pytest.raises(TypeError, match="wraps a torch.optim.Optimizer"):
        pst.DistributedOptimizer(object())
    # lr 0 everywhere (the old convention, when the shards' --lr trained): a warning, then
    # the join (which fails here).
    import ps_server
    with pytest.warns(UserWarning, match=r"the wrapped optimizer's lr is 0 in every "
                      r"param_group, and the shards step with it: nothing will train"):
        with pytest.raises(ps_server.Error, match="joining shard 0"):
            pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                     named_parameters=model.named_parameters(),
                                     connect_timeout=0.2)


def test_changing_momentum_mid_run_is_an_error(server_bin):
    """The shards mirror the hyperparameters registered at join and follow lr only: an
    edit of another (by hand, or a scheduler cycling momentum) is an error naming the
    key, both values and the fix."""
    import ps_server.torch as pst

    model = make_model()
    with shards_for(server_bin, workers=1, num_shards=1) as shards:
        pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                 token_file=shards.token_file(0))
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                       named_parameters=model.named_parameters())
        gen = torch.Generator().manual_seed(0)
        loss_of(model, gen).backward()
        opt.step()
        opt.param_groups[0]["momentum"] = 0.5
        opt.zero_grad()
        loss_of(model, gen).backward()
        with pytest.raises(ValueError, match=r"param_groups\[0\]\['momentum'\] is 0.5 now, but "
                           r"the shards were registered with momentum=0.9: they mirror changes "
                           r"of lr only .*OneCycleLR\(\.\.\., cycle_momentum=False\)"):
            opt.step()
        opt.close()

    # OneCycleLR cycles Adam's beta1 unless told not to.
    with shards_for(server_bin, workers=1, num_shards=1) as shards:
        pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                 token_file=shards.token_file(0))
        opt = pst.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=0.01),
                                       named_parameters=model.named_parameters())
        torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
        loss_of(model, gen).backward()
        with pytest.raises(ValueError, match=r"param_groups\[0\]\['betas'\] is \(0.95, 0.999\) "
                           r"now, but the shards were registered with betas=\(0.9, 0.999\)"):
            opt.step()
        opt.close()


def test_workers_must_register_the_same_optimizer(server_bin):
    """The specs are part of the layout: a worker whose wrapped optimizer differs (here
    its lr) is refused at join, the tensor named."""
    import ps_server
    import ps_server.torch as pst

    with shards_for(server_bin, workers=2, num_shards=1) as shards:
        opts = []
        for w, lr in ((0, 1e-3), (1, 2e-3)):
            pst.init(shards=shards.addresses, worker_id=w, num_workers=2,
                     token_file=shards.token_file(w))
            model = make_model()
            make = lambda: pst.DistributedOptimizer(  # noqa: E731
                torch.optim.Adam(model.parameters(), lr=lr),
                named_parameters=model.named_parameters(), connect_timeout=5)
            if w == 0:
                opts.append(make())
                continue
            with pytest.raises(ps_server.Error, match=r"(?s)tensor 0 differs.*0\.weight"):
                make()
        for opt in opts:
            opt.close()


def test_a_lying_minority_cannot_move_the_lr(server_bin):
    """Three workers, one of which pushes lr 100 with its honest gradients: the shards
    step with the median of the three lrs, the honest ones'."""
    def make_optimizer(model):
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)

    def lie(w, opt):
        if w == 2:
            opt._lr = lambda i: 100.0

    want = reference(make_optimizer, step_lr, workers=3, steps=4)
    with shards_for(server_bin, workers=3) as shards:
        got, _ = distributed(shards, make_optimizer, step_lr, workers=3, steps=4, lie=lie)
    assert_matches(got, want, "median lr")


def rmsprop(model):
    return torch.optim.RMSprop(model.parameters(), lr=0.01, alpha=0.9, momentum=0.5,
                               centered=True)


def halving(opt):
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)


def test_optimizer_on_worker_steps_any_optimizer_on_the_aggregate(server_bin):
    """optimizer_on="worker" on --aggregate-only shards: each step pulls the round's
    aggregate into .grad and takes the wrapped optimizer's own step (RMSprop, which the
    shards cannot mirror, under LambdaLR). (Its broadcasts, which go through shard 0's
    object store there: test_torch.py's test_buffers_objects_and_optimizer_state_...)"""
    want = reference(rmsprop, halving)
    with shards_for(server_bin, server_args=("--aggregate-only",)) as shards:
        got, opts = distributed(shards, rmsprop, halving, optimizer_on="worker")
    assert all(spec == "" for spec in opts[0].specs.values())
    assert opts[0].state  # the wrapped optimizer's own state, on the worker
    assert_matches(got, want, "RMSprop on the aggregate")


def test_optimizer_on_worker_and_shards_check_the_shards(server_bin):
    """optimizer_on="worker" needs --aggregate-only shards, and the default needs shards
    that apply the update; each refusal names the fix."""
    import ps_server.torch as pst

    model = make_model()
    for aggregate_only in (False, True):
        args = ("--aggregate-only",) if aggregate_only else ()
        with shards_for(server_bin, workers=1, num_shards=1, server_args=args) as shards:
            pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                     token_file=shards.token_file(0))
            if aggregate_only:
                with pytest.raises(ValueError, match=r"these run --aggregate-only .*pass "
                                   r"DistributedOptimizer\(\.\.\., optimizer_on='worker'\)"):
                    pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters())
            else:
                with pytest.raises(ValueError, match=r"shard 0 applies the update itself: "
                                   r"start every ps-server with --aggregate-only"):
                    pst.DistributedOptimizer(torch.optim.RMSprop(model.parameters()),
                                             named_parameters=model.named_parameters(),
                                             optimizer_on="worker")


def test_worker_push_carries_an_lr(server_bin):
    """ps_server.Worker.push(..., lr=): the rate reaches the shard, which steps with it in
    place of the spec's lr; a rate that is not finite and >= 0 is refused before anything
    is queued."""
    import ps_server

    spec = "sgd(lr=0.1, momentum=0.0, dampening=0.0, nesterov=0, weight_decay=0.0)"
    with shards_for(server_bin, workers=1, num_shards=1) as shards:
        with ps_server.Worker(shards.addresses, 0, [("w", 2, 0, 0, spec)],
                              initial=[np.zeros(2, np.float32)],
                              token_file=shards.token_file(0)) as w:
            out = np.zeros(2, np.float32)
            w.push("w", 0, np.ones(2, np.float32))  # no lr: the spec's 0.1
            w.wait_pushes()
            w.pull_all(1, [out])
            np.testing.assert_allclose(out, [-0.1, -0.1], rtol=1e-6)
            w.push("w", 1, np.ones(2, np.float32), lr=2.0)
            w.wait_pushes()
            w.pull_all(2, [out])
            np.testing.assert_allclose(out, [-2.1, -2.1], rtol=1e-6)
            for bad in (float("nan"), float("inf"), -1.0):
                with pytest.raises(ValueError, match="lr must be a finite float >= 0"):
                    w.push("w", 2, np.ones(2, np.float32), lr=bad)
