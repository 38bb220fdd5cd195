"""The coordinator core a simulated run's config describes: the live system's core, built from
the same registries with the same meanings (`asyncrl.coordinator.build.core_from_config`
reads the live config's `coordinator` section; this reads the sim config's, which has the
same fields). tests/coordinator/test_drivers_agree.py checks that both give the same core.
"""

from __future__ import annotations

from asyncrl.coordinator.admission import build_admission
from asyncrl.coordinator.core import Core
from asyncrl.coordinator.records import PromptSource
from asyncrl.coordinator.latency import LatencyModel
from asyncrl.coordinator.migration import build_migration_policy
from asyncrl.coordinator.redundancy import build_redundancy
from asyncrl.coordinator.routing import build_router
from asyncrl.coordinator.sync import build_sync_policy
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.sim.profile import Profile


def batch_size(c) -> int:
    """B in entries: fixed, or (batch_size = 0) groups_per_instance × instances."""
    return c.batch_size or max(1, round(c.groups_per_instance * c.num_instances))


def num_slots(c, profile: Profile) -> int:
    return c.num_slots or profile.num_slots


def core_from_sim_config(c, profile: Profile, server: TrajectoryServer, prompts: PromptSource,
                         max_new_tokens: int) -> Core:
    co = c.coordinator
    redundancy = build_redundancy(co.redundancy)
    b = batch_size(c)
    params = dict(co.admission_params[co.admission]) if co.admission in co.admission_params else {}
    if co.admission == "barrier":
        params.setdefault("recycle", co.partial_rollout)  # slime recycles partial rollouts
    admission = build_admission(co.admission, eta=c.eta, batch_size=b,
                                redundant_batch_size=redundancy.redundant_batch_size(b),
                                sync=build_sync_policy(co.sync), lead=c.lead, **params)
    latency = LatencyModel.load(co.latency_model) if co.latency_model else profile.latency
    return Core(admission=admission, server=server, prompts=prompts,
                num_instances=c.num_instances, num_slots=num_slots(c, profile), eta=c.eta,
                group_size=c.group_size, max_new_tokens=max_new_tokens,
                router=build_router(co.routing, latency), redundancy=redundancy,
                migration=build_migration_policy(co.migration),
                migration_interval_s=co.migration_interval_s,
                partial_rollout=co.partial_rollout, dynamic_sampling=co.dynamic_sampling,
                dispatch=co.dispatch, binding=co.binding)
