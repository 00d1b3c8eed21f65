"""Shared by the Python tests: where the build tree's binaries are (ctest passes them),
and a worker script that joins running jobs."""

import os
import textwrap

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


def joining_script(rounds, pause):
    """A worker that trains `rounds` rounds from the shards' version, `pause` seconds
    apart, and prints how many of its pushes the rounds took. Its credentials are
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
            time.sleep({pause})
        print(f"worker {{me}} of {{n}}: from version {{w.start_version}}, taken {{taken}}, "
              f"late {{late}}", flush=True)
        w.close()
    """)
