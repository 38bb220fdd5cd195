"""GPUs shared out between the job and its Ray actors (distributed.backend='ray').

Ray hands an actor that reserves GPUs (`num_gpus`: distributed.instance_gpus, trainer_gpus)
GPUs of its own and sets the actor's CUDA_VISIBLE_DEVICES to them before it runs, so the
actor's JAX sees those alone. An actor that reserves none keeps its node's variable as it was
(Ray 2.60 no longer clears it): it would see, and JAX would preallocate on, every GPU its
node has, those other actors reserved included. So such an actor is shown no GPU
(`gpu_environment`), and a cluster that offers GPUs to actors that may run JAX on one yet
ask for none is refused, naming the field (`check_asks`).

One machine (`ray_address = 'local'`): the job's own trainer runs on this machine's GPUs,
outside Ray's accounting. Before JAX starts here (`split_machine`, from form_group in
asyncrl.trainer_actors, which asyncrl.main calls first), the first mesh.trainer_devices GPUs
become this process's alone (its CUDA_VISIBLE_DEVICES) and the Ray head is started offering
only the others (it and the workers it spawns inherit a CUDA_VISIBLE_DEVICES naming them;
Ray maps each actor's share onto those ids). On a joined
cluster the nodes offer what `ray start --num-gpus` gave them; launch/gpu_vms.sh offers none
of the job's host.

Memory: JAX preallocates a fraction (0.75 unless XLA_PYTHON_CLIENT_MEM_FRACTION says) of each
GPU it sees. An actor with whole GPUs has them alone; actors sharing a GPU (num_gpus < 1)
would each try to take that fraction of all of it, so each takes its share of it instead.

Ray waits without end (a warning in its log aside) for an actor no node can hold; `check_asks`
turns that into an error naming the field, first from this machine's count (one machine),
then from what the cluster's nodes offer.

Import-light: the split runs before JAX or Ray is imported.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys

from asyncrl.errors import UserError

log = logging.getLogger(__name__)

VISIBLE = "CUDA_VISIBLE_DEVICES"
MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
KEEP_VISIBLE = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
JAX_MEM_FRACTION = 0.75  # JAX's own default
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one entry per GPU the driver knows


class GPUError(UserError, ValueError):
    """The actors' GPUs cannot be placed as configured."""


@dataclasses.dataclass(frozen=True)
class Split:
    """One machine's GPUs as CUDA numbers them: the job's (its trainer) and the Ray head's."""

    job: tuple[str, ...]
    ray: tuple[str, ...]


# This process's split, once made: the Ray head is started later, after JAX, from another
# call chain (asyncrl.run builds the rollouts), and must offer what was set aside here.
_split: Split | None = None


@dataclasses.dataclass(frozen=True)
class Ask:
    """One kind of actor's GPUs: `count` actors of `per_actor` GPUs each."""

    field: str
    per_actor: float
    count: int
    platform: str  # JAX_PLATFORMS in those actors ('': as their node has it)
    instead: str  # what to set the field to
    count_field: str = ""  # the field that sets `count`


def machine_gpus(environ=os.environ, listing: str = NVIDIA_GPUS) -> list[str]:
    """This machine's GPUs as CUDA numbers them for this process: CUDA_VISIBLE_DEVICES's
    entries when it is set, else one per GPU the NVIDIA driver lists (none without one)."""
    if VISIBLE in environ:
        return [g.strip() for g in environ[VISIBLE].split(",") if g.strip() not in ("", "-1")]
    try:
        return [str(i) for i in range(len(os.listdir(listing)))]
    except OSError:
        return []


def asks(d, mesh, environ=os.environ) -> list[Ask]:
    """What the run's actors ask Ray for (`d`: config.distributed, `mesh`: config.mesh): the
    instances, and the trainer's followers if any."""
    here = environ.get("JAX_PLATFORMS", "")  # a local head's actors inherit this process's
    found = [Ask("distributed.instance_gpus", float(d.instance_gpus), mesh.rollout_instances,
                 d.instance_platform or (here if d.ray_address == "local" else ""),
                 f"the GPUs of one instance (mesh.devices_per_instance = "
                 f"{mesh.devices_per_instance}), or distributed.instance_platform = 'cpu'",
                 "mesh.rollout_instances")]
    if d.trainer_processes > 1:  # followers run on this process's platform (trainer_actors)
        found.append(Ask("distributed.trainer_gpus", float(d.trainer_gpus),
                         d.trainer_processes - 1, here,
                         f"the GPUs of the job's own trainer (mesh.trainer_devices = "
                         f"{mesh.trainer_devices})", "distributed.trainer_processes"))
    return found


def _may_use_gpu(platform: str) -> bool:
    return platform.split(",")[0].strip() in ("", "cuda", "gpu", "rocm")


def _fits(per_actor: float, offered: float) -> int:
    """Actors of `per_actor` GPUs one node of `offered` holds: Ray puts a fraction of a GPU
    on one GPU, never across two."""
    if per_actor >= 1:
        return int(offered // per_actor)
    return int(offered) * int(1 / per_actor + 1e-9)


def check_asks(asks_: list[Ask], offered: list[float], where: str) -> None:
    """Raises GPUError naming the field if Ray could not place every actor on the GPUs the
    nodes offer (`offered`, one entry per node; `where` names them)."""
    total = sum(offered)
    for ask in asks_:
        if ask.per_actor == 0:
            if total and _may_use_gpu(ask.platform):
                raise GPUError(
                    f"{ask.field} = 0.0 while {where} offers {total:g} GPUs: those actors "
                    f"reserve none, so they are shown none and would run JAX on the CPU; set "
                    f"{ask.field} to {ask.instead}")
            continue
        room = sum(_fits(ask.per_actor, g) for g in offered)
        if room < ask.count:
            raise GPUError(
                f"{ask.field} = {ask.per_actor:g} for each of {ask.count} actors, but {where} "
                f"has room for {room} such actors (GPUs per node: "
                f"{', '.join(f'{g:g}' for g in offered) or 'none'}); Ray would keep the others "
                f"waiting without end. Lower {ask.field} or {ask.count_field or 'their count'}, "
                f"or offer more GPUs")
    needed = sum(a.per_actor * a.count for a in asks_)
    if needed > total + 1e-9:
        raise GPUError(
            f"the actors ask {needed:g} GPUs together ("
            + " + ".join(f"{a.count} × {a.field} = {a.per_actor:g}" for a in asks_ if a.per_actor)
            + f"), {where} offers {total:g}: Ray would keep some waiting without end")


def split_machine(d, mesh, environ=os.environ, listing: str = NVIDIA_GPUS) -> Split | None:
    """On one machine (ray_address='local') whose actors reserve GPUs: this process keeps the
    first mesh.trainer_devices GPUs, the Ray head gets the others (`ray_gpus`). Call it before
    JAX's backend starts here: CUDA reads CUDA_VISIBLE_DEVICES once. None: nothing split."""
    global _split
    wanted = [a for a in asks(d, mesh, environ) if a.per_actor > 0]
    if _split is not None or d.backend != "ray" or d.ray_address != "local" or not wanted:
        return _split
    gpus = machine_gpus(environ, listing)
    if not gpus:
        return None  # no GPU: Ray offers none, and check_asks says so after it starts
    t = mesh.trainer_devices
    split = Split(tuple(gpus[:t]), tuple(gpus[t:]))
    check_asks(asks(d, mesh, environ), [float(len(split.ray))],
               f"this machine ({len(gpus)} GPUs, the first mesh.trainer_devices = {t} kept for "
               f"the job's trainer, so {len(split.ray)} for the Ray head)")
    environ[VISIBLE] = ",".join(split.job)
    _split = split
    if _gpu_backend_started():
        log.warning("the GPUs were split after JAX started in this process: it still sees all "
                    "%d, the Ray actors' %s included (python -m asyncrl.main splits them "
                    "before JAX starts)", len(gpus), ",".join(split.ray))
    return split


def ray_gpus() -> tuple[str, ...] | None:
    """The GPUs a Ray head started here offers (None: as Ray finds them)."""
    return None if _split is None else _split.ray


def _gpu_backend_started() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    if bridge is None or not bridge.backends_are_initialized():
        return False
    import jax

    return jax.default_backend() == "gpu"


def gpu_environment(gpus: float, environ=os.environ) -> dict[str, str]:
    """An actor's GPU variables for `gpus` reserved: none shown when it reserves none (Ray
    would leave it every GPU of its node), else its share of JAX's preallocation."""
    if not gpus:
        return {VISIBLE: ""}
    fraction = float(environ.get(MEM_FRACTION, JAX_MEM_FRACTION))
    # A 1 inherited from the driver would stop Ray from narrowing CUDA_VISIBLE_DEVICES.
    return {MEM_FRACTION: f"{fraction * min(float(gpus), 1.0):.4g}", KEEP_VISIBLE: "0"}


def check_cluster(d, mesh) -> None:
    """`check_asks` against what the connected Ray cluster's live nodes offer."""
    import ray

    offered = [float(n["Resources"].get("GPU", 0)) for n in ray.nodes() if n.get("Alive")]
    check_asks(asks(d, mesh), offered, f"the Ray cluster ({len(offered)} nodes)")
