#!/usr/bin/python3
"""Fashion-MNIST from a Python script through ps-server, with Byzantine workers.

The model, data and attack of ps-demo (docs/examples.md): an MLP 784-128-10 on
normalized pixels, each worker on its own IID part of the training set, batches of 32,
the shards' SGD (lr 0.05, momentum 0.9); the last --byzantine workers push -scale x
their gradient (sign flip; with --comm adacomm, -scale x the change of their local
steps). Start it with ps-launch:

    ps-launch --shards 2 --workers 6 --byzantine 1 --aggregator trimmed_mean \\
        --lr 0.05 --momentum 0.9 examples/python/train_fashion_mnist.py --byzantine 1

Worker 0 evaluates on the test set every --eval-every steps and at the end, printing
progress lines and a last JSON line {"final_test_accuracy": ...}. docs/python.md.

Also: --model cnn (two 5x5 convolutions, 16 and 32 channels, then a linear layer),
--optimizer adam (torch.optim.Adam, which the shards mirror; --lr sets either optimizer's
rate), --save PATH (worker 0 writes the model's state_dict at the end) and --load PATH
(worker 0 starts from it, which broadcast_parameters makes every worker's), and --plain:
the same training in this one process with plain PyTorch, each step on the union of the
batches the --workers N workers would draw (the same global batch), for comparison.
"""

import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch

import ps_server
import ps_server.torch as pst

PIXEL_MEAN, PIXEL_STD = 0.2860, 0.3530


def read_idx(path, magic):
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    got, = struct.unpack(">I", data[:4])
    if got != magic:
        raise ValueError(f"{path}: magic {got:#x}, expected {magic:#x}")
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"), 0x803)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), 0x801)
    x = (images.reshape(len(images), -1).astype(np.float32) / 255.0 - PIXEL_MEAN) / PIXEL_STD
    return torch.from_numpy(x), torch.from_numpy(labels.astype(np.int64))


class Mlp(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.fc1 = torch.nn.Linear(784, hidden)
        self.fc2 = torch.nn.Linear(hidden, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5)
        self.conv2 = torch.nn.Conv2d(16, 32, 5)
        self.fc = torch.nn.Linear(32 * 4 * 4, 10)

    def forward(self, x):
        x = x.view(-1, 1, 28, 28)
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def make_model(args):
    return Cnn() if args.model == "cnn" else Mlp(args.hidden)


def make_optimizer(args, model):
    if args.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=args.lr or 1e-3)
    return torch.optim.SGD(model.parameters(), lr=args.lr or 0.05, momentum=0.9)


class Batches:
    """Worker `rank`'s batches of its IID part of the training set: a permutation shared by
    all workers cut in equal parts, walked through in a shuffled order, reshuffled each
    pass."""

    def __init__(self, args, n, rank, size):
        order = np.random.default_rng(args.seed).permutation(n)
        self.mine = torch.from_numpy(np.array_split(order, size)[rank])
        self.g = torch.Generator().manual_seed(args.seed * 1000 + rank)
        self.size = args.batch_size
        self.epoch, self.position = self.mine[torch.randperm(len(self.mine), generator=self.g)], 0

    def next(self):
        if self.position + self.size > len(self.epoch):
            self.epoch = self.mine[torch.randperm(len(self.mine), generator=self.g)]
            self.position = 0
        batch = self.epoch[self.position:self.position + self.size]
        self.position += self.size
        return batch


def plain(args):
    """--plain: plain PyTorch on the global batch of --workers workers, in one process."""
    torch.manual_seed(args.seed)
    x_train, y_train = load(args.data_dir, "train")
    x_test, y_test = load(args.data_dir, "test")
    model = make_model(args)
    if args.load:
        model.load_state_dict(torch.load(args.load))
    optimizer = make_optimizer(args, model)
    workers = [Batches(args, len(x_train), r, args.workers) for r in range(args.workers)]
    start = time.monotonic()
    for step in range(args.steps):
        batch = torch.cat([w.next() for w in workers])
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
        loss.backward()
        optimizer.step()
        if (args.eval_every > 0 and (step + 1) % args.eval_every == 0) or step + 1 == args.steps:
            print(f"step {step + 1}/{args.steps}  loss {float(loss):.4f}  test accuracy "
                  f"{accuracy(model, x_test, y_test):.4f}  {time.monotonic() - start:.1f} s",
                  flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)
    print(json.dumps({"final_test_accuracy": accuracy(model, x_test, y_test),
                      "steps": args.steps, "workers": args.workers, "plain": True,
                      "seconds": time.monotonic() - start}), flush=True)


def accuracy(model, x, y):
    with torch.no_grad():
        return float((model(x).argmax(dim=1) == y).float().mean())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--byzantine", type=int, default=0,
                        help="the last this many workers attack (sign flip)")
    parser.add_argument("--byzantine-scale", type=float, default=10.0)
    parser.add_argument("--codec", default="fp32", help="push codec ('auto': Espresso's plan)")
    parser.add_argument("--comm", default="sync", choices=["sync", "adacomm", "auto"],
                        help="adacomm: local SGD steps (lr 0.05, momentum 0.9 here) between "
                             "pushes of the change, shards at --lr 1 --momentum 0; auto: "
                             "adacomm where the shards allow it (docs/python.md)")
    parser.add_argument("--eval-every", type=int, default=200,
                        help="worker 0 evaluates every N steps (0: only after the last)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    parser.add_argument("--optimizer", default="sgd", choices=["sgd", "adam"])
    parser.add_argument("--lr", type=float, default=0.0,
                        help="the optimizer's rate (default: 0.05 for SGD, 1e-3 for Adam)")
    parser.add_argument("--save", default="", help="worker 0 saves the model's state_dict")
    parser.add_argument("--load", default="", help="worker 0 starts from this state_dict")
    parser.add_argument("--plain", action="store_true",
                        help="plain PyTorch in this process on --workers workers' global batch")
    parser.add_argument("--workers", type=int, default=4, help="with --plain")
    args = parser.parse_args()
    if args.eval_every < 0:
        parser.error(f"--eval-every {args.eval_every}: must be 0 or more")
    if args.plain:
        plain(args)
        return

    pst.init()
    rank, size = pst.rank(), pst.size()
    torch.set_num_threads(1)  # n workers share the machine
    torch.manual_seed(args.seed)
    x_train, y_train = load(args.data_dir, "train")
    batches = Batches(args, len(x_train), rank, size)
    byzantine = rank >= size - args.byzantine

    model = make_model(args)
    if args.load and rank == 0:
        model.load_state_dict(torch.load(args.load))
    optimizer = pst.DistributedOptimizer(
        # With comm "sync" the shards apply this optimizer (its lr, momentum, betas,
        # mirrored per tensor: docs/optimizers.md); with local updates the workers step it,
        # ps-demo's.
        make_optimizer(args, model),
        named_parameters=model.named_parameters(), model=model, codec=args.codec,
        comm=args.comm,
        # Sign flip: what a Byzantine worker pushes (its gradient, or with local updates
        # the change of its honest local steps) is -scale x itself.
        push_transform=(lambda name, t: t * -args.byzantine_scale) if byzantine else None)
    pst.broadcast_parameters(model.state_dict(), root_rank=0)

    x_test = y_test = None
    if rank == 0:
        x_test, y_test = load(args.data_dir, "test")
    if rank == 0 and args.load:
        print(f"step 0/{args.steps}  test accuracy {accuracy(model, x_test, y_test):.4f} "
              f"(from {args.load})", flush=True)
    # Where the job is: 0 at the start; the shards' version when this worker was restarted
    # (ps-launch --max-restarts) or joins a job that went on. One round per step with
    # comm "sync"; local updates start over from their first step.
    first = optimizer.round if optimizer.comm == "sync" else 0
    if first:
        print(f"worker {rank}: resuming at step {first} of {args.steps}", flush=True)
        for _ in range(first):
            batches.next()  # the batches this worker's steps so far drew
    start = time.monotonic()
    for step in range(first, args.steps):
        batch = batches.next()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
        loss.backward()
        try:
            optimizer.step(loss=loss)
        except ps_server.Refused as e:
            # A Byzantine push the shards refuse (non-finite) is the attack failing; an
            # honest worker's refusal is an error.
            if not byzantine:
                raise
            print(f"worker {rank}: push refused ({e.reason}): {e}", file=sys.stderr)
        if rank == 0 and ((args.eval_every > 0 and (step + 1) % args.eval_every == 0)
                          or step + 1 == args.steps):
            if optimizer.comm == "sync":  # with local updates: this worker's own model
                optimizer.synchronize()
            acc = accuracy(model, x_test, y_test)
            print(f"step {step + 1}/{args.steps}  loss {float(loss):.4f}  "
                  f"test accuracy {acc:.4f}  {time.monotonic() - start:.1f} s", flush=True)
    optimizer.synchronize()
    if rank == 0 and args.save:
        torch.save(model.state_dict(), args.save)
    if rank == 0:
        acc = accuracy(model, x_test, y_test)
        print(json.dumps({"final_test_accuracy": acc, "steps": args.steps, "workers": size,
                          "byzantine": args.byzantine, "seconds": time.monotonic() - start}),
              flush=True)
    optimizer.close()


if __name__ == "__main__":
    main()
