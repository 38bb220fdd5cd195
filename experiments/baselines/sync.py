"""Synchronous GRPO (η = 0, barrier): dispatch a batch, wait for all of it, train, sync all.

    python -m asyncrl.main --config=experiments/baselines/sync.py --workdir=runs/sync
    python -m asyncrl.main --config=experiments/baselines/sync.py:tiny --workdir=/tmp/sync

The same system as experiments/grpo.py, so comparisons differ only in the schedule.
"""

from experiments import grpo


def get_config(arg=None):
    c = grpo.get_config(arg)
    c.staleness.eta = 0
    c.coordinator.admission = "barrier"
    return c
