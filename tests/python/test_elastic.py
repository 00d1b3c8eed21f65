"""Workers that die, against real ps-server processes: eight worker processes train on
two shards; one is killed with SIGKILL mid-training (it tells nobody). With
--worker-timeout-ms 2000 the shards stop waiting for it once it expired: no round after
3 s waits for it (a round that did would wait for its 10 s deadline, a rate of 0.1/s).

The rate after the kill against the rate before is printed (the issue's target is 0.9x;
measured alone 1.10-1.20x) but asserted only to be far above what waiting would give:
the test run starts other tests beside this one on two cores, and the CI machine once
measured 0.69x with a round never over 22 ms, which is load, not waiting."""

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import ps_server
from ps_server.launch import Shards

# One worker process: trains until killed, printing "ROUND <version> <monotonic time>"
# after each pull (worker 0 only).
WORKER = r"""
import os, sys, time
import numpy as np
import ps_server
wid = int(sys.argv[1])
tensors = [("w", 4096), ("b", 16)]
init = [np.zeros(4096, np.float32), np.zeros(16, np.float32)] if wid == 0 else None
w = ps_server.Worker(sys.argv[2].split(","), wid, tensors, initial=init,
                     token_file=sys.argv[3], connect_timeout=30)
g = [np.full(4096, 0.001, np.float32), np.full(16, 0.001, np.float32)]
outs = [np.empty(4096, np.float32), np.empty(16, np.float32)]
print("READY", flush=True)
r = w.pull_all(w.start_version, outs, timeout=60)
while True:
    for t in range(2):
        w.push(t, r, g[t])
    try:
        w.wait_pushes()
    except ps_server.Refused as e:
        # Starved for longer than the timeout (a loaded machine), this worker expired and
        # its round closed without it: as an elastic trainer does, it goes on from the
        # current version.
        if e.reason != "late":
            raise
    r = w.pull_all(r + 1, outs, timeout=60)
    if wid == 0:
        print("ROUND", r, time.monotonic(), flush=True)
"""

WORKERS = 8
VICTIM = 7


def rounds_between(times, start, end):
    return sum(1 for t in times if start <= t < end)


def test_a_killed_worker_costs_the_rounds_at_most_its_timeout(server_bin):
    with Shards(2, WORKERS, byzantine=1, aggregator="median", lr=0.1, momentum=0.0,
                server=server_bin,
                server_args=("--round-deadline-ms", "10000",
                             "--worker-timeout-ms", "2000")) as shards:
        env = dict(os.environ, OMP_NUM_THREADS="1")

        def start(w):
            return subprocess.Popen([sys.executable, "-c", WORKER, str(w),
                                     ",".join(shards.addresses), shards.token_file(w)],
                                    stdout=subprocess.PIPE if w == 0 else subprocess.DEVNULL,
                                    text=True, env=env)

        # Worker 0 brings the initial values; the others join once it registered them.
        procs = [start(0)]
        try:
            assert procs[0].stdout.readline().strip() == "READY", "worker 0 did not join"
            procs += [start(w) for w in range(1, WORKERS)]
            times = []
            killed_at = None
            deadline = time.monotonic() + 90
            for line in procs[0].stdout:
                assert time.monotonic() < deadline, "the job did not get through in 90 s"
                if not line.startswith("ROUND"):
                    continue
                _, _, stamp = line.split()
                times.append(float(stamp))
                if killed_at is None and len(times) >= 40 and times[-1] - times[0] >= 3.0:
                    procs[VICTIM].send_signal(signal.SIGKILL)
                    procs[VICTIM].wait()
                    killed_at = time.monotonic()
                if killed_at is not None and times[-1] > killed_at + 6.0:
                    break
            assert killed_at is not None, f"only {len(times)} rounds before worker 0 stopped"
        finally:
            for p in procs:
                p.kill()
                p.wait()
    before = rounds_between(times, killed_at - 2.0, killed_at) / 2.0
    after = rounds_between(times, killed_at + 3.0, killed_at + 6.0) / 3.0
    gaps_after = [b - a for a, b in zip(times, times[1:]) if a >= killed_at + 3.0]
    print(f"rounds/s: {before:.1f} in the 2 s before the kill, {after:.1f} from 3 to 6 s after "
          f"it (ratio {after / before:.2f}); longest round after 3 s: {max(gaps_after):.3f} s")
    assert after >= 0.25 * before, f"rounds/s {after:.1f} after vs {before:.1f} before the kill"
    assert max(gaps_after) < 1.0, "a round after the worker expired waited for it"
    # The round the kill caught waited for the timeout, not for its 10 s deadline.
    gaps = [b - a for a, b in zip(times, times[1:]) if b >= killed_at]
    assert max(gaps) < 3.5, f"a round waited {max(gaps):.2f} s for the dead worker"


# A worker that joins a running job: prints "JOINED <start version>", then "TAKEN <round>"
# for each of its first five rounds whose push was taken ("LATE <round>" for one refused
# as late), then trains on silently.
JOINING_WORKER = r"""
import sys
import numpy as np
import ps_server
wid = int(sys.argv[1])
w = ps_server.Worker(sys.argv[2].split(","), wid, [("w", 4096), ("b", 16)],
                     token_file=sys.argv[3], connect_timeout=30)
g = [np.full(4096, 0.001, np.float32), np.full(16, 0.001, np.float32)]
outs = [np.empty(4096, np.float32), np.empty(16, np.float32)]
r = w.start_version
print("JOINED", r, flush=True)
reported = 0
while True:
    r = w.pull_all(r, outs, timeout=60)
    for t in range(2):
        w.push(t, r, g[t])
    try:
        w.wait_pushes()
        word = "TAKEN"
    except ps_server.Refused as e:
        if e.reason != "late":
            raise
        word = "LATE"
    if reported < 5:
        print(word, r, flush=True)
        reported += word == "TAKEN"
    r += 1
"""


def test_workers_added_to_a_running_job_train_from_its_version_within_two_rounds(server_bin):
    # Four workers train on two shards started with --max-workers 8; four more join
    # mid-training. Each starts from the shards' current version, its push is taken within
    # two rounds of it, and every later round waits for it (its next pushes are taken,
    # never late). Two rounds, not one: a worker joins the shards one after the other, and
    # on a loaded machine the job's round after the start version can close on the shard
    # joined last before the join reaches it (seen once in a whole test run: late 248,
    # taken from 249 after a start at 247). No later one can: the shard joined first waits
    # for the worker from that round on, so the job cannot pull the version after it
    # without the worker.
    with Shards(2, 4, byzantine=1, aggregator="median", lr=0.1, momentum=0.0,
                server=server_bin,
                server_args=("--round-deadline-ms", "10000", "--max-workers", "8")) as shards:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        addresses = ",".join(shards.addresses)

        def start(w, script):
            return subprocess.Popen([sys.executable, "-c", script, str(w), addresses,
                                     shards.token_file(w)],
                                    stdout=subprocess.PIPE if w == 0 or w >= 4
                                    else subprocess.DEVNULL,
                                    text=True, env=env)

        procs = [start(0, WORKER)]
        try:
            assert procs[0].stdout.readline().strip() == "READY", "worker 0 did not join"
            procs += [start(w, WORKER) for w in range(1, 4)]
            # Worker 0's rounds, read on a thread (its pipe must not fill up).
            versions = []
            reader = threading.Thread(target=lambda: versions.extend(
                int(l.split()[1]) for l in procs[0].stdout if l.startswith("ROUND")),
                daemon=True)
            reader.start()
            deadline = time.monotonic() + 60
            while len(versions) < 30:
                assert time.monotonic() < deadline, f"only {len(versions)} rounds in 60 s"
                time.sleep(0.05)
            version_at_start = versions[-1]
            added = [start(w, JOINING_WORKER) for w in range(4, 8)]
            procs += added
            for w, p in zip(range(4, 8), added):
                lines = [p.stdout.readline().split() for _ in range(6)]
                assert lines[0][0] == "JOINED", (w, lines)
                start_version = int(lines[0][1])
                assert start_version >= version_at_start, (
                    f"worker {w} started at version {start_version}, the job was at "
                    f"{version_at_start}")
                taken = [int(r) for word, r in lines[1:] if word == "TAKEN"]
                late = [int(r) for word, r in lines[1:] if word == "LATE"]
                print(f"worker {w}: joined at version {start_version}, rounds taken {taken}, "
                      f"late {late}")
                assert taken[0] <= start_version + 2, (w, start_version, lines)
                # Once in, every round waits for it: its next rounds are all taken.
                assert taken == list(range(taken[0], taken[0] + len(taken))), (w, lines)
                assert len(late) <= 1, (w, lines)
            rounds_after = len(versions)
            time.sleep(1.0)
            assert len(versions) > rounds_after + 10, "the job stalled once eight trained"
        finally:
            for p in procs:
                p.kill()
                p.wait()


def test_a_worker_id_beyond_max_workers_is_refused_and_a_spare_is_not(server_bin):
    import numpy as np
    with Shards(1, 2, insecure=True, server=server_bin, max_workers=3) as shards:
        spare = ps_server.Worker(shards.addresses, 2, [("w", 4)],
                                 initial=[np.zeros(4, np.float32)], connect_timeout=30)
        spare.close()
        with pytest.raises(ps_server.Error, match="--max-workers 3"):
            ps_server.Worker(shards.addresses, 3, [("w", 4)], initial=[np.zeros(4, np.float32)],
                             connect_timeout=30)


# A ps_server.torch script for ps-launch: worker 2 sleeps 3 s before its step at round 2,
# while the others' rounds close at the 1 s deadline with the quorum of 2. Its push is
# then late: step() warns and the worker goes on from the shards' version.
TORCH_SCRIPT = r"""
import time, warnings
import torch
import ps_server.torch as pst

pst.init()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = pst.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), model=model)
pst.broadcast_parameters(model.state_dict(), root_rank=0)
x, y = torch.ones(8, 4), torch.zeros(8, 1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    while opt.round < 5:
        if pst.rank() == 2 and opt.round == 2:
            time.sleep(3)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    opt.synchronize()
late = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
print(f"worker {pst.rank()}: round {opt.round}, late rounds {opt.late_rounds}, "
      f"warnings {len(late)}: {late[:1]}", flush=True)
opt.close()
"""


def test_a_late_push_is_a_warning_and_the_torch_worker_goes_on(tmp_path, server_bin):
    pytest.importorskip("torch")
    script = tmp_path / "train.py"
    script.write_text(TORCH_SCRIPT)
    done = subprocess.run(
        [sys.executable, "-m", "ps_server.launch", "--shards", "2", "--workers", "3",
         "--byzantine", "1", "--aggregator", "median", "--lr", "0.1", "--momentum", "0",
         "--server", server_bin, "--log-dir", str(tmp_path / "logs"),
         "--server-arg=--round-deadline-ms", "--server-arg=1000", str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    log = (tmp_path / "logs" / "worker-2.log").read_text()
    line = next(l for l in log.splitlines() if l.startswith("worker 2:"))
    # Round 2 late, and maybe the next one too (the others finished meanwhile): one warning
    # each.
    late = int(line.split("late rounds ")[1].split(",")[0])
    assert 1 <= late <= 3 and f"warnings {late}:" in line, line
    assert "round 2 closed without this worker's gradient" in line, line
    assert int(line.split("round ")[1].split(",")[0]) >= 5, line
    assert "worker 0: round 5, late rounds 0, warnings 0" in done.stdout, done.stdout
