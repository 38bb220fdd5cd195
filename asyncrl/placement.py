"""Which devices the trainer and each rollout instance run on: the one place that decides.

Disjoint (the default): trainer_devices + rollout_instances × devices_per_instance devices;
the trainer mesh takes the first ones, each instance its own slice after them.

Colocated (`mesh.colocate`): everything shares the first trainer_devices devices, so one GPU
or TPU chip runs the whole system. The trainer mesh spans all of them: its step is one
synchronous FSDP program, and on fewer devices the others would sit out every step. Each
instance takes devices_per_instance of them, round robin from where the previous one ended:
instances are independent, so spreading them evenly keeps every device's decode load (and
KV-cache memory) within one instance of the others. On one device every mesh is that device.

A trainer group (several processes, asyncrl/distributed/trainer_group.py): the trainer mesh
takes the first trainer_devices LOCAL devices of every process, so N processes train on
N × trainer_devices devices; the instances run on process 0's devices alone (it leads the run;
the other processes only take part in the trainer's collectives). Each process's own devices
are counted, never the group's total: `devices_needed` is what process 0 must have.

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
    """How many local devices `place` takes on process 0 (config validation checks it)."""
    if mesh_cfg.colocate:
        return mesh_cfg.trainer_devices
    return mesh_cfg.trainer_devices + mesh_cfg.rollout_instances * mesh_cfg.devices_per_instance


def place(mesh_cfg, devices=None) -> tuple[Mesh, list[Mesh]]:
    """One trainer mesh and K rollout meshes, disjoint or colocated (see the module doc)."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from asyncrl.train.trainer import trainer_mesh

    t, k, d = mesh_cfg.trainer_devices, mesh_cfg.rollout_instances, mesh_cfg.devices_per_instance
    trainer_devices, devices = split_by_process(jax.devices() if devices is None else devices, t)
    if len(devices) < devices_needed(mesh_cfg):
        where = " on process 0" if jax.process_count() > 1 else ""
        raise ValueError(f"placement needs {devices_needed(mesh_cfg)} devices{where}, "
                         f"got {len(devices)}")
    trainer = trainer_mesh(trainer_devices)
    if mesh_cfg.colocate:
        if d > t:
            raise ValueError(f"colocated, an instance's {d} devices must come from the trainer's {t}")
        slices = [[devices[(i * d + j) % t] for j in range(d)] for i in range(k)]
    else:
        slices = [devices[t + i * d: t + (i + 1) * d] for i in range(k)]
    return trainer, [Mesh(np.asarray(s), (ROLLOUT_AXIS,)) for s in slices]


def split_by_process(devices, trainer_devices: int) -> tuple[list, list]:
    """The trainer mesh's devices (the first `trainer_devices` of every process, process by
    process) and process 0's own devices, in order. One process: devices[:t] and devices."""
    by_process: dict[int, list] = {}
    for device in devices:
        by_process.setdefault(device.process_index, []).append(device)
    short = {p: len(ds) for p, ds in by_process.items() if len(ds) < trainer_devices}
    if short:
        raise ValueError(f"mesh.trainer_devices = {trainer_devices} local devices per process, "
                         f"but process(es) {short} have fewer")
    trainer = [dev for p in sorted(by_process) for dev in by_process[p][:trainer_devices]]
    return trainer, by_process[min(by_process)]


def describe_layout(trainer: Mesh, rollouts: list[Mesh]) -> str:
    """One line for the log: which device ids each mesh holds."""
    ids = lambda mesh: ",".join(str(d.id) for d in mesh.devices.flat)  # noqa: E731
    shared = set(trainer.devices.flat) & {d for m in rollouts for d in m.devices.flat}
    return (f"{'colocated' if shared else 'disjoint'}: trainer [{ids(trainer)}], "
            + ", ".join(f"instance{i} [{ids(m)}]" for i, m in enumerate(rollouts)))
