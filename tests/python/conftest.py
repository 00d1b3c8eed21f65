"""Shared by the Python tests: where the build tree's binaries are (ctest passes them),
and a worker script that joins running jobs."""

import os
import pathlib
import re
import subprocess
import textwrap
import time

import pytest


def _binary(variable, what):
    path = os.environ.get(variable)
    if not path or not os.access(path, os.X_OK):
        pytest.fail(f"{variable} must name the built {what} (ctest sets it)")
    return path


@pytest.fixture(scope="session")
def server_bin():
    return _binary("PS_SERVER_BIN", "ps-server")


@pytest.fixture(scope="session")
def capture_bin():
    return _binary("PS_PUSH_CAPTURE_BIN", "ps-test-push-capture")


def free_port_pair(host="127.0.0.1"):
    """A free port whose successor is free too (shard i listens on --shard-port + i),
    below the kernel's ephemeral range (32768 up), where the ports other tests running
    beside one bind with port 0 come from: a port chosen here is not taken in between."""
    import random
    import socket
    for _ in range(200):
        port = random.randrange(20000, 32000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind((host, port))
                b.bind((host, port + 1))
            return port
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports in 20000-32000")


def joining_script(rounds, pause, hold):
    """A worker that trains `rounds` rounds from the shards' version, `pause` seconds
    apart, says when it is past round 5 (wait_past_round_5), and prints how many of its
    pushes the rounds took. A worker of the job (from version 0) then waits until the
    file `hold` exists (run_joiner creates it once the joiner is a member; at most
    120 s), so that the job cannot end before a worker that joins it arrives, however
    slowly that worker starts. Its credentials are
    ps-launch's environment: PS_TOKEN_FILE, else the run directory's token (a worker that
    joins through job.env), else PS_TLS_CA/CERT/KEY."""
    return textwrap.dedent(f"""
        import os, time
        import numpy as np
        import ps_server

        env = os.environ
        me, n = int(env["PS_WORKER_ID"]), int(env["PS_NUM_WORKERS"])
        token = env.get("PS_TOKEN_FILE") or (
            os.path.join(env["PS_RUN_DIR"], f"token-worker-{{me}}") if "PS_RUN_DIR" in env else "")
        w = ps_server.Worker(env["PS_SHARDS"].split(","), me, [("w", 100)],
                             initial=[np.zeros(100, np.float32)], token_file=token,
                             tls_ca=env.get("PS_TLS_CA", ""), tls_cert=env.get("PS_TLS_CERT", ""),
                             tls_key=env.get("PS_TLS_KEY", ""), connect_timeout=60)
        out = np.empty(100, np.float32)
        taken = late = 0
        t = w.start_version
        while t < {rounds}:
            t = w.pull_all(t, [out], timeout=60)
            if t >= {rounds}:
                break
            w.push(0, t, np.full(100, 1.0, np.float32))
            try:
                w.wait_pushes()
                taken += 1
            except ps_server.Refused as e:
                if e.reason != "late":
                    raise
                late += 1
            t += 1
            if t == 5:  # tests wait for this line before a worker joins the running job
                print(f"worker {{me}}: past round 5", flush=True)
                held_until = time.monotonic() + 120
                while (w.start_version == 0 and not os.path.exists({str(hold)!r})
                       and time.monotonic() < held_until):
                    time.sleep(0.05)
            time.sleep({pause})
        print(f"worker {{me}} of {{n}}: from version {{w.start_version}}, taken {{taken}}, "
              f"late {{late}}", flush=True)
        w.close()
    """)


def run_joiner(args, shard_logs, hold, timeout=120, **popen_args):
    """Runs the command `args` of a worker that joins a job of joining_script workers as
    worker 2, and creates `hold` once every log in `shard_logs` says it joined (or it
    ended, or `timeout` passed), so that the job's workers go on from round 5 only with
    it as a member. Returns its subprocess.CompletedProcess (text)."""
    joiner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              **popen_args)
    try:
        logs_say(shard_logs, "worker 2 joined", joiner, timeout)
    finally:
        pathlib.Path(hold).touch()
    try:
        out, err = joiner.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        joiner.kill()
        out, err = joiner.communicate()
    return subprocess.CompletedProcess(args, joiner.returncode, out, err)


def assert_joined_late(joined_out, job_out, rounds, prefix=""):
    """What joining_script(rounds) printed for worker 2 of 3 that joined a running job
    (`joined_out`, its lines after `prefix`) and for worker 0 of the job (`job_out`):
    the joiner started at the job's version, not at 0, and its pushes were taken in every
    round after it but at most its first two; worker 0 had all of its own taken."""
    m = re.search(re.escape(prefix) + r"worker 2 of 3: from version (\d+), taken (\d+)",
                  joined_out)
    assert m, joined_out
    start, taken = int(m.group(1)), int(m.group(2))
    assert start > 0, "it joined the running job at its version, not at 0"
    assert taken >= rounds - start - 2, joined_out
    assert f"worker 0 of 3: from version 0, taken {rounds}, late 0" in job_out, job_out


def logs_say(logs, text, process, timeout):
    """Polls until every file in `logs` (paths) contains `text`: True then; False once
    `process` (a Popen) ended or `timeout` seconds passed first."""
    deadline = time.monotonic() + timeout
    while not all(log.exists() and text in log.read_text() for log in logs):
        if process.poll() is not None or time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def wait_past_round_5(log, launcher, timeout=60):
    """Until the log file `log` of a joining_script worker says the job is past round 5
    (so that a worker joining now joins a running job), failing if `launcher` ends."""
    if not logs_say([log], "past round 5", launcher, timeout):
        assert launcher.poll() is None, launcher.communicate()
        pytest.fail(f"{log}: not past round 5 within {timeout} s")
