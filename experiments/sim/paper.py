r"""The simulator's paper grid: every system at 32–1,024 instances and η ∈ {1, 2, 4}.

  python -m asyncrl.sim --config=experiments/sim/paper.py --workdir=/tmp/sim_paper
  python -m asyncrl.sim --config=experiments/sim/paper.py:runlocal --workdir=/tmp/sim_small

This is the latency-bound study (8-GPU instances fused into one 512-slot engine, no KV
limit); benchmarks/sim_paper.py --regime=paper runs the paper's own TP1 regime.

Full grid: 5 cluster sizes × 3 η × 7 systems × 3 seeds (sync and one_step fix their own η:
one run fills every η's row). Each run measures the steady window (asyncrl/sim/config.py:
2 cycles of η + 1 steps of warm-up, 8 measured) of a 512-prompt × 16-response batch, every
trajectory going through the coordinator core and the trajectory server as live ones do,
so a run costs about the same at 32 and at 1,024 instances (the batch is fixed): ~0.8 s of
one core per step, the grid ~2 CPU-hours, spread over `grid.workers` processes (one per
core, at most 4; results are identical for any number). Writes results.csv, results.md
(ratios as the median over seeds ± spread), timing.json, throughput.png and staleness.png
to the workdir. `runlocal` shrinks it to 2 sizes × 2 η × 1 seed for a quick look.

Workload: a 7B-class model on 8-GPU rollout instances (asyncrl/profiles/
qwen2p5_7b_8xh100.json, from public figures), long chain-of-thought math response lengths
(asyncrl/sim/data/long_cot_math.json: mean ~3.2k tokens, 3 % cut at the 16k cap), GRPO
groups of 16, 4 trainer GPUs per rollout instance.
"""

import os

import ml_collections

from asyncrl.config_args import parse_arg
from asyncrl.sim.config import run_config, systems


def get_config(arg=None):
    arg = parse_arg(arg, runlocal=False, seed=0)
    config = ml_collections.ConfigDict()
    config.run = run_config()
    config.run.seed = arg.seed
    config.grid = ml_collections.ConfigDict()
    config.grid.instances = [32, 64, 128, 256, 1024]
    config.grid.etas = [1, 2, 4]
    config.grid.seeds = [arg.seed, arg.seed + 1, arg.seed + 2]  # ratios: median ± spread
    # Labels of `config.systems`, each an admission with its parameters (asyncrl/sim/config.py):
    # sync = barrier at η = 0, one_step = barrier at η = 1, slime = barrier over-sampling 1.5
    # (weights updated every η steps), areal = token_bucket, roll = token_bucket dropping
    # stale entries, verl = verl, staleflow = staleflow.
    config.systems = systems()
    config.grid.systems = ["sync", "one_step", "verl", "areal", "roll", "slime", "staleflow"]
    config.grid.schedules = ()  # moved to grid.systems; kept so that setting it says so
    config.grid.workers = min(4, os.cpu_count() or 1)  # results are identical for any number
    if arg.runlocal:
        config.grid.instances = [32, 128]
        config.grid.etas = [1, 2]
        config.grid.seeds = [arg.seed]
    return config
