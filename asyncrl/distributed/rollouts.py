"""The run's rollouts with every instance a Ray actor (distributed.backend='ray').

Only the instances leave this process: `RayInstances` is the backend (an InstanceSet) that
`asyncrl.drivers.rollouts.Rollouts` is built with, so the coordinator core, the
TrajectoryServer, the reward pool, the data cursor, the threaded driver, checkpoints and the
protocol accounting are the same objects as in the local backend, and a resume or an
accounting check means the same in both. Each instance is an actor (`asyncrl.distributed.actor`)
behind a `RemoteInstance`, and weights go through the configured transport (`WeightPublisher`,
given to Rollouts where the local backend gives a ParameterServer).

    trainer ──publish v──► WeightPublisher (object store | jax transfer) ◄──pull── actor i
       ▲                        ▲ offer                                    │ items, snapshot
       │ wait_batch             │                                          ▼
    ThreadedDriver ◄── Core ◄── events ◄── RemoteInstance i (poll thread) ──► TrajectoryServer
"""

from __future__ import annotations

import collections
import logging
import sys
import time

import jax
import numpy as np
from jax.sharding import Mesh

from asyncrl.distributed import transport_name
from asyncrl.distributed.actor import InstanceActor, InstanceSpec
from asyncrl.distributed.cluster import actor_options, connect, tpu_isolation
from asyncrl.distributed.gpus import check_cluster, split_machine
from asyncrl.distributed.rejoin import Rejoiner
from asyncrl.distributed.remote_instance import RemoteInstance, Timeouts
from asyncrl.distributed.transport import Sender, WeightHandle, make_sender
from asyncrl.drivers.rollouts import Rollouts
from asyncrl.model import ShardingRules, shardings_for
from asyncrl.placement import split_by_process
from asyncrl.train.trainer import trainer_mesh

log = logging.getLogger(__name__)


class WeightPublisher:
    """The driver's side of the transport, in the ParameterServer's place: `push` after each
    train step (ThreadedDriver.publish calls it), `offer` when an actor asks for weights."""

    def __init__(self, sender: Sender, max_latency_records: int = 1024):
        self.sender = sender
        self.push_seconds: collections.deque[float] = collections.deque(maxlen=max_latency_records)
        self.pull_seconds: collections.deque[float] = collections.deque(maxlen=max_latency_records)

    @property
    def latest_version(self) -> int:
        return self.sender.version

    def push(self, version: int, params) -> None:
        start = time.perf_counter()
        self.sender.stage(version, params)
        self.push_seconds.append(time.perf_counter() - start)

    def pulled(self, transfer_id: str) -> None:
        self.sender.pulled(transfer_id)

    def offer(self, instance: int, newer_than: int) -> WeightHandle | None:
        """The newest weights under a fresh transfer id, or None if none is newer."""
        if self.sender.version <= newer_than:
            return None
        return self.sender.offer(receiver=f"instance{instance}")

    def close(self) -> None:
        self.sender.close()


def ray_rollouts(c, policy, meshes, data) -> Rollouts:
    """The run's rollouts with every instance a Ray actor; `meshes[0]`, this process's
    instance-sized mesh (`RayInstances.place`), lays out what jax_transfer sends."""
    instances = RayInstances(c, policy, meshes[0])
    return Rollouts(c, policy, data, instances, instances.publisher)


def instance_options(c, instance: int = 0) -> dict:
    """The Ray options of instance `instance`'s actor (`cluster.actor_options`); on TPU
    hosts, each instance a TPU slice of its own (`cluster.tpu_isolation`): with several per
    host (distributed.instances_per_host), instance i owns chip block i mod that and asks
    for that block's resource, `<instance_resource>_<block>`, of which each host offers one."""
    d = c.distributed
    block = instance % d.instances_per_host
    resource = d.instance_resource if d.instances_per_host == 1 else \
        f"{d.instance_resource}_{block}"
    # poll, command and start run at once: start waits for an offer a command brings.
    options = actor_options(d.instance_cpus, d.instance_gpus, resource,
                            c.mesh.devices_per_instance, d.instance_platform, max_concurrency=4)
    if d.instance_platform == "tpu":
        options["runtime_env"]["env_vars"].update(
            tpu_isolation(c.mesh.devices_per_instance, block))
    return options


class RayInstances:
    """The InstanceSet of Ray actors: the cluster (joined here), the transport's
    WeightPublisher, and a RemoteInstance per actor, restarted by a Rejoiner if configured."""

    @staticmethod
    def place(mesh_cfg, devices=None) -> tuple[Mesh, list[Mesh]]:
        """This process's meshes: the trainer's, and one of an instance's size after it
        (evaluation runs there, and jax_transfer lays weights out on it). The instances'
        own meshes are in their actors."""
        t, d = mesh_cfg.trainer_devices, mesh_cfg.devices_per_instance
        # A trainer group: the trainer spans every process; evaluation stays on process 0's.
        trainer, devices = split_by_process(jax.devices() if devices is None else devices, t)
        # Too few devices for both: evaluation shares the trainer's, between two steps.
        local = devices[t:t + d] if len(devices) >= t + d else devices[:d]
        return trainer_mesh(trainer), [Mesh(np.asarray(local), ("tp",))]

    def __init__(self, c, policy, layout_mesh: Mesh):
        self.c, self.policy = c, policy
        # A CPU driver whose actors run on the CPU too (`instance_platform` cpu, or unset: the
        # nodes are then taken to be as this one). CPU actors on other hosts count as sharing
        # as well: a CPU cluster is a test bed, on one machine or on hosts emulated on one.
        self.shared_cores = (layout_mesh.devices.flat[0].platform == "cpu"
                             and c.distributed.instance_platform in ("", "cpu"))
        self.rejoiner: Rejoiner | None = None  # made with the instances, in attach
        split_machine(c.distributed, c.mesh)  # a no-op after asyncrl.main's (before JAX): for runs started otherwise
        self.cluster = connect(c.distributed)
        try:
            check_cluster(c.distributed, c.mesh)  # Ray itself would wait for GPUs no node offers without end
            name, layout, kwargs = transport_name(c.distributed), None, {}
            if name == "jax_transfer":
                layout = shardings_for(policy.params, layout_mesh, ShardingRules.replicated())
                kwargs = {"host": c.distributed.transfer_host}
            elif name == "shards":  # every trainer process serves its own (shard_service)
                kwargs = {"offer_timeout_s": c.distributed.pull_timeout_s}
            else:  # the fallback: said, since across hosts it is the slow path
                print(f"weights: {name} (distributed.transport = {c.distributed.transport!r}): "
                      f"process 0 gathers the model and sends it from one copy each version; "
                      f"distributed.transport = 'shards' has every trainer process serve its "
                      f"own shards instead", file=sys.stderr, flush=True)
            self.publisher = WeightPublisher(make_sender(name, layout, **kwargs))
        except BaseException:
            self.cluster.close()
            raise

    def attach(self, driver) -> None:
        import ray

        c, d = self.c, self.c.distributed
        spec = InstanceSpec(
            model_config=self.policy.config, num_slots=c.rollout.num_slots,
            max_len=c.rollout.max_len,
            prompt_bucket=c.rollout.prompt_bucket, sampling=c.rollout.sampling(),
            seed=c.seed, partial_rollout=c.coordinator.partial_rollout,
            devices=c.mesh.devices_per_instance, transport=transport_name(d),
            transfer_host=d.transfer_host, pull_timeout_s=d.pull_timeout_s,
            kv=c.rollout.kv_options())
        timeouts = Timeouts(d.poll_wait_s, d.heartbeat_timeout_s, d.start_timeout_s,
                            d.stop_timeout_s)
        actor_class = ray.remote(InstanceActor)

        def stand_in(i: int) -> RemoteInstance:
            actor = actor_class.options(**instance_options(c, i)).remote(i, spec)
            return RemoteInstance(i, actor, driver.server,
                                  driver.reporter, self.publisher, timeouts,
                                  c.rollout.num_slots, rejoin=self.rejoiner)

        n = c.mesh.rollout_instances
        self.rejoiner = Rejoiner(d.max_instance_restarts, n, driver.instances,
                                 driver.reporter, stand_in, d.start_timeout_s) \
            if d.max_instance_restarts else None
        # Created now, started later: their processes import JAX while this one builds.
        driver.instances.extend(stand_in(i) for i in range(n))

    def figures(self, instances) -> dict[str, float]:
        """Per instance its restarts and the trajectories its current actor finished (a
        restarted one counts from 0: what it did since it rejoined)."""
        figures = {}
        for i, instance in enumerate(instances):
            figures[f"instance{i}_restarts"] = float(self.rejoiner.restarts[i] if self.rejoiner else 0)
            figures[f"instance{i}_finished"] = float(instance.finished)
        return figures

    def pids(self, instances) -> list[int | None]:
        return [i.info.get("pid") for i in instances]

    def stopping(self) -> None:
        if self.rejoiner is not None:
            self.rejoiner.close(self.c.distributed.stop_timeout_s)

    def close(self) -> None:
        try:
            self.publisher.close()
        finally:
            self.cluster.close()
