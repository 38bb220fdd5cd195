"""The `coordinator` and `staleness` sections of a run config. The coordinator's is one schema
for the live run (experiments/grpo.py) and the simulator (asyncrl/sim/config.py): its
defaults (`coordinator_config`), its typed section and checks (`CoordinatorSection`, which
both resolve it into) and one builder (`asyncrl.coordinator.build.build_core`). A field added
here exists in both, with one meaning, so a simulated run and a live one cannot be
configured apart.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from asyncrl.config_args import missing_field
from asyncrl.coordinator.admission import ADMISSIONS, LEADS, build_admission
from asyncrl.coordinator.migration import MIGRATION_POLICIES
from asyncrl.coordinator.redundancy import REDUNDANCY_POLICIES
from asyncrl.coordinator.routing import BINDINGS, DISPATCH_MODES, ROUTERS, router_needs_latency
from asyncrl.coordinator.sync import SYNC_POLICIES, build_sync_policy
from asyncrl.sections import Section, fail, int_at_least, registered, section


def coordinator_config(**defaults: Any) -> ml_collections.ConfigDict:
    """The section with the live run's defaults, `defaults` replacing some of them (the
    simulator's cluster-scale ones); a name that is not a field of the section fails."""
    co = ml_collections.ConfigDict()
    # 'staleflow' (the per-trajectory bound), or a baseline: 'barrier' (η = 0 synchronous,
    # η = 1 one-step off-policy, slime's loop), 'token_bucket' (AReaL; ROLL with drop_stale)
    # or 'verl' (verl's fully-async sample ratio).
    co.admission = "staleflow"
    # Every admission's parameters, whichever is chosen, so that an override such as
    # --config.coordinator.admission_params.verl.staleness_threshold=0.5 finds its field.
    co.admission_params = ml_collections.ConfigDict({
        "barrier": {"over_sampling": 1.0},
        "token_bucket": {"drop_stale": False},
        # staleness_threshold None: η. max_queue_size 0: (1 + threshold)·k·B.
        "verl": {"staleness_threshold": None, "trigger_parameter_sync_step": 1,
                 "max_queue_size": 0},
    })
    co.routing = "least_loaded"
    co.dispatch = "group"  # or per_response: each response of a group routed alone
    co.binding = "dispatch"  # or late: V_traj moves forward until a response starts
    # Step-latency JSON for a router that reads one (throughput_optimal); '' in the simulator:
    # the profile's step latency.
    co.latency_model = ""
    co.sync = "greedy"
    # A sync keeps running trajectories going on the new weights; off, it waits for them to
    # finish and migration moves only queued work: one version per trajectory.
    co.partial_rollout = True
    co.migration = "balance"
    co.migration_interval_s = 0.0  # 0: consider moves at every coordinator step
    co.redundancy = "none"
    co.dynamic_sampling = False
    for name, value in defaults.items():
        if name not in co:
            raise missing_field(f"coordinator.{name}", list(co.keys()))
        co[name] = value
    return co


@section
class StalenessSection(Section):
    """`config.staleness`: the bound η and how far ahead of the trainer rollouts run."""

    name = "staleness"
    eta: int
    lead: str  # LEADS: 'auto' or 'max'

    def check(self) -> None:
        int_at_least("staleness.eta", self.eta, 0)
        check_lead_field("staleness.lead", self.lead)


def check_lead_field(field: str, lead: str) -> None:
    if lead not in LEADS:
        fail(field, lead, "'auto' (start rollouts only as far ahead as keeps the trainer fed) "
             "or 'max' (as far ahead as η allows)")


@section
class CoordinatorSection(Section):
    """`config.coordinator`, in the live run and the simulator alike (one schema, one check)."""

    name = "coordinator"
    admission: str
    admission_params: Mapping[str, Mapping[str, Any]]
    routing: str
    dispatch: str
    binding: str
    latency_model: str
    sync: str
    partial_rollout: bool
    migration: str
    migration_interval_s: float
    redundancy: str
    dynamic_sampling: bool

    def check(self) -> None:
        for field, registry in (("admission", ADMISSIONS), ("routing", ROUTERS),
                                ("sync", SYNC_POLICIES), ("dispatch", DISPATCH_MODES),
                                ("binding", BINDINGS), ("migration", MIGRATION_POLICIES),
                                ("redundancy", REDUNDANCY_POLICIES)):
            registered(f"coordinator.{field}", getattr(self, field), registry)
        if not self.migration_interval_s >= 0:
            fail("coordinator.migration_interval_s", self.migration_interval_s,
                 "expected seconds ≥ 0 (0: at every coordinator step)")

    def check_admission_params(self, eta: int, batch_size: int) -> None:
        """Every admission's parameters build that admission, whichever is chosen: an
        override may switch to any of them."""
        for admission, params in self.admission_params.items():
            field = f"coordinator.admission_params.{admission}"
            if admission not in ADMISSIONS:
                fail(field, dict(params), f"registered admissions: {', '.join(ADMISSIONS.names())}")
            try:
                build_admission(admission, eta=eta, batch_size=max(batch_size, 1),
                                redundant_batch_size=max(batch_size, 1),
                                sync=build_sync_policy("greedy"), **params)
            except (TypeError, ValueError) as error:
                fail(field, dict(params), str(error))

    def check_files(self) -> None:
        """The latency model a router reads exists on this machine."""
        if router_needs_latency(self.routing) and not os.path.isfile(self.latency_model):
            fail("coordinator.latency_model", self.latency_model,
                 f"{self.routing} routing needs the JSON fitted by python "
                 f"benchmarks/profile_engine.py")
