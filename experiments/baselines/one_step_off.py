"""One-step off-policy (η = 1, barrier): batch v+1 is generated with weights v while batch v
trains; every instance then loads weights v+1 together.

    python -m asyncrl.main --config=experiments/baselines/one_step_off.py --workdir=runs/one_step
"""

from experiments import grpo


def get_config(arg=None):
    c = grpo.get_config(arg)
    c.staleness.eta = 1
    c.coordinator.admission = "barrier"
    return c
