"""Shared test set-up.

The trainer mesh and the rollout meshes must be real and disjoint, so the CPU is split into
several XLA devices. The flag only takes effect if it is set before JAX is first imported,
which is why it lives here, ahead of every test module.
"""

import os

from asyncrl.host_devices import split_cpu_host

split_cpu_host(8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
