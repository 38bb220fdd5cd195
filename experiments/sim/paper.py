r"""The simulator's paper grid: every schedule at 32–1,024 instances and η ∈ {1, 2, 4}.

  python -m asyncrl.sim --config=experiments/sim/paper.py --workdir=/tmp/sim_paper
  python -m asyncrl.sim --config=experiments/sim/paper.py:runlocal --workdir=/tmp/sim_small

Full grid: 5 cluster sizes × 3 η × 7 schedules = 105 runs, ~4 minutes on one CPU core
(each run is 2 + 6 training steps of a 512-prompt × 16-response batch; the simulator costs
about the same at 32 and at 1,024 instances because the batch is fixed). Writes
results.csv, results.md, timing.json, throughput.png and staleness.png to the workdir.
`runlocal` shrinks it to 2 sizes × 2 η for a quick look (~20 s).

Workload: a 7B-class model on 8-GPU rollout instances (asyncrl/sim/profiles/
qwen2p5_7b_8xh100.json, from public figures), long chain-of-thought math response lengths
(asyncrl/sim/data/long_cot_math.json: mean ~3.2k tokens, 3 % cut at the 16k cap), GRPO
groups of 16, 4 trainer GPUs per rollout instance.
"""

import ml_collections

from asyncrl.config_args import parse_arg
from asyncrl.sim.config import run_config


def get_config(arg=None):
    arg = parse_arg(arg, runlocal=False, seed=0)
    config = ml_collections.ConfigDict()
    config.run = run_config()
    config.run.seed = arg.seed
    config.grid = ml_collections.ConfigDict()
    config.grid.instances = [32, 64, 128, 256, 1024]
    config.grid.etas = [1, 2, 4]
    config.grid.seeds = [arg.seed]
    config.grid.schedules = ["sync", "one_step", "verl", "areal", "roll", "slime", "staleflow"]
    config.grid.workers = 1  # processes; results are identical for any number
    if arg.runlocal:
        config.grid.instances = [32, 128]
        config.grid.etas = [1, 2]
        config.run.measure_steps = 4
    return config
