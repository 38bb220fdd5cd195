r"""Runs the simulator grid of an experiment config.

  python -m asyncrl.sim --config=experiments/sim/paper.py --workdir=/tmp/sim_paper
  python -m asyncrl.sim --config=experiments/sim/paper.py:runlocal --workdir=/tmp/sim_small \
      --config.grid.workers=2

The config is locked: a misspelt override such as --config.run.eta_=3 fails.
"""

import os
import time

from absl import flags, logging

from asyncrl.cli import define_config_flag, run_main
from asyncrl.sim.run import run_grid

_CONFIG = define_config_flag(None, "experiment config file")
_WORKDIR = flags.DEFINE_string("workdir", None, "where results, tables and plots go")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
    del argv
    config = _CONFIG.value
    workdir = os.path.abspath(_WORKDIR.value)
    logging.info("simulator grid: %s → %s", config.grid, workdir)
    t0 = time.perf_counter()
    results = run_grid(config, workdir)
    logging.info("%d runs in %.1f s; see %s/results.md",
                 len(results), time.perf_counter() - t0, workdir)
    with open(os.path.join(workdir, "results.md")) as f:
        print(f.read())


if __name__ == "__main__":
    run_main(main)
