"""The coordinator core a run's config describes (`config.coordinator`, `config.staleness`)."""

from __future__ import annotations

from asyncrl.coordinator.admission import build_admission
from asyncrl.coordinator.core import Core
from asyncrl.coordinator.records import PromptSource
from asyncrl.coordinator.latency import LatencyModel
from asyncrl.coordinator.migration import build_migration_policy
from asyncrl.coordinator.redundancy import build_redundancy
from asyncrl.coordinator.routing import build_router, router_needs_latency
from asyncrl.coordinator.sync import build_sync_policy
from asyncrl.servers.trajectory import TrajectoryServer


def core_from_config(c, server: TrajectoryServer, prompts: PromptSource) -> Core:
    co = c.coordinator
    redundancy = build_redundancy(co.redundancy)
    params = co.admission_params[co.admission].to_dict() if co.admission in co.admission_params else {}
    if co.admission == "barrier":
        params.setdefault("recycle", co.partial_rollout)
    admission = build_admission(
        co.admission, eta=c.staleness.eta, batch_size=c.train.batch_size,
        redundant_batch_size=redundancy.redundant_batch_size(c.train.batch_size),
        sync=build_sync_policy(co.sync), lead=c.staleness.lead, **params)
    latency = LatencyModel.load(co.latency_model) if router_needs_latency(co.routing) else None
    return Core(admission=admission, server=server, prompts=prompts,
                num_instances=c.mesh.rollout_instances, num_slots=c.rollout.num_slots,
                eta=c.staleness.eta, group_size=c.rollout.group_size,
                max_new_tokens=c.rollout.max_new_tokens, router=build_router(co.routing, latency),
                redundancy=redundancy, migration=build_migration_policy(co.migration),
                migration_interval_s=co.migration_interval_s, partial_rollout=co.partial_rollout,
                dynamic_sampling=co.dynamic_sampling, dispatch=co.dispatch, binding=co.binding)
