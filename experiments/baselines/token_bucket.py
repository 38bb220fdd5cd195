"""AReaL-style admission (token bucket): accepted + running < (η + version + 1)·B, trained
oldest-submitted first, weights updated on every instance after each step; no per-trajectory
bound.

    python -m asyncrl.main --config=experiments/baselines/token_bucket.py --workdir=runs/bucket

The batch-level admission bounds staleness only on average: single trajectories may train
more than η versions late, which metrics.jsonl's staleness histogram shows.
"""

from experiments import grpo


def get_config(arg=None):
    c = grpo.get_config(arg)
    c.coordinator.admission = "token_bucket"
    c.coordinator.migration = "none"
    return c
