"""ps_server.torch: DistributedOptimizer in training scripts started by ps-launch, against
a plain PyTorch reference of the same steps (SGD on the mean gradient, which the shards
mirror from the wrapped optimizer), with
and without the per-module waits (P3), with gradient accumulation, and its errors."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import ps_server.torch as pst

    mode, out = sys.argv[1], sys.argv[2]
    pst.init()
    torch.manual_seed(0)  # every worker builds the same model
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    passes = 2 if mode == "accumulate" else 1
    local = mode == "adacomm"
    opt = pst.DistributedOptimizer(
        # Mirrored by the shards in sync mode; the local SGD with comm="adacomm".
        torch.optim.SGD(model.parameters(), lr=0.05 if local else 0.1),
        named_parameters=model.named_parameters(), model=None if mode == "whole" else model,
        backward_passes_per_step=passes, comm="adacomm" if local else "sync", tau0=3,
        tau_max=3, borrow=mode == "borrow")
    pst.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(100 + pst.rank())
    for step in range(8 if local else 3):
        opt.zero_grad()
        for _ in range(passes):
            x = torch.randn(8, 4, generator=g)
            y = torch.randn(8, 2, generator=g)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
        opt.step(loss=loss)
    opt.synchronize()
    with open(f"{out}.{pst.rank()}", "w") as fh:
        json.dump({"params": {n: p.detach().tolist() for n, p in model.named_parameters()},
                   "periods": opt.periods, "comm": opt.comm,
                   "plane": opt.worker.data_plane,
                   "borrowed": opt.worker.stats()["slices_borrowed"]}, fh)
    opt.close()
""")


def reference(workers, passes, lr=0.1, steps=3):
    """The same steps in plain PyTorch: SGD (no momentum) on the mean over workers of each
    worker's gradient (summed over its passes)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    gens = [torch.Generator().manual_seed(100 + w) for w in range(workers)]
    for _ in range(steps):
        grads = []
        for w in range(workers):
            model.zero_grad()
            for _ in range(passes):
                x = torch.randn(8, 4, generator=gens[w])
                y = torch.randn(8, 2, generator=gens[w])
                torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= lr * torch.stack([g[i] for g in grads]).mean(dim=0)
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


def local_reference(workers, periods, lr=0.05):
    """Local updates in plain PyTorch: per round, every worker takes its round's steps of
    SGD from the shared parameters on its own data; the parameters then move by the mean
    of the workers' changes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    gens = [torch.Generator().manual_seed(100 + w) for w in range(workers)]
    for tau in periods:
        start = [p.detach().clone() for p in model.parameters()]
        ends = []
        for w in range(workers):
            with torch.no_grad():
                for p, x0 in zip(model.parameters(), start):
                    p.copy_(x0)
            sgd = torch.optim.SGD(model.parameters(), lr=lr)
            for _ in range(tau):
                sgd.zero_grad()
                x = torch.randn(8, 4, generator=gens[w])
                y = torch.randn(8, 2, generator=gens[w])
                torch.nn.functional.mse_loss(model(x), y).backward()
                sgd.step()
            ends.append([p.detach().clone() for p in model.parameters()])
        with torch.no_grad():
            for i, (p, x0) in enumerate(zip(model.parameters(), start)):
                p.copy_(x0 - torch.stack([x0 - e[i] for e in ends]).mean(dim=0))
    return {n: p.detach().numpy() for n, p in model.named_parameters()}


def launch(tmp_path, server_bin, mode, workers=2, lr=0.1, plane="grpc", script_text=SCRIPT):
    script = tmp_path / "train.py"
    script.write_text(script_text)
    out = tmp_path / "params.json"
    cmd = [sys.executable, "-m", "ps_server.launch", "--shards", "2", "--workers", str(workers),
           "--lr", str(lr), "--momentum", "0", "--server", server_bin, "--data-plane", plane,
           "--log-dir", str(tmp_path / "logs"), str(script), mode, str(out)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=240)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("worker-*.log")))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    return [json.loads((tmp_path / f"params.json.{w}").read_text()) for w in range(workers)]


# The per-module waits once more over the TCP data plane (ps-launch --data-plane tcp): the
# pulls land in the parameters' memory slice by slice there too. "borrow" is per_module
# with borrow=True: the gradients leave from their .grad (slices_borrowed counts them).
@pytest.mark.parametrize("mode,passes,plane", [("per_module", 1, "grpc"), ("whole", 1, "grpc"),
                                               ("accumulate", 2, "grpc"),
                                               ("per_module", 1, "tcp"), ("borrow", 1, "tcp")])
def test_training_matches_sgd_on_the_mean_gradient(tmp_path, server_bin, mode, passes, plane):
    got = launch(tmp_path, server_bin, mode, plane=plane)
    assert [g["plane"] for g in got] == [plane, plane]
    for g in got:
        assert (g["borrowed"] > 0) == (mode == "borrow"), g["borrowed"]
    want = reference(2, passes)
    for name, value in want.items():
        for w in range(2):
            np.testing.assert_allclose(np.array(got[w]["params"][name], np.float32), value,
                                       rtol=1e-5, atol=1e-6,
                                       err_msg=f"worker {w}, {name}, {mode}, {plane}")


def test_local_updates_match_the_mean_of_the_workers_changes(tmp_path, server_bin):
    # comm="adacomm" against shards that add changes as they are (lr 1, momentum 0): 8
    # local steps in rounds of AdaComm's period (tau0 = tau_max = 3, so 3 until the loss
    # has fallen enough; the last round is what synchronize() pushes).
    got = launch(tmp_path, server_bin, "adacomm", lr=1)
    periods = got[0]["periods"]
    assert got[0]["comm"] == "adacomm" and got[1]["periods"] == periods
    assert sum(periods) == 8 and periods[0] == 3 and len(periods) >= 3, periods
    want = local_reference(2, periods)
    for name, value in want.items():
        for w in range(2):
            np.testing.assert_allclose(np.array(got[w]["params"][name], np.float32), value,
                                       rtol=1e-5, atol=1e-6, err_msg=f"worker {w}, {name}")


def test_comm_auto_and_adacomm_check_the_shards(server_bin):
    from ps_server.launch import Shards
    import ps_server.torch as pst

    model = torch.nn.Linear(3, 2)
    for lr, want in ((1.0, "adacomm"), (0.1, "sync")):
        with Shards(1, 1, lr=lr, momentum=0.0, server=server_bin) as shards:
            pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                     token_file=shards.token_file(0))
            opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                           named_parameters=model.named_parameters(),
                                           comm="auto")
            assert opt.comm == want, lr
            if want == "adacomm":
                with pytest.raises(ValueError, match="needs each step's training loss"):
                    opt.step()
            opt.close()
            if want == "sync":
                with pytest.raises(ValueError, match="--lr 1 --momentum 0 --weight-decay 0"):
                    pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                             named_parameters=model.named_parameters(),
                                             comm="adacomm")
    with pytest.raises(ValueError, match="not one of: sync, adacomm, auto"):
        pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), comm="local")


def test_a_backward_pass_too_many_is_an_error(tmp_path, server_bin):
    from ps_server.launch import Shards
    import ps_server.torch as pst

    with Shards(1, 1, server=server_bin) as shards:
        pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                 token_file=shards.token_file(0))
        model = torch.nn.Linear(3, 1)
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        for _ in range(2):
            model(torch.ones(2, 3)).sum().backward()
        with pytest.raises(ValueError, match="backward_passes_per_step is 1"):
            opt.step()
        opt.close()


def test_divergence_is_reported_as_such_naming_the_rule(server_bin):
    """Parameters that are no longer finite (what a Byzantine worker does to a mean) make
    every gradient non-finite: step() says the model diverged and names the shards' rule,
    instead of the codec's "cannot encode value 0: not finite"."""
    from ps_server.launch import Shards
    import ps_server.torch as pst

    with Shards(1, 1, aggregator="mean", server=server_bin) as shards:
        pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                 token_file=shards.token_file(0))
        model = torch.nn.Linear(3, 1)
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        opt.synchronize()
        with torch.no_grad():
            model.weight.fill_(float("nan"))  # as if pulled so from the shards
        (model(torch.ones(2, 3)) ** 2).sum().backward()  # every gradient nan
        with pytest.raises(ValueError, match=r"the model diverged: after version 0 the "
                           r"parameters 'weight' are not finite; the shards aggregate with "
                           r"mean, which one Byzantine worker"):
            opt.step()
        opt.close()


def test_frozen_parameters_are_neither_registered_nor_moved(server_bin):
    """requires_grad=False (a frozen layer, as for fine-tuning): the parameter is not in
    the shards' model, so no zeros are pushed for it and the shards' weight decay cannot
    move it; the trained ones move as before."""
    from ps_server.launch import Shards
    import ps_server.torch as pst

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    for p in model[0].parameters():
        p.requires_grad_(False)
    frozen = [p.detach().clone() for p in model[0].parameters()]
    trained = [p.detach().clone() for p in model[1].parameters()]
    with Shards(1, 1, lr=0.1, momentum=0.0, server_args=("--weight-decay", "0.5"),
                server=server_bin) as shards:
        pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                 token_file=shards.token_file(0))
        opt = pst.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, weight_decay=0.5),
            named_parameters=model.named_parameters(), model=model)
        assert opt.frozen == ["0.weight", "0.bias"]
        assert opt._names == ["1.weight", "1.bias"]
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            opt.step()
        opt.synchronize()
        for before, p in zip(frozen, model[0].parameters()):
            assert torch.equal(before, p.detach())
        for before, p in zip(trained, model[1].parameters()):
            assert not torch.equal(before, p.detach())
        opt.close()
        with pytest.raises(ValueError, match=r"no parameters to train \(frozen: 0.weight, 0.bias\)"):
            pst.DistributedOptimizer(torch.optim.SGD(model[0].parameters(), lr=0.1),
                                     named_parameters=model[0].named_parameters(prefix="0"))


ROOT_SCRIPT = textwrap.dedent("""
    import json, sys, time
    import torch
    import ps_server.torch as pst

    out = sys.argv[2]
    pst.init()
    torch.manual_seed(pst.rank())  # each worker its own initial values
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    if pst.rank() == 0:
        time.sleep(1.5)  # loading a checkpoint: the other rank joins first
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p.fill_(0.25 * (i + 1))
    opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), model=model)
    pst.broadcast_parameters(model.state_dict(), root_rank=0)
    with open(f"{out}.{pst.rank()}", "w") as fh:
        json.dump({"params": [p.detach().flatten().tolist() for p in model.parameters()],
                   "adopted": opt.root_values_adopted}, fh)
    opt.close()
""")


def test_every_worker_starts_from_root_ranks_values(tmp_path, server_bin):
    """Resuming the Horovod way: rank 0 loads a checkpoint, then broadcast_parameters from
    root_rank 0. Rank 1 joins first with values of its own; the shards must still start
    from rank 0's (before, whichever worker joined first registered its values)."""
    got = launch(tmp_path, server_bin, "root", script_text=ROOT_SCRIPT)
    assert got[0]["adopted"] is True and got[1]["adopted"] is None
    for w in range(2):
        for i, values in enumerate(got[w]["params"]):
            assert values == [0.25 * (i + 1)] * len(values), (w, i)


ROLLBACK_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import ps_server.torch as pst

    out = sys.argv[2]
    pst.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), model=model)
    pst.broadcast_parameters(model.state_dict(), root_rank=0)
    g = torch.Generator().manual_seed(100 + pst.rank())

    def train(steps):
        for _ in range(steps):
            opt.zero_grad()
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 2, generator=g)
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        opt.synchronize()

    def params():
        return {n: p.detach().tolist() for n, p in model.named_parameters()}

    train(1)
    saved = {k: v.clone() for k, v in model.state_dict().items()}  # rank 0's checkpoint
    train(2)
    if pst.rank() == 0:
        model.load_state_dict(saved)  # the rollback, on the root only
    pst.broadcast_parameters(model.state_dict(), root_rank=0)
    after, at = params(), opt.round
    train(2)
    with open(f"{out}.{pst.rank()}", "w") as fh:
        json.dump({"saved": {n: saved[n].tolist() for n, _ in model.named_parameters()},
                   "after": after, "at": at, "final": params(), "round": opt.round}, fh)
    opt.close()
""")


def test_broadcast_parameters_mid_run_rolls_every_worker_back_to_the_roots_checkpoint(
        tmp_path, server_bin):
    """Horovod's rollback: after 3 steps rank 0 loads its checkpoint of step 1 and every
    worker calls broadcast_parameters(root_rank=0). Every worker then holds rank 0's
    values exactly (the shards adopted them as version 4), and the next two steps equal
    plain PyTorch from those values with a fresh SGD-with-momentum (the shards restart
    their optimizer state at an adoption) on the mean gradient, 2 shards, 3 workers."""
    got = launch(tmp_path, server_bin, "rollback", workers=3, script_text=ROLLBACK_SCRIPT)
    saved = got[0]["saved"]
    for w in range(3):
        assert got[w]["after"] == saved, w
        assert got[w]["at"] == 4 and got[w]["round"] == 6, w
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.tensor(saved[n]))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gens = [torch.Generator().manual_seed(100 + w) for w in range(3)]
    for gen in gens:  # the batches of the three steps before the rollback
        for _ in range(3):
            torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)
    for _ in range(2):
        grads = []
        for gen in gens:
            model.zero_grad()
            x, y = torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen)
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for i, p in enumerate(model.parameters()):
            p.grad = torch.stack([gr[i] for gr in grads]).mean(dim=0)
        sgd.step()
    for w in range(3):
        for n, p in model.named_parameters():
            np.testing.assert_allclose(np.array(got[w]["final"][n]), p.detach().numpy(),
                                       rtol=1e-5, atol=1e-6, err_msg=f"worker {w} {n}")


def test_broadcast_parameters_after_the_shards_moved_on(server_bin):
    """Shards that already hold parameters (a run that went on; a restored checkpoint)
    keep them at start, and the root is warned that its values were not adopted; after
    training started broadcast_parameters is the collective adoption (here of the one
    worker, which is the whole quorum): a checkpoint loaded mid-run becomes the model."""
    from ps_server.launch import Shards
    import ps_server.torch as pst

    model = torch.nn.Linear(3, 2)
    with Shards(1, 1, lr=0.1, momentum=0.0, server=server_bin) as shards:
        pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                 token_file=shards.token_file(0))
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        assert opt.root_values_adopted is True
        pst.broadcast_parameters(model.state_dict(), root_rank=0)  # at start: no warning
        for _ in range(2):
            opt.zero_grad()
            model(torch.ones(2, 3)).sum().backward()
            opt.step()
        with torch.no_grad():
            model.weight.fill_(7.0)  # a checkpoint loaded mid-run
        loaded = [p.detach().clone() for p in model.parameters()]
        pst.broadcast_parameters(model.state_dict(), root_rank=0)
        assert opt.round == 3  # the adopted values are version 2 + 1
        for want, p in zip(loaded, model.parameters()):
            assert torch.equal(want, p.detach())
        opt.zero_grad()
        model(torch.ones(2, 3)).sum().backward()
        opt.step()
        opt.synchronize()
        # The shards stepped from the adopted values: weight 7 - 0.1 x (its gradient, 2).
        assert torch.allclose(model.weight.detach(), torch.full((2, 3), 7.0 - 0.1 * 2.0))
        trained = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(ValueError, match=r"root_rank 1 outside \[0, 1\)"):
            pst.broadcast_parameters(model.state_dict(), root_rank=1)
        opt.close()

        # The worker restarts with fresh values while the shards went on: theirs win.
        fresh = torch.nn.Linear(3, 2)
        opt = pst.DistributedOptimizer(torch.optim.SGD(fresh.parameters(), lr=0.1),
                                       named_parameters=fresh.named_parameters())
        assert opt.root_values_adopted is False and opt.round == 4
        with pytest.warns(UserWarning, match="rank 0's values were not adopted"):
            pst.broadcast_parameters(fresh.state_dict(), root_rank=0)
        for want, p in zip(trained, fresh.parameters()):
            assert torch.equal(want, p.detach())
        opt.close()


def test_other_ranks_wait_for_the_root_to_register(server_bin):
    """A rank other than root_rank never registers its own values: alone, it waits for the
    root and then says what it waited for."""
    from ps_server.launch import Shards
    import ps_server
    import ps_server.torch as pst

    model = torch.nn.Linear(3, 2)
    with Shards(1, 2, server=server_bin) as shards:
        pst.init(shards=shards.addresses, worker_id=1, num_workers=2,
                 token_file=shards.token_file(1))
        with pytest.raises(ps_server.Error, match=r"has no parameters yet, and worker 1 does not "
                           r"register them \(it starts from the root worker's\)"):
            pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                     named_parameters=model.named_parameters(),
                                     connect_timeout=1.0)
        with pytest.raises(ValueError, match=r"root_rank 2 outside \[0, 2\)"):
            pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), root_rank=2)


def test_clipping_reaches_the_shards_with_overlap_off_and_is_refused_with_it_on(server_bin):
    """clip_grad_norm_ between backward and step: with the default overlap the gradients
    left during backward, so step() says the clipping reached no shard and names the fix;
    with overlap=False (Horovod's synchronize() / skip_synchronize() pattern too) the
    shards step with the clipped gradient."""
    from ps_server.launch import Shards
    import ps_server.torch as pst

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    with Shards(1, 1, lr=1.0, momentum=0.0, server=server_bin) as shards:
        pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                 token_file=shards.token_file(0))
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        (model(x) ** 2).sum().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1)
        with pytest.raises(ValueError, match=r"the gradients of 'weight', 'bias' changed after "
                           r"backward pushed them \(clip_grad_norm_.*overlap=False"):
            opt.step()
        opt.close()

    with Shards(1, 1, lr=1.0, momentum=0.0, server=server_bin) as shards:
        pst.init(shards=shards.addresses, worker_id=0, num_workers=1,
                 token_file=shards.token_file(0))
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                       named_parameters=model.named_parameters(), overlap=False)
        before = [p.detach().clone() for p in model.parameters()]
        opt.zero_grad()
        (model(x) ** 2).sum().backward()
        opt.synchronize()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=0.1)
        assert norm > 1.0  # the clipping changes the gradient a lot
        clipped = [p.grad.clone() for p in model.parameters()]
        with opt.skip_synchronize():
            opt.step()
        opt.synchronize()
        for b, g, p in zip(before, clipped, model.parameters()):
            torch.testing.assert_close(p.detach(), b - g, rtol=1e-6, atol=1e-7)
        opt.close()


def test_init_reads_torchruns_environment(monkeypatch, tmp_path):
    """torchrun sets RANK, WORLD_SIZE and LOCAL_RANK, not PS_WORKER_ID and PS_NUM_WORKERS:
    init() takes them, finds this rank's token in PS_RUN_DIR, and refuses a PS_ value that
    disagrees with torchrun's."""
    import ps_server.torch as pst

    for name in ("PS_WORKER_ID", "PS_NUM_WORKERS", "PS_TOKEN_FILE", "LOCAL_RANK",
                 "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PS_SHARDS", "127.0.0.1:1")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError,
                       match=r"PS_WORKER_ID \(or torchrun's RANK, or Slurm's SLURM_PROCID\) is not set"):
        pst.init()
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("PS_RUN_DIR", str(tmp_path))
    pst.init()
    assert (pst.rank(), pst.size(), pst.local_rank()) == (2, 4, 0)
    assert pst._context["token_file"] == str(tmp_path / "token-worker-2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("PS_TOKEN_FILE", "/given/token")
    pst.init()
    assert pst.local_rank() == 1
    assert pst._context["token_file"] == "/given/token"
    monkeypatch.setenv("PS_WORKER_ID", "2")  # the same: fine
    pst.init()
    monkeypatch.setenv("PS_WORKER_ID", "3")
    with pytest.raises(ValueError, match="PS_WORKER_ID=3 but torchrun's RANK=2"):
        pst.init()
    monkeypatch.setenv("PS_NUM_WORKERS", "5")
    monkeypatch.setenv("PS_WORKER_ID", "2")
    with pytest.raises(ValueError, match="PS_NUM_WORKERS=5 but torchrun's WORLD_SIZE=4"):
        pst.init()


def test_init_reads_a_slurm_tasks_environment(monkeypatch, tmp_path):
    """`srun python train.py`: each task's SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID
    are its rank, the size and its local rank, where no PS_ or torchrun value is set;
    where one is (ps-launch --slurm's one-task steps all have SLURM_PROCID=0), it wins."""
    import ps_server.torch as pst

    for name in ("PS_WORKER_ID", "PS_NUM_WORKERS", "PS_TOKEN_FILE", "LOCAL_RANK", "RANK",
                 "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PS_SHARDS", "127.0.0.1:1")
    monkeypatch.setenv("PS_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_PROCID", "5")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    pst.init()
    assert (pst.rank(), pst.size(), pst.local_rank()) == (5, 8, 1)
    assert pst._context["token_file"] == str(tmp_path / "token-worker-5")
    # A ps-launch --slurm step: one task (PROCID 0 of 1), worker 3 of 4 by PS_ values.
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    monkeypatch.setenv("SLURM_LOCALID", "0")
    monkeypatch.setenv("PS_WORKER_ID", "3")
    monkeypatch.setenv("PS_NUM_WORKERS", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    pst.init()
    assert (pst.rank(), pst.size(), pst.local_rank()) == (3, 4, 1)
    # torchrun's values come before Slurm's (torchrun inside an allocation).
    for name in ("PS_WORKER_ID", "PS_NUM_WORKERS", "LOCAL_RANK"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    pst.init()
    assert (pst.rank(), pst.size(), pst.local_rank()) == (2, 4, 0)


def test_init_needs_its_environment(monkeypatch):
    import ps_server.torch as pst

    for name in ("PS_SHARDS", "PS_WORKER_ID", "PS_NUM_WORKERS", "PS_TOKEN_FILE", "PS_RUN_DIR",
                 "RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS",
                 "SLURM_LOCALID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="PS_SHARDS is not set"):
        pst.init()
    with pytest.raises(ValueError, match="outside"):
        pst.init(shards="127.0.0.1:1", worker_id=3, num_workers=2)
    pst.init(shards="127.0.0.1:1,127.0.0.1:2", worker_id=1, num_workers=2)
    assert (pst.rank(), pst.size(), pst.shards()) == (1, 2, ["127.0.0.1:1", "127.0.0.1:2"])
    model = torch.nn.Linear(2, 2).double()
    with pytest.raises(TypeError, match="float32"):
        pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1),
                                 named_parameters=model.named_parameters())
    # ps_server.Worker's options pass through, checked before anything is sent.
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match='data_plane must be "grpc", "tcp" or None'):
        pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1),
                                 named_parameters=model.named_parameters(), data_plane="udp",
                                 connect_timeout=1)


OBJECTS_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    import ps_server.torch as pst

    mode, out = sys.argv[1], sys.argv[2]
    pst.init()
    rank = pst.rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3),
                                torch.nn.Linear(3, 2))
    model[2].bias.requires_grad_(False)  # frozen: not trained by the shards
    with torch.no_grad():  # each rank's buffers and frozen values its own
        model[1].running_mean.fill_(rank + 1.0)
        model[1].num_batches_tracked.fill_(10 * (rank + 1))
        model[2].bias.fill_(-(rank + 1.0))
        if mode == "worker":
            for p in model.parameters():
                p.add_(rank)  # differ everywhere: the broadcast must bring rank 0's
    worker = mode == "worker"
    opt = pst.DistributedOptimizer(
        torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.01),
        named_parameters=model.named_parameters(),
        optimizer_on="worker" if worker else "shards")
    pst.broadcast_parameters(model.state_dict(), root_rank=0)
    after_broadcast = {n: t.tolist() for n, t in model.state_dict().items()}
    got = pst.broadcast_object({"epoch": 3 + rank, "note": f"from {rank}",
                                "t": torch.arange(3.0) * (rank + 1), "tup": (1, b"x")},
                               root_rank=0, name="meta")
    again = pst.broadcast_object(rank, root_rank=0, name="rank")
    refused = ""
    if rank == 0:  # refused on the root before anything is sent (the others would wait)
        try:
            pst.broadcast_object(object(), root_rank=0)
        except TypeError as e:
            refused = str(e)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(2):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.randn(8, 4, generator=g)),
                                     torch.randn(8, 2, generator=g)).backward()
        opt.step()
    opt.synchronize()
    if worker and rank == 1:
        opt.optimizer.state.clear()  # as a restarted worker's: rank 0's comes back
    pst.broadcast_optimizer_state(opt, root_rank=0)
    state = opt.optimizer.state_dict()["state"]
    with open(f"{out}.{rank}", "w") as fh:
        json.dump({"after_broadcast": after_broadcast,
                   "got": {"epoch": got["epoch"], "note": got["note"], "t": got["t"].tolist(),
                           "tup": [got["tup"][0], got["tup"][1].decode()]},
                   "again": again, "refused": refused,
                   "state": {str(k): {n: (v.tolist() if torch.is_tensor(v) else v)
                                      for n, v in s.items()} for k, s in state.items()},
                   "params": [p.detach().tolist() for p in model.parameters()]}, fh)
    opt.close()
""")


@pytest.mark.parametrize("mode", ["shards", "worker"])
def test_buffers_objects_and_optimizer_state_come_from_the_root(tmp_path, server_bin, mode):
    """Horovod's broadcasts through shard 0's object store: broadcast_parameters gives every
    worker rank 0's buffers (BatchNorm statistics) and frozen parameters too, and with
    optimizer_on="worker" (aggregate-only shards, which hold no parameters) all of rank
    0's values; broadcast_object returns rank 0's object, tensors and tuples included, and
    refuses what it would need pickle for; broadcast_optimizer_state gives a worker that
    lost its optimizer state rank 0's (with the shards mirroring the optimizer there is
    one state, on the shards, and nothing to move)."""
    script = tmp_path / "objects.py"
    script.write_text(OBJECTS_SCRIPT)
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "ps_server.launch", "--shards", "2", "--workers", "2",
           "--server", server_bin, "--log-dir", str(tmp_path / "logs")]
    if mode == "worker":
        cmd += ["--server-arg=--aggregate-only"]
    cmd += [str(script), mode, str(out)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=240)
    logs = "".join(p.read_text() for p in sorted((tmp_path / "logs").glob("worker-*.log")))
    assert done.returncode == 0, done.stdout + done.stderr + logs
    got = [json.loads((tmp_path / f"out.json.{w}").read_text()) for w in range(2)]
    # Everything in the state_dict is rank 0's after the broadcast, on both ranks.
    assert got[0]["after_broadcast"] == got[1]["after_broadcast"]
    assert got[1]["after_broadcast"]["1.running_mean"] == [1.0, 1.0, 1.0]
    assert got[1]["after_broadcast"]["1.num_batches_tracked"] == 10
    assert got[1]["after_broadcast"]["2.bias"] == [-1.0, -1.0]
    for w in range(2):
        assert got[w]["got"] == {"epoch": 3, "note": "from 0", "t": [0.0, 1.0, 2.0],
                                 "tup": [1, "x"]}
        assert got[w]["again"] == 0
    assert "cannot be sent" in got[0]["refused"] and "pickle" in got[0]["refused"]
    # Training kept the workers equal, and their optimizer states are rank 0's.
    assert got[0]["params"] == got[1]["params"]
    assert got[0]["state"] == got[1]["state"]
    if mode == "worker":
        assert got[1]["state"], "rank 0's Adam state was not brought back"
    else:
        assert got[0]["state"] == {}, "the shards hold the state; the wrapped one stays empty"
