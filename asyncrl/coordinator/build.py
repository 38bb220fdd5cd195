"""The coordinator core of a run, built one way for the live run and the simulator.

Both describe the core with the same `coordinator` section (asyncrl/coordinator/config.py)
and differ only in where the run's shape comes from: the live run's staleness, train, mesh
and rollout sections (`asyncrl.drivers.rollouts.core_from_config`), or a simulated run's
cluster and profile (`asyncrl.sim.build.core_from_sim_config`). `build_core` is the one place
they meet.
"""

from __future__ import annotations

import dataclasses

from asyncrl.coordinator.admission import build_admission
from asyncrl.coordinator.core import Core
from asyncrl.coordinator.records import PromptSource
from asyncrl.coordinator.latency import LatencyModel
from asyncrl.coordinator.migration import build_migration_policy
from asyncrl.coordinator.redundancy import build_redundancy
from asyncrl.coordinator.routing import build_router, router_needs_latency
from asyncrl.coordinator.sync import build_sync_policy
from asyncrl.servers.trajectory import TrajectoryServer


@dataclasses.dataclass(frozen=True)
class RunShape:
    """The numbers of a run that size its core, besides the `coordinator` section."""

    eta: int
    lead: str  # 'auto' or 'max' (asyncrl.coordinator.admission.LEADS)
    batch_size: int  # B, in entries
    num_instances: int
    num_slots: int  # decode slots per instance
    group_size: int  # N responses per entry
    max_new_tokens: int
    # The step-latency model a router reads when the section names no latency_model file:
    # the simulator's profile; none live, where validation asks for the file instead.
    latency: LatencyModel | None = None
    # The instances decode on the CPU cores the trainer computes on: StaleFlow's `auto` lead
    # then holds one buffer (admission/staleflow.py). The simulator models accelerators.
    shared_cores: bool = False


def build_core(co, shape: RunShape, server: TrajectoryServer, prompts: PromptSource) -> Core:
    """The core a `coordinator` section describes, for a run of `shape`."""
    redundancy = build_redundancy(co.redundancy)
    params = dict(co.admission_params.get(co.admission, {}))
    if co.admission == "barrier":
        params.setdefault("recycle", co.partial_rollout)  # slime recycles partial rollouts
    admission = build_admission(
        co.admission, eta=shape.eta, batch_size=shape.batch_size,
        redundant_batch_size=redundancy.redundant_batch_size(shape.batch_size),
        sync=build_sync_policy(co.sync), lead=shape.lead,
        shared_cores=shape.shared_cores, **params)
    latency = shape.latency
    if co.latency_model and router_needs_latency(co.routing):
        latency = LatencyModel.load(co.latency_model)
    return Core(admission=admission, server=server, prompts=prompts,
                num_instances=shape.num_instances, num_slots=shape.num_slots, eta=shape.eta,
                group_size=shape.group_size, max_new_tokens=shape.max_new_tokens,
                router=build_router(co.routing, latency), redundancy=redundancy,
                migration=build_migration_policy(co.migration),
                migration_interval_s=co.migration_interval_s, partial_rollout=co.partial_rollout,
                dynamic_sampling=co.dynamic_sampling, dispatch=co.dispatch, binding=co.binding)
