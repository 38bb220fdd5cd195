"""The trainer as one jax.distributed job over processes or hosts.

    group = initialize(c.distributed)      # flags, else JAX_* environment; 1 process: no-op
    mesh = trainer_mesh(jax.devices())     # every process's devices form one FSDP mesh
    batch = share(batch)                   # process 0's host batch, on every process
    params = gather_to_lead(state.params, mesh)  # host copies on process 0 (it publishes them)

Settings come from `config.distributed` (coordinator_address, num_processes, process_id) or,
where those are unset, from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID; on a
TPU slice JAX finds them itself (`auto`).

Binding: JAX's coordinator service binds every address of the host ([::]) unless told
otherwise; here it binds the coordinator address itself (127.0.0.1 on one machine, the
node's address across hosts: `bind_address`). On CPU the processes' collectives go through
gloo, chosen before the backend starts.

Failure: one process that dies or goes silent ends the whole job: a dead one breaks the next
collective (`TrainerGroupError`); a stopped or hung one is caught by the group's watchdog
(asyncrl/distributed/group_watch.py: followers beat through jax.distributed's key-value store,
process 0 exits naming the silent one after `distributed.heartbeat_timeout_s`). The trainer
group is restarted together, from the last checkpoint.

    python -m asyncrl.distributed.trainer_group --steps=3    # the group check (every process)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import ipaddress
import json
import logging
import os
import socket

from asyncrl.distributed import group_watch
from asyncrl.distributed.cluster import is_loopback
from asyncrl.errors import UserError

log = logging.getLogger(__name__)


HEARTBEAT_TIMEOUT_S = 60.0  # where the settings name none (the group check's default)


@dataclasses.dataclass(frozen=True)
class GroupSettings:
    coordinator_address: str  # '' when there is no group; 'auto': JAX detects (TPU)
    num_processes: int
    process_id: int
    # A follower silent for longer has failed (asyncrl/distributed/group_watch.py).
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S


class GroupError(UserError, ValueError):
    """Trainer-group settings (or a host) that cannot form a group; the message names the
    setting, or what to change on the host: one `error:` line from `asyncrl.main`."""


def settings(distributed, environ=os.environ) -> GroupSettings:
    """The group a config's `distributed` section (else the environment) describes."""
    address = distributed.coordinator_address or environ.get("JAX_COORDINATOR_ADDRESS", "")
    n = distributed.num_processes or int(environ.get("JAX_NUM_PROCESSES", "1"))
    pid = distributed.process_id if distributed.process_id >= 0 else \
        int(environ.get("JAX_PROCESS_ID", "0" if n == 1 else "-1"))
    if n > 1 and address != "auto":
        if ":" not in address:
            raise GroupError(f"a trainer group of {n} processes needs its coordinator's "
                             f"'host:port' (distributed.coordinator_address or "
                             f"JAX_COORDINATOR_ADDRESS), got {address!r}")
        if not 0 <= pid < n:
            raise GroupError(f"process id {pid} is not in [0, {n}) (distributed.process_id "
                             f"or JAX_PROCESS_ID)")
    return GroupSettings(address, n, pid, float(distributed.heartbeat_timeout_s))


def initialize(distributed, environ=os.environ, timeout_s: int = 300) -> GroupSettings:
    """Joins this process to its trainer group, before JAX's backend starts; then process 0
    watches the others' heartbeats and they beat (asyncrl/distributed/group_watch.py)."""
    import jax

    group = settings(distributed, environ)
    if group.num_processes <= 1 and group.coordinator_address != "auto":
        return group
    heartbeat = group_watch.backstop_s(group.heartbeat_timeout_s)
    if group.coordinator_address == "auto":
        jax.distributed.initialize(initialization_timeout=timeout_s,
                                   heartbeat_timeout_seconds=heartbeat)
        group = GroupSettings("auto", jax.process_count(), jax.process_index(),
                              group.heartbeat_timeout_s)
    else:
        if environ.get("JAX_PLATFORMS", "") in ("", "cpu"):
            # Only a group known to be on the CPU: on an accelerator gloo may carry nothing.
            if environ.get("JAX_PLATFORMS") == "cpu":
                check_gloo_reachable(group.coordinator_address)
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        bind = bind_address(group.coordinator_address) if group.process_id == 0 else None
        jax.distributed.initialize(group.coordinator_address, group.num_processes,
                                   group.process_id, coordinator_bind_address=bind,
                                   initialization_timeout=timeout_s,
                                   heartbeat_timeout_seconds=heartbeat)
    group_watch.start(group.process_id, group.num_processes, group.heartbeat_timeout_s)
    return group


def _host(address: str) -> str:
    """The host of a 'host:port' address ('[v6]:port' too)."""
    return address.rpartition(":")[0].strip("[]")


def check_gloo_reachable(coordinator_address: str, hostname: str | None = None) -> None:
    """gloo, JAX's CPU collectives, tells the other processes to connect to the address this
    host's name resolves to. Where that is a loopback address (a stock /etc/hosts maps the
    name to 127.0.1.1) a group across hosts fails in its first collective with a connection
    refused; this says why before any process waits on it. A group named by a loopback
    coordinator (one machine) is not checked."""
    if is_loopback(_host(coordinator_address)):
        return
    hostname = hostname or socket.gethostname()
    try:
        resolved = socket.gethostbyname(hostname)
    except OSError as error:
        raise GroupError(f"trainer group on CPU across hosts: this host's name {hostname!r} "
                         f"does not resolve ({error}); gloo, JAX's CPU collectives, gives the "
                         f"other processes the address it resolves to. Map it to this host's "
                         f"address on the hosts' network (/etc/hosts)") from None
    if is_loopback(resolved):
        raise GroupError(f"trainer group on CPU across hosts: this host's name {hostname!r} "
                         f"resolves to {resolved}, a loopback address, and gloo, JAX's CPU "
                         f"collectives, would give the other processes that address to "
                         f"connect to. Map {hostname!r} to this host's address on the hosts' "
                         f"network in /etc/hosts (as cloud VMs do), coordinator "
                         f"{coordinator_address}; or, if every process of the group runs on "
                         f"this host, name the coordinator by a loopback address (127.0.0.1)")


def bind_address(address: str) -> str | None:
    """Where process 0's coordinator listens: its own address as the group names it (loopback
    on one machine, the node's cluster-facing address across hosts), never every interface,
    since the coordinator has no authentication (launch/README.md). None (JAX's default, [::])
    when the address is a name, or one this host cannot bind (behind NAT, say: logged)."""
    host = _host(address)
    if is_loopback(host):
        return address
    try:
        ipaddress.ip_address(host)
    except ValueError:  # a name: it may resolve here to another address than the others use
        return None
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
    except OSError as error:
        log.warning(
            "trainer group: this host cannot bind the coordinator address %s (%s); its "
            "coordinator listens on every interface", address, error)
        return None
    return address


def share(tree, mesh=None):
    """Process 0's host arrays, on every process (the batch every process must step).

    `mesh`: broadcast over its devices alone, one per process (the trainer's mesh: then every
    collective between the processes runs on the trainer's devices, in one order). Without it
    every device of every process takes part (multihost_utils), and on CPU a collective on
    another device can overtake one still running on the trainer's, which gloo cannot tell
    apart: it fails with "collective mismatch".
    """
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if mesh is None:
        return multihost_utils.broadcast_one_to_all(tree)
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, tree)
    sum_over_processes, rows = _sum_over_processes(mesh)
    source = jax.process_index() == 0

    def put(x):
        x = np.asarray(x)
        local = (x if source else np.zeros_like(x))[None]
        return jax.make_array_from_process_local_data(rows, local, (jax.process_count(), *x.shape))

    summed = sum_over_processes(jax.tree.map(put, tree))
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), summed)


@functools.cache
def _sum_over_processes(mesh):
    """A jitted sum over a [processes, ...] stack laid out one row per process, on the first
    of `mesh`'s devices of each process; and that layout."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    firsts = {}
    for device in mesh.devices.flat:
        firsts.setdefault(device.process_index, device)
    one_each = Mesh(np.asarray([firsts[p] for p in sorted(firsts)]), ("processes",))
    total = lambda tree: jax.tree.map(lambda x: x.sum(0, dtype=x.dtype), tree)  # noqa: E731
    return (jax.jit(total, out_shardings=NamedSharding(one_each, P())),
            NamedSharding(one_each, P("processes")))


def check_devices_per_process() -> None:
    """Every process of a group must have as many devices as the others: JAX's multi-process
    helpers and Orbax's barriers lay the devices out as processes × local devices, and fail
    deep inside ("cannot reshape array") when the counts differ."""
    import collections

    import jax

    counts = collections.Counter(device.process_index for device in jax.devices())
    if len(set(counts.values())) > 1:
        from asyncrl.config_args import ConfigError

        each = ", ".join(f"process {p}: {n}" for p, n in sorted(counts.items()))
        raise ConfigError(
            f"trainer group: every process needs the same number of devices ({each}); on a "
            "CPU give each the same XLA_FLAGS=--xla_force_host_platform_device_count, on GPUs "
            "the same number of visible GPUs")


@functools.cache
def _replicated_on(mesh):
    """One jitted identity per mesh: a fresh function each step would be traced and compiled
    again every step."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    return jax.jit(lambda tree: tree, out_shardings=NamedSharding(mesh, PartitionSpec()))


def gather_to_lead(tree, mesh):
    """Full host copies of a group's arrays (sharded over `mesh`) on process 0; None on the others.

    Every process takes part in the gather, a collective on the mesh's devices (NCCL, ICI or
    gloo), but only process 0, whose rollouts and evaluator use the weights, copies them to host
    memory: `multihost_utils.process_allgather` gives every host a model-sized copy every step,
    which a follower only drops."""
    import jax
    import numpy as np

    full = _replicated_on(mesh)(tree)
    if jax.process_index() != 0:
        # Done before the follower's next collective, so a failure here is attributed to it.
        jax.block_until_ready(full)
        return None
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), full)


# ---------------------------------------------------------------------------- the group check


def synthetic_batch(step: int, model_config, rows: int = 8, length: int = 16, group_size: int = 4):
    """A deterministic training batch (same step, same arrays, on every process)."""
    import numpy as np

    from asyncrl.train.trainer import TrainBatch

    rng = np.random.default_rng(step)
    tokens = rng.integers(3, model_config.vocab_size, (rows, length)).astype(np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy()
    lengths = rng.integers(8, length + 1, rows)
    mask = ((np.arange(length) >= 6) & (np.arange(length) < lengths[:, None])).astype(np.float32)
    v_traj = np.full(rows, step, np.int32)
    return TrainBatch(tokens=tokens, positions=positions, loss_mask=mask,
                      behaviour_logp=-rng.uniform(4.5, 6.5, (rows, length)).astype(np.float32),
                      token_versions=np.full((rows, length), step, np.int32),
                      rewards=rng.integers(0, 2, rows).astype(np.float32), v_traj=v_traj,
                      buffer_version=np.int32(step), group_size=group_size)


def check(steps: int, distributed) -> dict:
    """Forms the group, trains `steps` synthetic batches on one mesh over every process's
    devices (process 0's batch shared to all), and returns the losses."""
    group = initialize(distributed)
    import jax
    import numpy as np

    from asyncrl.model import ModelConfig
    from asyncrl.train.losses import LossConfig
    from asyncrl.train.trainer import TrainConfig, Trainer, trainer_mesh

    model = ModelConfig.tiny()
    # Two micro-batches: the gradient accumulation's sums cross processes too.
    config = TrainConfig(loss=LossConfig(), learning_rate=3e-3, num_microbatches=2)
    trainer = Trainer.create(config, model, trainer_mesh(jax.devices()), group_size=4)
    state, losses = trainer.init_state(), []
    for step in range(steps):
        batch = share(synthetic_batch(step, model))
        state, metrics = trainer.step(state, trainer.put_batch(batch))
        losses.append(float(metrics["loss"]))
    weights = gather_to_lead(trainer.policy_params(state.params), trainer.mesh)
    return {"process": group.process_id, "processes": jax.process_count(),
            "devices": jax.device_count(), "losses": losses,
            # What process 0 would publish (None where nothing reaches the host).
            "weights_abs_sum": None if weights is None else float(
                sum(np.abs(x.astype(np.float64)).sum() for x in jax.tree.leaves(weights)))}


def main() -> None:
    parser = argparse.ArgumentParser(description="Trains a few synthetic steps as one "
                                     "jax.distributed trainer group and prints the losses.")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--coordinator_address", default="")
    parser.add_argument("--num_processes", type=int, default=0)
    parser.add_argument("--process_id", type=int, default=-1)
    parser.add_argument("--heartbeat_timeout_s", type=float, default=HEARTBEAT_TIMEOUT_S)
    args = parser.parse_args()
    print(json.dumps(check(args.steps, args)), flush=True)


if __name__ == "__main__":
    main()
