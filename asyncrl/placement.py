"""Which devices the trainer and each rollout instance run on: the one place that decides.

Disjoint (the default): trainer_devices + rollout_instances × devices_per_instance devices;
the trainer mesh takes the first ones, each instance its own slice after them.

Colocated (`mesh.colocate`): everything shares the first trainer_devices devices, so one GPU
or TPU chip runs the whole system. The trainer mesh spans all of them: its step is one
synchronous FSDP program, and on fewer devices the others would sit out every step. Each
instance takes devices_per_instance of them, round robin from where the previous one ended:
instances are independent, so spreading them evenly keeps every device's decode load (and
KV-cache memory) within one instance of the others. On one device every mesh is that device.

The meshes are what changes, nothing else: the coordinator, the staleness protocol and the
instances cannot tell the layouts apart. What colocation does to a weight push and pull is
said in asyncrl/servers/parameters.py.

Import-light: config validation asks `devices_needed` before anything loads JAX.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jax.sharding import Mesh

ROLLOUT_AXIS = "tp"


def devices_needed(mesh_cfg) -> int:
    """How many devices `place` takes (config validation checks it against the host)."""
    if mesh_cfg.colocate:
        return mesh_cfg.trainer_devices
    return mesh_cfg.trainer_devices + mesh_cfg.rollout_instances * mesh_cfg.devices_per_instance


def place(mesh_cfg, devices=None) -> tuple[Mesh, list[Mesh]]:
    """One trainer mesh and K rollout meshes, disjoint or colocated (see the module doc)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from asyncrl.train.trainer import trainer_mesh

    devices = list(jax.devices() if devices is None else devices)
    t, k, d = mesh_cfg.trainer_devices, mesh_cfg.rollout_instances, mesh_cfg.devices_per_instance
    if len(devices) < devices_needed(mesh_cfg):
        raise ValueError(f"placement needs {devices_needed(mesh_cfg)} devices, got {len(devices)}")
    trainer = trainer_mesh(devices[:t])
    if mesh_cfg.colocate:
        if d > t:
            raise ValueError(f"colocated, an instance's {d} devices must come from the trainer's {t}")
        slices = [[devices[(i * d + j) % t] for j in range(d)] for i in range(k)]
    else:
        slices = [devices[t + i * d: t + (i + 1) * d] for i in range(k)]
    return trainer, [Mesh(np.asarray(s), (ROLLOUT_AXIS,)) for s in slices]


def describe_layout(trainer: Mesh, rollouts: list[Mesh]) -> str:
    """One line for the log: which device ids each mesh holds."""
    ids = lambda mesh: ",".join(str(d.id) for d in mesh.devices.flat)  # noqa: E731
    shared = set(trainer.devices.flat) & {d for m in rollouts for d in m.devices.flat}
    return (f"{'colocated' if shared else 'disjoint'}: trainer [{ids(trainer)}], "
            + ", ".join(f"instance{i} [{ids(m)}]" for i, m in enumerate(rollouts)))
