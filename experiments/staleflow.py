"""StaleFlow with every strategy on: throughput-optimal routing on the fitted step-latency
model, greedy per-instance sync with partial rollout, migration, η = 2.

    python -m asyncrl.main --config=experiments/staleflow.py --workdir=runs/staleflow
    python -m asyncrl.main --config=experiments/staleflow.py:tiny --workdir=/tmp/staleflow

The latency model is fitted on this kind of machine by
`python benchmarks/profile_engine.py` (see asyncrl/profiles/).
"""

import pathlib

from experiments import grpo

PROFILES = pathlib.Path(__file__).resolve().parents[1] / "asyncrl" / "profiles"


def get_config(arg=None):
    c = grpo.get_config(arg)
    c.coordinator.routing = "throughput_optimal"
    c.coordinator.sync = "greedy"
    c.coordinator.migration = "balance"
    name = "cpu_tiny.json" if c.model.preset == "tiny" and c.model.checkpoint == "random" \
        else "cpu_smollm2_135m.json"
    c.coordinator.latency_model = str(PROFILES / name)
    return c
