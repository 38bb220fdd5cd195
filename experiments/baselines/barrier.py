"""slime-style: all instances sync together every step (a drain-and-sync barrier), η = 2.

    python -m asyncrl.main --config=experiments/baselines/barrier.py --workdir=runs/barrier
"""

from experiments import grpo


def get_config(arg=None):
    c = grpo.get_config(arg)
    c.schedule = "barrier"
    c.coordinator.migration = "none"
    return c
