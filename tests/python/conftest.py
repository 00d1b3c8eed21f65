"""Shared by the Python tests: where the build tree's ps-server is (ctest passes it)."""

import os

import pytest


@pytest.fixture(scope="session")
def server_bin():
    path = os.environ.get("PS_SERVER_BIN")
    if not path or not os.access(path, os.X_OK):
        pytest.fail("PS_SERVER_BIN must name the built ps-server (ctest sets it)")
    return path
