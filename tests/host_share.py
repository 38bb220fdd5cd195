"""Tests that measure speed own the host.

The suite runs on two xdist workers that share two cores. A test that compares the speed of
two runs (a schedule that overlaps training with rollout against one that does not) measures
the neighbour's load instead of the schedule if the other worker is busy. Such a test is marked
`owns_host`, and the other worker waits, between two of its tests, until it ends.

Every test holds a shared lock on one file for its set-up, call and teardown; an owns_host test
holds it exclusively. A second "gate" lock, taken by the owner before it waits and held until
it ends, stops the neighbour's next test from slipping in ahead of it, so the owner cannot be
starved by a stream of short tests.
"""

import contextlib
import fcntl
import pathlib


@contextlib.contextmanager
def host_share(exclusive: bool, lock_dir: pathlib.Path | None):
    """lock_dir: shared by every worker of one run (None: a single process, no neighbour)."""
    if lock_dir is None:
        yield
        return
    with open(lock_dir / "host.gate", "a") as gate, open(lock_dir / "host.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
