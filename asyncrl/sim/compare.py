"""Comparisons of simulated runs: ratios over seeds, matched staleness, the staleness frontier.

A ratio is StaleFlow's throughput over a baseline's on the same workload (same seed, so the
same prompts and lengths), one per seed; reported as the median over seeds with its spread
(max − min). A single seed's figure hides how much the workload alone moves it.

Comparisons (each a dict baseline → median ratio):
  equal η        both configured with the same η (what the paper's tables compare);
  matched max    the baseline at the largest configured η whose observed max staleness is ≤
                 StaleFlow's configured η (AReaL, verl and slime train some samples more
                 than η versions late: their η is not the bound they deliver);
  matched mean   the baseline's fastest point whose observed mean staleness is ≤ StaleFlow's.
The frontier of a system is its throughput against the staleness it delivers, one point per
configured η; `frontier_min_ratio` is, over every observed max staleness a baseline reaches,
StaleFlow's best throughput at that max (or less) over the baseline's, the smallest.
"""

from __future__ import annotations

import statistics
from typing import Iterable

STRICT = ("slime", "one_step", "sync")  # schedules whose bound is exact (a barrier)


def median_spread(values: Iterable[float]) -> tuple[float, float]:
    values = list(values)
    if not values:
        raise ValueError("median_spread: no values")
    return statistics.median(values), max(values) - min(values)


def by_key(results) -> dict[tuple[str, int], list]:
    """(system, configured η the run used) → its runs, one per seed, sorted by seed."""
    out: dict[tuple[str, int], list] = {}
    for r in results:
        out.setdefault((r.system, r.eta), []).append(r)
    for runs in out.values():
        runs.sort(key=lambda r: r.seed)
    return out


def seed_ratios(num: list, den: list) -> list[float]:
    """num / den throughput per seed, paired by seed (a seed is one workload)."""
    d = {r.seed: r.throughput_tok_s for r in den}
    pairs = [n.throughput_tok_s / d[n.seed] for n in num if n.seed in d]
    if not pairs:
        raise ValueError("seed_ratios: no seed in common")
    return pairs


def point(runs: list) -> dict:
    """One system at one configured η, over its seeds."""
    tput, tput_spread = median_spread(r.throughput_tok_s for r in runs)
    consumed = sum(sum(r.staleness_hist.values()) for r in runs)
    above = sum(n for r in runs for k, n in r.staleness_hist.items() if k > r.eta)
    return {"throughput": tput, "throughput_spread": tput_spread,
            "max_staleness": max(r.max_staleness for r in runs),
            "mean_staleness": statistics.fmean(r.mean_staleness for r in runs),
            "share_above_eta": above / max(consumed, 1), "seeds": len(runs)}


def frontier(results) -> dict[str, dict[int, dict]]:
    """system → configured η → `point` (throughput vs observed staleness)."""
    out: dict[str, dict[int, dict]] = {}
    for (system, eta), runs in sorted(by_key(results).items()):
        out.setdefault(system, {})[eta] = point(runs)
    return out


def best_within(points: dict[int, dict], field: str, limit: float) -> float | None:
    """The fastest of `points` whose observed `field` is ≤ limit, or None."""
    fits = [p["throughput"] for p in points.values() if p[field] <= limit + 1e-12]
    return max(fits) if fits else None


def frontier_min_ratio(front: dict[str, dict[int, dict]], baselines: Iterable[str],
                       system: str = "staleflow") -> tuple[float | None, list[dict]]:
    """The smallest, over every (baseline, configured η) point, of `system`'s best throughput
    at the baseline's observed max staleness (or less) over the baseline's; with every pair."""
    ours = front[system]
    pairs = []
    for b in baselines:
        for eta, p in front.get(b, {}).items():
            mine = best_within(ours, "max_staleness", p["max_staleness"])
            if mine is None:
                continue
            pairs.append({"baseline": b, "eta": eta, "max_staleness": p["max_staleness"],
                          "ratio": mine / p["throughput"]})
    return (min(q["ratio"] for q in pairs) if pairs else None), pairs


def compare(results, eta: int, baselines: Iterable[str], system: str = "staleflow") -> dict:
    """StaleFlow at configured η against each baseline: equal η (median over seeds and the
    spread), matched observed max, matched observed mean."""
    runs = by_key(results)
    front = frontier(results)
    ours = runs[(system, eta)]
    mine = front[system][eta]
    vs, spread, matched_max, matched_mean = {}, {}, {}, {}
    for b in baselines:
        own = [k for k in runs if k[0] == b]
        if not own:
            continue
        at = (b, eta) if (b, eta) in runs else own[0]  # sync and one_step fix their own η
        vs[b], spread[b] = median_spread(seed_ratios(ours, runs[at]))
        best = best_within(front[b], "max_staleness", eta)
        matched_max[b] = None if best is None else mine["throughput"] / best
        best = best_within(front[b], "mean_staleness", mine["mean_staleness"])
        matched_mean[b] = None if best is None else mine["throughput"] / best
    return {"staleflow_vs": vs, "staleflow_vs_spread": spread,
            "staleflow_vs_matched_max": matched_max, "staleflow_vs_matched_mean": matched_mean}


def frontier_markdown(results) -> str:
    """The frontier as a table: per system and configured η, the median throughput over
    seeds and the staleness it delivered."""
    front = frontier(results)
    lines = ["### Staleness frontier (median throughput over seeds; observed staleness)", "",
             "| system | η | k tok/s | ± spread | max | mean | share > η | seeds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for system, pts in front.items():
        for eta, p in pts.items():
            lines.append(f"| {system} | {eta} | {p['throughput'] / 1e3:.1f} | "
                         f"{p['throughput_spread'] / 1e3:.1f} | {p['max_staleness']} | "
                         f"{p['mean_staleness']:.2f} | {p['share_above_eta']:.1%} | "
                         f"{p['seeds']} |")
    return "\n".join(lines) + "\n"
