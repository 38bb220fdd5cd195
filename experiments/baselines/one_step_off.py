"""One-step off-policy (η = 1, barrier): rollouts of step v+1 overlap training of step v.

    python -m asyncrl.main --config=experiments/baselines/one_step_off.py --workdir=runs/one_step
"""

from experiments import grpo


def get_config(arg=None):
    c = grpo.get_config(arg)
    c.staleness.eta = 1
    c.schedule = "barrier"
    return c
