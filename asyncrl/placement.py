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

from asyncrl.sections import Section, fail, int_at_least, section

if TYPE_CHECKING:
    from jax.sharding import Mesh

ROLLOUT_AXIS = "tp"


@section
class MeshSection(Section):
    """`config.mesh`: how many devices the trainer and each rollout instance take."""

    name = "mesh"
    trainer_devices: int
    rollout_instances: int
    devices_per_instance: int
    colocate: bool

    def check(self) -> None:
        for field in ("trainer_devices", "rollout_instances", "devices_per_instance"):
            int_at_least(f"mesh.{field}", getattr(self, field), 1)
        if self.colocate and self.devices_per_instance > self.trainer_devices:
            fail("mesh.devices_per_instance", self.devices_per_instance,
                 f"colocated, each instance runs on devices of the trainer's mesh: at most "
                 f"mesh.trainer_devices ({self.trainer_devices})")


def check_devices(mesh: MeshSection, backend: str, device_count: int, processes: int = 1,
                  process_index: int = 0) -> None:
    """Whether this process's `device_count` local devices hold what it must place: a
    follower of a trainer group its part of the trainer alone, a process with Ray instances
    (distributed.backend) the trainer, else the trainer and every instance."""
    t = mesh.trainer_devices
    if process_index > 0:
        if t > device_count:
            fail("mesh.trainer_devices", t,
                 f"at most the {device_count} local devices of trainer-group process "
                 f"{process_index} (distributed.process_id): every process of the group "
                 f"gives the trainer mesh that many of its own devices")
        return
    if backend == "ray":  # each instance actor brings its own devices
        if mesh.colocate:
            fail("mesh.colocate", True, "False with distributed.backend='ray': each instance "
                 "actor owns its devices (colocate with the local backend)")
        if t > device_count:
            fail("mesh.trainer_devices", t,
                 f"at most this host's {device_count} devices (the instances are Ray actors)")
        return
    needed = devices_needed(mesh)
    if needed <= device_count:
        return
    cpu_hint = "on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count"
    host = "this host" if processes == 1 else (
        f"process 0 of the trainer group of {processes} (distributed.num_processes; it holds "
        f"its part of the trainer and every instance)")
    if mesh.colocate:
        fail("mesh", f"colocated on {t} trainer devices", f"needs {needed} devices, {host} "
             f"has {device_count} (lower mesh.trainer_devices; {cpu_hint})")
    k = mesh.rollout_instances
    fail("mesh", f"{t} + {k} × {mesh.devices_per_instance}", f"needs {needed} devices, {host} "
         f"has {device_count} ({cpu_hint}; or share devices: --config.mesh.colocate=True runs "
         f"the trainer and all {k} instances on the first mesh.trainer_devices ({t}) devices)")


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
