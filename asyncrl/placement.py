"""Which devices the trainer and each rollout instance run on.

    trainer_devices + rollout_instances × devices_per_instance devices, disjoint: the trainer
    mesh takes the first ones, each instance its own slice after them.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from asyncrl.train.trainer import trainer_mesh


def place(mesh_cfg, devices=None) -> tuple[Mesh, list[Mesh]]:
    """One trainer mesh and K rollout meshes over disjoint devices."""
    devices = jax.devices() if devices is None else devices
    t, k, d = mesh_cfg.trainer_devices, mesh_cfg.rollout_instances, mesh_cfg.devices_per_instance
    trainer = trainer_mesh(devices[:t])
    rollout = [Mesh(np.asarray(devices[t + i * d: t + (i + 1) * d]), ("tp",)) for i in range(k)]
    return trainer, rollout
