r"""StaleFlow against verl, AReaL, ROLL, slime, one-step-off and synchronous RL, in steady state.

  python benchmarks/sim_paper.py [--regime=paper|latency] [--quick] [--workers=2]
      [--out=experiments/sim/results/bench_<regime>]

Every system runs at every configured η of `--etas` (sync and one_step fix their own), and
StaleFlow also at each observed max staleness a baseline reached beyond them, over `--seeds`
seeds, each run measured over the steady window (asyncrl/sim/config.py: 2 cycles
of η + 1 steps of warm-up, then 8 whole cycles). Regimes (asyncrl/sim/regimes.py): `paper`
(TP1 14B engines with a KV cache and preemption, 32 + 32 GPUs, B = 128 × 16, responses up
to 20k) and `latency` (the latency-bound grid's 8-GPU fused engines, 32 instances, B = 128).
Prints a table, then as its last line JSON:

  regime, window {η: [warm-up, measured]}, seeds, eta (the headline η),
  staleflow_vs          baseline → median over seeds of StaleFlow / baseline at equal η
  staleflow_vs_spread   baseline → max − min of those per-seed ratios
  staleflow_vs_matched_max, staleflow_vs_matched_mean   (asyncrl/sim/compare.py)
  mean_vs_strict        mean of staleflow_vs over slime, one_step and sync
  max_staleness, mean_staleness   system → observed, at the headline η
  frontier              system → η → {throughput, max/mean staleness, share above η}
  frontier_min_ratio    the smallest, over every observed max a baseline reaches, of
                        StaleFlow's throughput at that max over the baseline's
  frontier_at_max_2     baseline → StaleFlow's ratio at observed max staleness 2
  coordinator_s_per_step, modelled_step_s   StaleFlow's core cost per step, and a step's
                        modelled length, at the headline η
  wall_s                the benchmark's wall time
Costs on two cores (2 workers): paper ~25 CPU-minutes for the full η ∈ {0..4} × 3 seeds
(~0.9 s of one core per simulated step: the cache preempts thousands of sequences a step),
latency ~10. `--quick` runs η ∈ {1, 2} only (the headline and the matched-max point).
"""

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from asyncrl.cli import exit_on_user_error  # noqa: E402
from asyncrl.sim import compare  # noqa: E402
from asyncrl.sim.config import systems  # noqa: E402
from asyncrl.sim.regimes import REGIMES, regime_config  # noqa: E402
from asyncrl.sim.run import BASELINES, simulate_point, write_outputs  # noqa: E402

FIXED_ETA = {"sync": 0, "one_step": 1}  # systems that fix their own η


def _run(job):
    regime, label, eta, seed, overrides = job
    c = regime_config(regime)
    for name, value in overrides.items():
        c[name] = value
    return simulate_point(c, systems(), label, instances=c.num_instances, eta=eta, seed=seed)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regime", default="paper", choices=sorted(REGIMES))
    parser.add_argument("--eta", type=int, default=2, help="the headline η")
    parser.add_argument("--etas", default="0,1,2,3,4", help="configured η of the frontier")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="η ∈ {1, 2} only")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="override a run-config field, e.g. --set num_instances=16")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.seeds < 1:
        raise ValueError(f"--seeds={args.seeds}: must be ≥ 1")
    etas = sorted({1, 2, args.eta} if args.quick else
                  {int(e) for e in args.etas.split(",")} | {args.eta})
    overrides = {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = json.loads(value)
    t0 = time.perf_counter()

    jobs = []
    for label in (*BASELINES, "staleflow"):
        for eta in ([FIXED_ETA[label]] if label in FIXED_ETA else etas):
            jobs += [(args.regime, label, eta, seed, overrides) for seed in range(args.seeds)]
    # Spawned, not forked: no state of this process leaks into the workers.
    with concurrent.futures.ProcessPoolExecutor(
            args.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = list(pool.map(_run, jobs))
        # The frontier compares StaleFlow at every observed max a baseline reached: where a
        # baseline overshot past the configured η's, StaleFlow runs at that η too.
        front = compare.frontier(results)
        reached = {p["max_staleness"] for b in BASELINES for p in front.get(b, {}).values()}
        extra = sorted(reached - set(etas))
        results += list(pool.map(_run, [(args.regime, "staleflow", eta, seed, overrides)
                                        for eta in extra for seed in range(args.seeds)]))

    cmp = compare.compare(results, args.eta, BASELINES)
    front = compare.frontier(results)
    min_ratio, pairs = compare.frontier_min_ratio(front, BASELINES)
    at2 = {}
    for b in ("verl", "areal"):
        mine = compare.best_within(front["staleflow"], "max_staleness", 2)
        theirs = compare.best_within(front[b], "max_staleness", 2)
        at2[b] = None if mine is None or theirs is None else mine / theirs
    head = {s: (pts[args.eta] if args.eta in pts else next(iter(pts.values())))
            for s, pts in front.items()}
    windows = {r.eta: [r.warmup_steps, r.measure_steps] for r in results}
    strict = [cmp["staleflow_vs"][b] for b in compare.STRICT]
    ours = [r for r in results if r.system == "staleflow" and r.eta == args.eta]

    write_outputs(results, args.out or f"experiments/sim/results/bench_{args.regime}")
    print(f"regime {args.regime}: throughput (k tok/s, median of {args.seeds} seeds) "
          "and observed max / mean staleness per configured η")
    for system, pts in front.items():
        cells = "  ".join(f"η={e}: {p['throughput'] / 1e3:7.1f}k {p['max_staleness']}/"
                          f"{p['mean_staleness']:.2f}" for e, p in pts.items())
        print(f"{system:10s} {cells}")
    wall = time.perf_counter() - t0
    print(f"({wall:.0f} s wall, {len(results)} runs)")
    rnd = _rounded
    print(json.dumps({
        "regime": args.regime, "window": windows, "seeds": args.seeds, "eta": args.eta,
        "staleflow_vs": rnd(cmp["staleflow_vs"]),
        "staleflow_vs_spread": rnd(cmp["staleflow_vs_spread"]),
        "staleflow_vs_matched_max": rnd(cmp["staleflow_vs_matched_max"]),
        "staleflow_vs_matched_mean": rnd(cmp["staleflow_vs_matched_mean"]),
        "mean_vs_strict": round(statistics.fmean(strict), 3),
        "max_staleness": {s: p["max_staleness"] for s, p in head.items()},
        "mean_staleness": {s: round(p["mean_staleness"], 3) for s, p in head.items()},
        "frontier": {s: {e: {k: round(v, 3) if isinstance(v, float) else v
                             for k, v in p.items()} for e, p in pts.items()}
                     for s, pts in front.items()},
        "frontier_min_ratio": None if min_ratio is None else round(min_ratio, 3),
        "frontier_min_at": min(pairs, key=lambda q: q["ratio"]) if pairs else None,
        "frontier_at_max_2": rnd(at2),
        # Wall s inside the coordinator core per training step (warm-up steps included, the
        # timer spans them), beside the modelled seconds a step takes: the core's cost.
        "coordinator_s_per_step": round(statistics.fmean(
            r.coordinator_s / (r.warmup_steps + r.measure_steps) for r in ours), 4),
        "modelled_step_s": round(statistics.fmean(r.step_time_s for r in ours), 2),
        "wall_s": round(wall, 1),
    }))


def _rounded(d):
    return {k: None if v is None else round(v, 3) for k, v in d.items()}


if __name__ == "__main__":
    exit_on_user_error(main)
