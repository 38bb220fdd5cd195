r"""Lead on demand (issue 29): `staleness.lead` auto against max in the cluster simulator.

  python benchmarks/sim_lead.py            # ~6 CPU-minutes
  python benchmarks/sim_lead.py --seeds 0  # one seed

The latency regime (asyncrl/sim/regimes.py: 32 fused 8-GPU instances, B = 128 × 16) at
η = 2, each run over its steady window: rollout-bound with the regime's own trainer (4 GPUs
per instance), trainer-bound with 1/16 of it (0.25). Prints one line per run, then one JSON
line per regime with auto / max throughput and mean staleness, against the goals: ≥ 0.98 of
max's throughput rollout-bound, ≤ 0.7 of its mean staleness trainer-bound.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asyncrl.sim.regimes import regime_config  # noqa: E402
from asyncrl.sim.run import simulate  # noqa: E402

# Trainer GPUs per rollout instance: the regime's own trainer, and one sixteenth of it.
REGIMES = {"rollout-bound": 4.0, "trainer-bound": 0.25}


def run(regime: str, lead: str, seed: int, eta: int):
    c = regime_config("latency")
    c.eta, c.seed, c.lead = eta, seed, lead
    c.train_gpus_per_instance = REGIMES[regime]
    start = time.perf_counter()
    result = simulate(c)
    print(f"{regime} {lead} seed {seed}: {result.throughput_tok_s:.0f} tok/s, mean staleness "
          f"{result.mean_staleness:.3f}, max {result.max_staleness}, step "
          f"{result.step_time_s:.1f} s ({time.perf_counter() - start:.0f} s wall)", flush=True)
    return result


def summary(regime: str, max_runs, auto_runs) -> dict:
    throughput = [a.throughput_tok_s / m.throughput_tok_s for a, m in zip(auto_runs, max_runs)]
    staleness = [a.mean_staleness / m.mean_staleness for a, m in zip(auto_runs, max_runs)]
    side = lambda runs: {  # noqa: E731
        "tok_s": [round(r.throughput_tok_s) for r in runs],
        "mean_staleness": [round(r.mean_staleness, 3) for r in runs],
        "max_staleness": [r.max_staleness for r in runs]}
    return {"regime": regime, "max": side(max_runs), "auto": side(auto_runs),
            "auto_over_max_tok_s": [round(x, 4) for x in throughput],
            "median_tok_s_ratio": round(statistics.median(throughput), 4),
            "auto_over_max_mean_staleness": [round(x, 3) for x in staleness],
            "median_staleness_ratio": round(statistics.median(staleness), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eta", type=int, default=2)
    args = parser.parse_args()
    runs = {(regime, lead): [run(regime, lead, seed, args.eta) for seed in args.seeds]
            for regime in REGIMES for lead in ("max", "auto")}
    for regime in REGIMES:
        print(json.dumps(summary(regime, runs[regime, "max"], runs[regime, "auto"])))


if __name__ == "__main__":
    main()
