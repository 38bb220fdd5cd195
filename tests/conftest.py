"""Shared test set-up.

The trainer mesh and the rollout meshes must be real and disjoint, so the CPU is split into
several XLA devices. The flag only takes effect if it is set before JAX is first imported,
which is why it lives here, ahead of every test module.
"""

import os
import pathlib
import shutil
import tempfile

import pytest

from asyncrl.host_devices import split_cpu_host
from tests.host_share import host_share

split_cpu_host(8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "owns_host: the test measures speed; no other test runs beside it")
    _share_compiled_programs(config)


def _share_compiled_programs(config):
    """One JAX persistent compilation cache for the whole run: both workers, every test, and
    every job a test starts in a subprocess (they inherit the environment).

    Most tests build the tiny model afresh and compile the same programs; many run the tiny
    job twice (interrupt and rerun, run and resume). With the cache, tests/test_system.py
    took 128 s on two workers against 263 s without (one run each, quiet host). Machine
    configuration, as a CI image would set it; no assertion depends on it (a cache hit still
    traces and yields the same executable). Set here, before any test module imports JAX,
    which reads these at import.
    A bounded size turns on the cache's file lock, which the two workers need.
    """
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:  # a worker, inheriting xdist's controller
        return
    directory = tempfile.mkdtemp(prefix="asyncrl-tests-xla-")
    config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
    for name, value in (("JAX_COMPILATION_CACHE_DIR", directory),
                        ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0"),
                        ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1"),
                        ("JAX_COMPILATION_CACHE_MAX_SIZE", str(2**30))):
        os.environ[name] = value


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
