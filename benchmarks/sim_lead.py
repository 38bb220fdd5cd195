r"""Lead on demand (issue 29): `staleness.lead` auto against max in the cluster simulator.

  python benchmarks/sim_lead.py            # ~6 CPU-minutes
  python benchmarks/sim_lead.py --seeds 0  # one seed
  python benchmarks/sim_lead.py --frontier=0,1,2,3,4 --seeds 0 --plot=docs/figures/lead_frontier.png
                                           # the frontier: each lead at each η (~2-3 minutes)

The latency regime (asyncrl/sim/regimes.py: 32 fused 8-GPU instances, B = 128 × 16) at
η = 2, each run over its steady window: rollout-bound with the regime's own trainer (4 GPUs
per instance), trainer-bound with 1/16 of it (0.25). Prints one line per run, then one JSON
line per regime with auto / max throughput and mean staleness, against the goals: ≥ 0.98 of
max's throughput rollout-bound, ≤ 0.7 of its mean staleness trainer-bound.

With --frontier, each lead runs at each listed η instead, and the last line is one JSON
object: per regime and lead, the points (η, tokens/s, mean staleness) that trace how much
throughput each mean staleness buys; --plot draws them, one panel per regime.
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


def frontier(etas: list[int], seeds: list[int]) -> dict:
    """{regime: {lead: [{eta, tok_s, mean_staleness}, ...]}}, each point the mean over seeds."""
    points: dict = {}
    for regime in REGIMES:
        for lead in ("max", "auto"):
            for eta in etas:
                runs = [run(regime, lead, seed, eta) for seed in seeds]
                points.setdefault(regime, {}).setdefault(lead, []).append({
                    "eta": eta,
                    "tok_s": round(statistics.mean(r.throughput_tok_s for r in runs)),
                    "mean_staleness": round(statistics.mean(r.mean_staleness for r in runs), 3)})
    return points


def plot_frontier(points: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(points), figsize=(5.5 * len(points), 4))
    for ax, (regime, leads) in zip(axes, points.items()):
        for lead, style in (("max", "s--"), ("auto", "o-")):
            xs = [p["mean_staleness"] for p in leads[lead]]
            ys = [p["tok_s"] / 1000 for p in leads[lead]]
            ax.plot(xs, ys, style, label=f"lead = {lead}")
            for p, x, y in zip(leads[lead], xs, ys):
                ax.annotate(f"η={p['eta']}", (x, y), textcoords="offset points", xytext=(4, -10),
                            fontsize=8)
        ax.set(xlabel="mean staleness of the trained batches (versions)",
               ylabel="rollout throughput (k tokens/s, steady window)",
               title=f"simulator, latency regime, {regime}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eta", type=int, default=2)
    parser.add_argument("--frontier", default=None, help="η values, comma-separated")
    parser.add_argument("--plot", default=None, help="with --frontier: where to draw it")
    args = parser.parse_args()
    if args.plot and not args.frontier:
        parser.error("--plot draws the frontier: give --frontier too")
    if args.frontier:
        points = frontier([int(e) for e in args.frontier.split(",")], args.seeds)
        if args.plot:
            plot_frontier(points, args.plot)
        print(json.dumps(points))
        return
    runs = {(regime, lead): [run(regime, lead, seed, args.eta) for seed in args.seeds]
            for regime in REGIMES for lead in ("max", "auto")}
    for regime in REGIMES:
        print(json.dumps(summary(regime, runs[regime, "max"], runs[regime, "auto"])))


if __name__ == "__main__":
    main()
