"""Shared test set-up.

The trainer mesh and the rollout meshes must be real and disjoint, so the CPU is split into
several XLA devices. The flag only takes effect if it is set before JAX is first imported,
which is why it lives here, ahead of every test module.
"""

import os
import pathlib

import pytest

from asyncrl.host_devices import split_cpu_host
from tests.host_share import host_share

split_cpu_host(8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "owns_host: the test measures speed; no other test runs beside it")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    # The whole protocol, not just the call: a module fixture's set-up (compiling a model,
    # running a system) loads the host as much as the test that first asks for it.
    # xdist hands each worker a basetemp inside the run's own, which pytest rotates: the
    # lock files live there, shared by the workers and gone with the run's temp files.
    worker = os.environ.get("PYTEST_XDIST_WORKER") is not None
    lock_dir = pathlib.Path(item.config.option.basetemp).parent if worker else None
    with host_share(item.get_closest_marker("owns_host") is not None, lock_dir):
        yield
