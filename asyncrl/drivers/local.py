"""Rollouts in this process: an engine per rollout mesh, each driven by its own thread, behind
the shared parts (asyncrl.drivers.rollouts: the trajectory server, the reward pool, the
coordinator core and the threaded driver); weights cross through a ParameterServer.

    trainer ──publish v──► ParameterServer ──pull──► RolloutInstance[i] (own mesh, thread)
       ▲                                                  │ tokens        │ events
       │ wait_batch                                       ▼               ▼
    ThreadedDriver ◄── Core (admission, routing, sync, migration) ◄── TrajectoryServer, rewards
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from asyncrl.drivers.rollouts import Rollouts
from asyncrl.drivers.threaded import ThreadedDriver
from asyncrl.model import ShardingRules, graphdef_for, shardings_for
from asyncrl.policy import Policy
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.servers.parameters import ParameterServer


def local_rollouts(c, policy: Policy, meshes, data) -> Rollouts:
    """The run's rollouts with an in-process instance on each of `meshes`."""
    return Rollouts(c, policy, data, LocalInstances(c, policy, meshes), ParameterServer())


class LocalInstances:
    """The InstanceSet of threads: a RolloutInstance per mesh, pulling from the driver's
    ParameterServer."""

    def __init__(self, c, policy: Policy, meshes):
        self.c, self.policy, self.meshes = c, policy, list(meshes)
        self.shared_cores = self.meshes[0].devices.flat[0].platform == "cpu"

    def attach(self, driver: ThreadedDriver) -> None:
        c, policy = self.c, self.policy
        graphdef, rules = graphdef_for(policy.config), ShardingRules.replicated()
        sampling, kv = c.rollout.sampling(), c.rollout.kv_options()
        for i, mesh in enumerate(self.meshes):
            engine = Engine(graphdef, policy.config, num_slots=c.rollout.num_slots,
                            max_len=c.rollout.max_len,
                            prompt_buckets=(c.rollout.prompt_bucket,),
                            sampling=sampling, seed=c.seed, mesh=mesh, rules=rules,
                            **kv.engine_kwargs())
            shardings = shardings_for(policy.params, mesh, rules)

            def pull(newer_than, instance=i, shardings=shardings):
                return driver.parameters.pull(instance, shardings, newer_than=newer_than)

            driver.instances.append(RolloutInstance(
                i, engine, pull, driver.server, driver.reporter,
                partial_rollout=c.coordinator.partial_rollout, preemption=kv.preemption))

    def figures(self, instances: Sequence[RolloutInstance]) -> dict[str, float]:
        return {}

    def pids(self, instances: Sequence[RolloutInstance]) -> list[int | None]:
        return [os.getpid()] * len(instances)  # threads of this process

    def stopping(self) -> None:
        pass

    def close(self) -> None:
        pass
