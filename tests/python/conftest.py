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
