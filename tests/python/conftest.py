"""Shared by the Python tests: where the build tree's binaries are (ctest passes them)."""

import os

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
