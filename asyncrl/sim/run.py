"""Running the simulator: one run, or the grid of an experiment config, with its outputs.

Outputs of `run_grid` in the workdir:
  results.csv          one row per run; deterministic (no wall times), so two runs with the
                       same config and seeds are bit-identical
  results.md           the throughput table (tokens/s per system; StaleFlow's ratio to
                       each baseline), and the staleness each system reached
  timing.json          wall time of each run and the coordinator's share of it
  throughput.png, staleness.png   (asyncrl/sim/plots.py)
"""

from __future__ import annotations

import concurrent.futures
import csv
import dataclasses
import json
import multiprocessing
import os
from typing import Iterable

import ml_collections

from asyncrl.sim.cluster import Cluster
from asyncrl.sim.config import check, system_config
from asyncrl.sim.metrics import Result

# Wall times vary run to run; they go to timing.json, not the (deterministic) CSV.
CSV_FIELDS = [f.name for f in dataclasses.fields(Result)
              if f.name not in ("wall_s", "coordinator_s")]
BASELINES = ("sync", "one_step", "verl", "areal", "roll", "slime")  # labels of systems()


def simulate(run_config) -> Result:
    check(run_config)
    return Cluster(run_config).run()


def simulate_point(run_config, systems_table, label: str, *, instances: int, eta: int,
                   seed: int | None = None) -> Result:
    """System `label` at one grid point. A system that fixes its own η (sync, one_step) runs
    with it, and is reported at the point's η, so every table row has every system."""
    fields = {"num_instances": instances, "eta": eta}
    if seed is not None:
        fields["seed"] = seed
    rc = system_config(run_config, systems_table, label, **fields)
    return dataclasses.replace(simulate(rc), eta=eta)


def grid_points(config) -> list[dict]:
    """The grid's points (system, instances, η, seed), in a fixed order."""
    if "schedules" in config.grid and config.grid.schedules:
        raise ValueError(f"grid.schedules={list(config.grid.schedules)!r}: this field moved to "
                         "grid.systems (labels of the config's systems)")
    return [{"label": label, "instances": n, "eta": eta, "seed": seed}
            for n in config.grid.instances for eta in config.grid.etas
            for seed in config.grid.seeds for label in config.grid.systems]


def _simulate_point(config, point: dict) -> Result:
    if isinstance(config, dict):  # in a worker process
        config = ml_collections.ConfigDict(config)
    return simulate_point(config.run, config.systems, point["label"], instances=point["instances"],
                          eta=point["eta"], seed=point["seed"])


def run_grid(config, workdir: str, progress: bool = True) -> list[Result]:
    """Runs every grid point (in `config.grid.workers` processes) and writes the outputs.

    Results are kept in grid order whatever order the workers finish in, so the CSV does
    not depend on the number of workers. A system that fixes its own η (sync, one_step) is
    the same run at every η of the grid: it runs once, and its result fills each η's row.
    """
    from tqdm import tqdm

    os.makedirs(workdir, exist_ok=True)
    points = grid_points(config)
    key = [_run_key(config, p) for p in points]
    unique = list(dict.fromkeys(key))
    first = {k: points[key.index(k)] for k in unique}
    done: dict[tuple, Result] = {}
    # Closed (its line ended) on an error too, so the error is not printed onto the bar.
    with tqdm(total=len(unique), desc="sim grid", unit="run", disable=not progress) as bar:
        if config.grid.workers <= 1:
            for k in unique:
                p = first[k]
                bar.set_postfix_str(f"{p['label']} I={p['instances']} η={p['eta']}")
                done[k] = _simulate_point(config, p)
                bar.update()
        else:
            # Spawned, not forked: a caller that has JAX (or any threads) running would be
            # forked mid-lock; the simulator's workers need neither.
            spawn = multiprocessing.get_context("spawn")
            config_dict = config.to_dict()
            with concurrent.futures.ProcessPoolExecutor(config.grid.workers,
                                                        mp_context=spawn) as pool:
                futures = {pool.submit(_simulate_point, config_dict, first[k]): k for k in unique}
                for fut in concurrent.futures.as_completed(futures):
                    done[futures[fut]] = fut.result()
                    bar.update()
    results = [dataclasses.replace(done[k], eta=p["eta"]) for k, p in zip(key, points)]
    write_outputs(results, workdir)
    return results


def _run_key(config, point: dict) -> tuple:
    """What a point's run depends on: the η it runs with, not the row it is reported in."""
    system = config.systems[point["label"]]
    eta = system["eta"] if "eta" in system else point["eta"]
    return point["label"], point["instances"], eta, point["seed"]


def write_csv(results: Iterable[Result], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(CSV_FIELDS)
        for r in results:
            row = []
            for name in CSV_FIELDS:
                v = getattr(r, name)
                if isinstance(v, float):
                    v = repr(v)  # full precision, so equal runs give equal bytes
                elif isinstance(v, dict):
                    v = json.dumps(v, sort_keys=True)
                row.append(v)
            w.writerow(row)


def ratios(results: list[Result]) -> dict[tuple[int, int], dict[str, float]]:
    """StaleFlow's throughput over each baseline's, per (instances, η), averaged over seeds."""
    by_point: dict[tuple[int, int], dict[str, list[float]]] = {}
    for r in results:
        point = by_point.setdefault((r.instances, r.eta), {})
        point.setdefault(r.system, []).append(r.throughput_tok_s)
    out = {}
    for point, d in by_point.items():
        mean = {k: sum(v) / len(v) for k, v in d.items()}
        if "staleflow" in mean:
            out[point] = {b: mean["staleflow"] / mean[b] for b in BASELINES if b in mean}
    return out


def markdown(results: list[Result]) -> str:
    systems = list(dict.fromkeys(r.system for r in results))
    points = sorted({(r.instances, r.eta) for r in results})
    tput = {(r.instances, r.eta, r.system): r for r in results}
    lines = ["### Throughput (response tokens/s, thousands)", "",
             "| instances | η | " + " | ".join(systems) + " |",
             "|---:|---:|" + "---:|" * len(systems)]
    for n, eta in points:
        cells = [f"{tput[(n, eta, s)].throughput_tok_s / 1e3:.1f}" if (n, eta, s) in tput else "–"
                 for s in systems]
        lines.append(f"| {n} | {eta} | " + " | ".join(cells) + " |")
    rat = ratios(results)
    if rat:
        base = [b for b in BASELINES if any(b in d for d in rat.values())]
        lines += ["", "### StaleFlow speed-up (× baseline throughput)", "",
                  "| instances | η | " + " | ".join(base) + " | mean of verl/areal/roll/slime |",
                  "|---:|---:|" + "---:|" * (len(base) + 1)]
        for (n, eta), d in sorted(rat.items()):
            four = [d[b] for b in ("verl", "areal", "roll", "slime") if b in d]
            mean = f"{sum(four) / len(four):.2f}" if four else "–"
            cells = " | ".join(f"{d[b]:.2f}" if b in d else "–" for b in base)
            lines.append(f"| {n} | {eta} | {cells} | {mean} |")
    etas = sorted({r.eta for r in results})
    lines += ["", "### Observed staleness of consumed entries (max / mean over all runs)", "",
              "| system | " + " | ".join(f"η={e}" for e in etas) + " |",
              "|---|" + "---|" * len(etas)]
    for s in systems:
        cells = []
        for eta in sorted({r.eta for r in results}):
            rs = [r for r in results if r.system == s and r.eta == eta]
            if rs:
                mx = max(r.max_staleness for r in rs)
                mean = sum(r.mean_staleness for r in rs) / len(rs)
                cells.append(f"{mx} / {mean:.2f}")
            else:
                cells.append("–")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(results: list[Result], workdir: str) -> None:
    from asyncrl.sim import plots

    os.makedirs(workdir, exist_ok=True)
    write_csv(results, os.path.join(workdir, "results.csv"))
    with open(os.path.join(workdir, "results.md"), "w") as f:
        f.write(markdown(results))
    timing = [{"system": r.system, "instances": r.instances, "eta": r.eta, "seed": r.seed,
               "wall_s": r.wall_s, "coordinator_s": r.coordinator_s, "events": r.events}
              for r in results]
    with open(os.path.join(workdir, "timing.json"), "w") as f:
        json.dump(timing, f, indent=1)
    plots.throughput(results, os.path.join(workdir, "throughput.png"))
    plots.staleness(results, os.path.join(workdir, "staleness.png"))
