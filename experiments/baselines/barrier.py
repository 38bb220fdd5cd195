"""slime's loop (`train_async.py`), η = 2: the next batch is generated while one trains,
and every instance loads new weights together every η steps, once its batch is complete.
Over-sampling 1.5 launches 1.5·B entries per batch and stops the rest once B are scored;
their partial rollouts finish in the next batch (so a few train more than η versions late).

    python -m asyncrl.main --config=experiments/baselines/barrier.py --workdir=runs/barrier
"""

from experiments import grpo


def get_config(arg=None):
    c = grpo.get_config(arg)
    c.coordinator.admission = "barrier"
    c.coordinator.admission_params.barrier.over_sampling = 1.5
    c.coordinator.migration = "none"
    return c
