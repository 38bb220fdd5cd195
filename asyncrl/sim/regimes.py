"""Named regimes: a run config for a hardware/workload setting the comparisons are made in.

  paper    the StaleFlow paper's own setting: TP1 instances (one vLLM-style engine per H100,
           the authors' measured decode fit for a 14B reasoning model), a 190k-token KV cache
           per instance with recompute preemption, long chain-of-thought responses up to 20k
           tokens (asyncrl/sim/data/long_cot_20k.json, a stated assumption), 32 rollout + 32
           trainer GPUs, B = 128 prompts × 16 responses.
  latency  the latency-bound study (experiments/sim/paper.py's grid): each instance is an
           8-GPU node fused into one 512-slot engine with no KV limit, so throughput is set
           by the η window and each group's longest response; here at 32 instances with
           B = 128 (4 groups per instance, the grid's 128-instance / 512-group point scaled
           down to run on two cores).
"""

from __future__ import annotations

from asyncrl.config_args import ConfigError
from asyncrl.sim.config import run_config


def _paper(c):
    c.profile = "qwen2p5_14b_h100_tp1.json"
    c.num_instances = 32
    c.train_gpus_per_instance = 1.0  # 32 trainer GPUs beside 32 rollout GPUs
    c.batch_size = 128
    c.group_size = 16
    c.response_lengths = {"name": "empirical", "path": "long_cot_20k.json"}


def _latency(c):
    c.num_instances = 32
    c.batch_size = 128


REGIMES = {"paper": _paper, "latency": _latency}


def regime_config(name: str):
    """The run config of regime `name` (a copy of `run_config()` with its fields set)."""
    if name not in REGIMES:
        raise ConfigError(f"regime={name!r}: not a regime; regimes: {', '.join(REGIMES)}")
    c = run_config()
    REGIMES[name](c)
    return c
