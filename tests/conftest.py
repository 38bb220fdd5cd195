"""Shared test set-up.

The trainer mesh and the rollout meshes must be real and disjoint, so the CPU is split into
several XLA devices. The flag only takes effect if it is set before JAX is first imported,
which is why it lives here, ahead of every test module.
"""

import os

_DEVICE_FLAG = "--xla_force_host_platform_device_count"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_DEVICE_FLAG}=8".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
