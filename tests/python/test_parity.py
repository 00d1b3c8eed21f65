"""A Python worker's pushes are byte-identical to the C++ worker's.

The same gradients go out twice, each time to a fresh ps-server (authenticated, as by
default; on the gRPC data plane, so that the pushes are ps.v1 calls) through a
recording gRPC proxy (ps-test-push-capture proxy, tests/python/
push_capture.cc): once from a C++ ps::Worker (ps-test-push-capture push), once from
ps_server.Worker with numpy arrays and once with torch tensors. The proxy writes every
Push request as it came, payload included, with only the session token cleared (the
shard issues a new one at each join). Four tensors, four codecs (lossless, rounding,
sparse with error feedback, stochastic quantization with a seed), three rounds with a
pull between: every push request must be equal byte for byte."""

import os
import signal
import subprocess
import tempfile
import time

import numpy as np
import pytest

import ps_server
from ps_server.launch import Shards

# name, numel, codec; "c" spans three slices of 1024.
TENSORS = [("a", 700, "fp32"), ("b", 300, "fp16"), ("c", 2500, "topk(0.05)+varint+fp16"),
           ("d", 1000, "qsgd(s=4)")]
ROUNDS = 3
SLICE_ELEMS = 1024
SEED = 7


def gradients():
    rng = np.random.default_rng(3)
    return [[rng.normal(size=n).astype(np.float32) * np.float32(t + 1)
             for t, (_, n, _) in enumerate(TENSORS)] for _ in range(ROUNDS)]


class Proxy:
    """ps-test-push-capture proxy in front of `upstream`, recording into `out`."""

    def __init__(self, binary, upstream, out):
        self.out = out
        port_file = os.path.join(out, "proxy.port")
        self.process = subprocess.Popen([binary, "proxy", "--upstream", upstream,
                                         "--port-file", port_file, "--out", out])
        deadline = time.monotonic() + 30
        while not os.path.exists(port_file):
            assert self.process.poll() is None, "the proxy exited during start-up"
            assert time.monotonic() < deadline, "the proxy did not serve within 30 s"
            time.sleep(0.02)
        with open(port_file) as fh:
            self.address = f"127.0.0.1:{int(fh.read())}"
        os.remove(port_file)

    def pushes(self):
        """{file name: bytes} of every recorded push."""
        got = {}
        for name in sorted(os.listdir(self.out)):
            with open(os.path.join(self.out, name), "rb") as fh:
                got[name] = fh.read()
        return got

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(30) == 0


def captured(server_bin, capture_bin, push):
    """Runs push(address, token_file) against a fresh shard behind a proxy; the pushes."""
    with Shards(1, 1, aggregator="mean", lr=0.1, momentum=0.0, server=server_bin,
                data_plane="grpc") as shards, \
            tempfile.TemporaryDirectory() as out:
        proxy = Proxy(capture_bin, shards.addresses[0], out)
        try:
            push(proxy.address, shards.token_file(0))
        finally:
            proxy.stop()
        return proxy.pushes()


def cpp_push(capture_bin, grads):
    def push(address, token_file):
        with tempfile.NamedTemporaryFile(suffix=".f32") as fh:
            fh.write(b"".join(g.tobytes() for round in grads for g in round))
            fh.flush()
            subprocess.run([capture_bin, "push", "--shards", address, "--token-file", token_file,
                            "--tensors", ",".join(f"{n}:{k}:{c}" for n, k, c in TENSORS),
                            "--grads", fh.name, "--rounds", str(ROUNDS), "--slice-elems",
                            str(SLICE_ELEMS), "--codec-seed", str(SEED), "--error-feedback"],
                           check=True, timeout=120)
    return push


def python_push(grads, convert):
    def push(address, token_file):
        w = ps_server.Worker([address], 0, [(n, k) for n, k, _ in TENSORS],
                             initial=[np.zeros(k, np.float32) for _, k, _ in TENSORS],
                             slice_elems=SLICE_ELEMS, token_file=token_file,
                             tensor_codecs={n: c for n, _, c in TENSORS}, codec_seed=SEED,
                             error_feedback=True, connect_timeout=30)
        outs = [np.empty(k, np.float32) for _, k, _ in TENSORS]
        for r, round_grads in enumerate(grads):
            for t, g in enumerate(round_grads):
                w.push(t, r, convert(g))
            w.wait_pushes()
            assert w.pull_all(r + 1, outs, timeout=30) == r + 1
        w.close()
    return push


def test_python_pushes_equal_the_cpp_workers_byte_for_byte(server_bin, capture_bin):
    grads = gradients()
    reference = captured(server_bin, capture_bin, cpp_push(capture_bin, grads))
    # 1 + 1 + 3 + 1 slices a round.
    assert len(reference) == 6 * ROUNDS, sorted(reference)
    assert all(len(b) > 0 for b in reference.values())

    from_numpy = captured(server_bin, capture_bin, python_push(grads, lambda g: g))
    assert sorted(from_numpy) == sorted(reference)
    for name, data in reference.items():
        assert from_numpy[name] == data, f"{name}: the Python worker's push differs"

    torch = pytest.importorskip("torch")
    # A 2-D tensor of the same values: shape does not matter, only the memory.
    from_torch = captured(server_bin, capture_bin,
                          python_push(grads, lambda g: torch.from_numpy(g.copy()).view(-1, 1)))
    assert from_torch == reference


def test_the_proxy_sees_a_difference(server_bin, capture_bin):
    # The comparison can fail: one value changed in one tensor changes that slice's push.
    grads = gradients()
    reference = captured(server_bin, capture_bin, cpp_push(capture_bin, grads))
    changed = [[g.copy() for g in round] for round in grads]
    changed[0][1][5] += np.float32(1.0)  # tensor "b" (fp16) in round 0
    other = captured(server_bin, capture_bin, python_push(changed, lambda g: g))
    differing = sorted(name for name in reference if other.get(name) != reference[name])
    # Tensor "b" is slice 1; its error feedback carries the change into later rounds.
    assert "push-1-0.bin" in differing and all(n.startswith("push-1-") for n in differing), \
        differing
