"""examples/python/train_fashion_mnist.py, briefly: the Python example trains on the real
dataset through ps-launch with a Byzantine worker and prints its final accuracy."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / \
    "train_fashion_mnist.py"
DATA = "/usr/share/datasets/fashion-mnist"


def test_the_example_trains_with_a_byzantine_worker(tmp_path, server_bin):
    pytest.importorskip("torch")
    if not os.path.exists(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")):
        pytest.fail(f"Fashion-MNIST not found in {DATA} (Debian: dataset-fashion-mnist)")
    cmd = [sys.executable, "-m", "ps_server.launch", "--shards", "2", "--workers", "4",
           "--byzantine", "1", "--aggregator", "trimmed_mean", "--lr", "0.05",
           "--momentum", "0.9", "--server", server_bin, "--log-dir", str(tmp_path),
           str(EXAMPLE), "--byzantine", "1", "--steps", "60", "--eval-every", "30"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step 30/60" in done.stdout
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == 60 and result["workers"] == 4 and result["byzantine"] == 1
    # 60 steps of 4 x 32 examples: well above chance (0.1) with the attacker held off.
    assert result["final_test_accuracy"] > 0.5, result
