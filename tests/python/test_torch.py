"""ps_server.torch: DistributedOptimizer in training scripts started by ps-launch, against
a plain PyTorch reference of the same steps (the shards' SGD on the mean gradient), with
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
        # Unused in sync mode (the shards step); the local SGD with comm="adacomm".
        torch.optim.SGD(model.parameters(), lr=0.05 if local else 123.0),
        named_parameters=model.named_parameters(), model=None if mode == "whole" else model,
        backward_passes_per_step=passes, comm="adacomm" if local else "sync", tau0=3,
        tau_max=3)
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
                   "plane": opt.worker.data_plane}, fh)
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


def launch(tmp_path, server_bin, mode, workers=2, lr=0.1, plane="grpc"):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
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
# pulls land in the parameters' memory slice by slice there too.
@pytest.mark.parametrize("mode,passes,plane", [("per_module", 1, "grpc"), ("whole", 1, "grpc"),
                                               ("accumulate", 2, "grpc"),
                                               ("per_module", 1, "tcp")])
def test_training_matches_sgd_on_the_mean_gradient(tmp_path, server_bin, mode, passes, plane):
    got = launch(tmp_path, server_bin, mode, plane=plane)
    assert [g["plane"] for g in got] == [plane, plane]
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
        opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                                       named_parameters=model.named_parameters())
        for _ in range(2):
            model(torch.ones(2, 3)).sum().backward()
        with pytest.raises(ValueError, match="backward_passes_per_step is 1"):
            opt.step()
        opt.close()


def test_init_needs_its_environment(monkeypatch):
    import ps_server.torch as pst

    for name in ("PS_SHARDS", "PS_WORKER_ID", "PS_NUM_WORKERS", "PS_TOKEN_FILE"):
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
