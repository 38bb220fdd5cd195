"""The `coordinator` section of a run config: one schema for the live run
(experiments/grpo.py) and the simulator (asyncrl/sim/config.py), read by one builder
(`asyncrl.coordinator.build.build_core`). A field added here exists in both, with one meaning,
so a simulated run and a live one cannot be configured apart.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from asyncrl.config_args import missing_field


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
