"""ps-launch --slurm under a real Slurm: Debian's slurm-wlm (slurmctld and slurmd, with
munge) started on this machine by the test, one node with 8 task slots. The documented
sbatch script (examples/slurm/train.sbatch) trains the Fashion-MNIST example and exits 0;
a job cancelled mid-run (scancel) and submitted again resumes from the shards'
checkpoints. Skipped, saying why, where the machine cannot (not root, no slurm-wlm or
munge, no torch or dataset)."""

import os
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import free_port_pair

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SBATCH = os.path.join(ROOT, "examples", "slurm", "train.sbatch")
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_fashion_mnist.py")


@pytest.fixture
def slurm(tmp_path, server_bin):
    """munged, slurmctld and slurmd on this machine; yields the environment for sbatch."""
    if os.geteuid() != 0:
        pytest.skip("starting slurmctld and slurmd needs root")
    missing = [b for b in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
               if not shutil.which(b) and not os.path.exists(f"/usr/sbin/{b}")]
    if missing:
        pytest.skip(f"no {', '.join(missing)} (apt-get install slurm-wlm munge)")
    pytest.importorskip("torch")
    if not os.path.isdir("/usr/share/datasets/fashion-mnist"):
        pytest.skip("no Fashion-MNIST (apt-get install dataset-fashion-mnist)")
    d = tmp_path / "slurm"
    for sub in ("state", "spool"):
        (d / sub).mkdir(parents=True)
    key = d / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    host = socket.gethostname()
    conf = d / "slurm.conf"
    conf.write_text(textwrap.dedent(f"""\
        ClusterName=pstest
        SlurmctldHost={host}(127.0.0.1)
        AuthType=auth/munge
        AuthInfo=socket={d}/munge.sock
        CredType=cred/munge
        SlurmUser=root
        SlurmdUser=root
        SlurmctldPort={free_port_pair("0.0.0.0")}
        SlurmdPort={free_port_pair("0.0.0.0")}
        StateSaveLocation={d}/state
        SlurmdSpoolDir={d}/spool
        SlurmctldPidFile={d}/slurmctld.pid
        SlurmdPidFile={d}/slurmd.pid
        SlurmctldLogFile={d}/slurmctld.log
        SlurmdLogFile={d}/slurmd.log
        ProctrackType=proctrack/linuxproc
        TaskPlugin=task/none
        MpiDefault=none
        ReturnToService=2
        SchedulerType=sched/builtin
        SelectType=select/cons_tres
        SelectTypeParameters=CR_Core
        JobCompType=jobcomp/none
        JobAcctGatherType=jobacct_gather/none
        AccountingStorageType=accounting_storage/none
        SlurmdParameters=config_overrides
        KillWait=10
        MinJobAge=600
        NodeName={host} NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
        PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
        """))
    env = dict(os.environ, SLURM_CONF=str(conf))
    daemons = []
    try:
        daemons.append(subprocess.Popen(
            ["munged", "-F", "--force", f"--socket={d}/munge.sock", f"--key-file={key}",
             f"--log-file={d}/munged.log", f"--pid-file={d}/munged.pid",
             f"--seed-file={d}/munged.seed"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 20
        while not (d / "munge.sock").exists():
            assert time.monotonic() < deadline, "munged did not start"
            time.sleep(0.05)
        daemons.append(subprocess.Popen(["slurmctld", "-D", "-i"], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        daemons.append(subprocess.Popen(["slurmd", "-D", "-N", host], env=env,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while "idle" not in subprocess.run(["sinfo", "-h", "-o", "%T"], env=env,
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                           text=True).stdout:
            assert time.monotonic() < deadline, (
                "the Slurm node did not come up:\n" + (d / "slurmctld.log").read_text()[-2000:])
            time.sleep(0.2)
        env.update(PYTHONPATH=os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(
            os.path.abspath(__import__("ps_server").__file__))), os.environ.get("PYTHONPATH"))
            if p), PS_PYTHON=sys.executable, PS_SERVER_BIN=server_bin, PS_EXAMPLE=EXAMPLE,
                   PS_CHECKPOINT_DIR=str(tmp_path / "checkpoints"),
                   PS_SHARD_PORT=str(free_port_pair("0.0.0.0")))
        yield env
    finally:
        subprocess.run(["scancel", "--user=root"], env=env, stderr=subprocess.DEVNULL)
        for p in reversed(daemons):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def submit(env, out, *args):
    done = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--ntasks=4",
                           "--ntasks-per-node=4", f"--output={out}", SBATCH, *args],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def state(env, job):
    text = subprocess.run(["scontrol", "show", "job", "-o", job], env=env,
                          stdout=subprocess.PIPE, text=True).stdout
    m = re.search(r"JobState=(\S+).*ExitCode=(\S+)", text)
    return (m.group(1), m.group(2)) if m else ("UNKNOWN", "")


def wait_for(env, job, states, timeout):
    deadline = time.monotonic() + timeout
    while True:
        s = state(env, job)
        if s[0] in states:
            return s
        assert time.monotonic() < deadline, f"job {job} still {s[0]} after {timeout} s"
        time.sleep(0.5)


def test_the_sbatch_example_trains_and_a_cancelled_job_resumes(tmp_path, slurm):
    # One sbatch command: the example trains and exits 0.
    out = tmp_path / "first.out"
    job = submit(slurm, out, "--steps", "200", "--eval-every", "0")
    assert wait_for(slurm, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 300) == \
        ("COMPLETED", "0:0"), out.read_text()[-3000:]
    text = out.read_text()
    assert '"final_test_accuracy"' in text and "worker 3: ok" in text, text[-3000:]
    assert re.search(r'"final_test_accuracy": 0\.[6-9]', text), text[-2000:]
    print("sbatch, 200 steps:", re.search(r'"final_test_accuracy": [0-9.]+', text).group(0))

    # A long job, cancelled once the shards checkpointed past round 100 and the job goes
    # on: submitted again, it resumes from the checkpoints.
    out = tmp_path / "second.out"
    job = submit(slurm, out, "--steps", "100000", "--eval-every", "0")
    checkpoints = tmp_path / "checkpoints"
    deadline = time.monotonic() + 300
    saved = 0
    while saved < 300:
        assert time.monotonic() < deadline, "no checkpoint past round 300 in 300 s"
        versions = [int(m.group(1)) for f in checkpoints.glob("shard-*/checkpoint-*.pscp")
                    for m in [re.search(r"checkpoint-(\d+)", f.name)] if m]
        saved = min(versions) if len(versions) >= 2 else 0
        time.sleep(0.5)
    subprocess.run(["scancel", job], env=slurm, check=True)
    assert wait_for(slurm, job, {"CANCELLED", "COMPLETED", "FAILED"}, 120)[0] == "CANCELLED"
    out = tmp_path / "third.out"
    job = submit(slurm, out, "--steps", str(saved + 100), "--eval-every", "0")
    assert wait_for(slurm, job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, 300) == \
        ("COMPLETED", "0:0"), out.read_text()[-3000:]
    text = out.read_text()
    m = re.search(r"worker 0: resuming at step (\d+)", text)
    assert m and int(m.group(1)) >= saved, text[-3000:]
    print(f"scancel once both shards checkpointed past round {saved}; resubmitted, worker 0 "
          f"resumed at step {m.group(1)}")
    assert '"final_test_accuracy"' in text, text[-3000:]


# Each task of `srun python TASK_SCRIPT` finds its place with ps_server.torch.init() and
# trains three rounds of a mean (worker k pushes k + 1, lr 1): every one ends at
# -3 * mean(1..4) = -7.5.
TASK_SCRIPT = textwrap.dedent("""
    import os
    import numpy as np
    import ps_server
    import ps_server.torch as pst

    pst.init()
    me = pst.rank()
    w = ps_server.Worker(pst.shards(), me, [("w", 10)], initial=[np.zeros(10, np.float32)],
                         token_file=os.path.join(os.environ["PS_RUN_DIR"], f"token-worker-{me}"),
                         connect_timeout=60)
    out = np.empty(10, np.float32)
    for t in range(3):
        w.pull_all(t, [out], timeout=60)
        w.push(0, t, np.full(10, me + 1, np.float32))
        w.wait_pushes()
    w.pull_all(3, [out], timeout=60)
    print(f"task {os.environ['SLURM_PROCID']}: worker {me}/{pst.size()} local rank "
          f"{pst.local_rank()}: {out[0]:.4f}", flush=True)
    w.close()
""")


def test_srun_tasks_are_workers_by_their_slurm_ids(tmp_path, slurm, server_bin):
    """`srun --ntasks=4 python train.py` against running shards: each task's SLURM_PROCID,
    SLURM_NTASKS and SLURM_LOCALID are its worker id, the worker count and its local rank
    (ps_server.torch.init()), as Lightning and Horovod read them."""
    from ps_server.launch import Shards
    script = tmp_path / "task.py"
    script.write_text(TASK_SCRIPT)
    with Shards(2, 4, lr=1, momentum=0, server=server_bin) as shards:
        env = dict(slurm, PS_SHARDS=",".join(shards.addresses), PS_RUN_DIR=shards.run_dir)
        for name in ("PS_WORKER_ID", "PS_NUM_WORKERS", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(name, None)
        done = subprocess.run(["srun", "--nodes=1", "--ntasks=4", sys.executable, str(script)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=180, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for task in range(4):
        assert f"task {task}: worker {task}/4 local rank {task}: -7.5000" in done.stdout, \
            done.stdout + done.stderr[-2000:]
