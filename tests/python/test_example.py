"""examples/python/train_fashion_mnist.py, briefly: the Python example trains on the real
dataset through ps-launch with a Byzantine worker and prints its final accuracy."""

import json
import signal
import os
import pathlib
import subprocess
import sys

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / \
    "train_fashion_mnist.py"
DATA = "/usr/share/datasets/fashion-mnist"


def launch_command(tmp_path, server_bin, *launcher_args):
    """ps-launch of the example on 2 shards and 4 workers, f = 1 under the trimmed mean;
    fails the test without torch (skipped) or the dataset."""
    pytest.importorskip("torch")
    if not os.path.exists(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")):
        pytest.fail(f"Fashion-MNIST not found in {DATA} (Debian: dataset-fashion-mnist)")
    return [sys.executable, "-m", "ps_server.launch", "--shards", "2", "--workers", "4",
            "--byzantine", "1", "--aggregator", "trimmed_mean", "--lr", "0.05",
            "--momentum", "0.9", "--server", server_bin, "--log-dir", str(tmp_path),
            *launcher_args, str(EXAMPLE)]


def test_the_example_trains_with_a_byzantine_worker(tmp_path, server_bin):
    cmd = launch_command(tmp_path, server_bin) + ["--byzantine", "1", "--steps", "60",
                                                  "--eval-every", "30"]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=280)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "step 30/60" in done.stdout
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["steps"] == 60 and result["workers"] == 4 and result["byzantine"] == 1
    # 60 steps of 4 x 32 examples: well above chance (0.1) with the attacker held off.
    assert result["final_test_accuracy"] > 0.5, result


def worker_pid(launcher_pid, worker_id):
    """The pid of the launcher's child with PS_WORKER_ID=worker_id, or None."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != launcher_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if f"PS_WORKER_ID={worker_id}".encode() in env:
            return int(entry)
    return None


def test_a_killed_worker_restarted_by_ps_launch_resumes_where_the_job_is(tmp_path, server_bin):
    # Worker 2 is killed with SIGKILL after step 40; ps-launch --max-restarts starts it
    # again, it resumes at the shards' version (rounds wait for it: a 60 s deadline) and
    # the job ends as usual.
    cmd = launch_command(tmp_path, server_bin, "--max-restarts", "1",
                         "--server-arg=--round-deadline-ms", "--server-arg=60000") + [
        "--steps", "160", "--eval-every", "20"]
    launcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in launcher.stdout:
            lines.append(line)
            if line.startswith("step 40/160"):
                break
        pid = worker_pid(launcher.pid, 2)
        assert pid is not None, "worker 2 not found among the launcher's children"
        os.kill(pid, signal.SIGKILL)
        out, err = launcher.communicate(timeout=280)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    out = "".join(lines) + out
    log_file = tmp_path / "worker-2.log"
    log = log_file.read_text() if log_file.exists() else "(no worker-2.log)"
    assert launcher.returncode == 0, out + err + "\nworker-2.log:\n" + log
    assert "worker 2 exited with status -9; restarting it (restart 1 of --max-restarts 1)" in err
    resumed = [l for l in log.splitlines() if l.startswith("worker 2: resuming at step")]
    assert len(resumed) == 1, log
    assert int(resumed[0].split()[5]) >= 40, resumed
    result = json.loads(out.strip().splitlines()[-1])
    assert result["steps"] == 160
    assert result["final_test_accuracy"] > 0.6, result
