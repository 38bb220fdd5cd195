"""The schedules side by side: same model, task, η and steps, one after another in one run.

    python benchmarks/e2e.py                      # the tiny config (a few minutes)
    python benchmarks/e2e.py --variant=longtail   # tiny, responses long-tailed up to 32 tokens
    python benchmarks/e2e.py --variant=default    # SmolLM2-135M (long: ~20 min a schedule)
    python benchmarks/e2e.py --steps=30 --schedules=staleflow,sync
    python benchmarks/e2e.py --variant=longtail --frozen   # systems only: the policy stays put
    python benchmarks/e2e.py --variant=longtail --frozen --schedules=staleflow,staleflow_max
                                                  # StaleFlow's lead: auto (default) against max
    python benchmarks/e2e.py --compare-placement --variant=default --steps=6 --heldout_size=20
    python benchmarks/e2e.py --backend=ray --schedules=staleflow   # Ray actors against threads

Learning changes the response lengths, and how they change differs run to run, so tokens/s
of two schedules also compare two length distributions. `--frozen` trains at a learning rate
of 1e-12: every step still rolls out, rewards, trains and syncs, but the policy, hence the
length distribution, stays the same, and the schedules compare on the same work (the
simulator's cross-check with reality, tests/sim/test_reality.py, measures this way).

Throughput counts the rollout tokens the trainer consumed from step 2 on, over the wall time
from the end of step 1 (so every schedule's compile time is left out). Accuracy is greedy,
held out. The last line is JSON:
{"tokens_per_s": {...}, "final_accuracy": {...}, "mean_staleness": {...}, "staleflow_vs_sync": …,
 "staleflow_vs_best_baseline": …, "busy": {...}}

`--compare-placement` runs experiments/grpo.py (default or tiny) twice instead, the same
config and steps: disjoint on trainer + instances CPU devices (3 by default) and colocated
on one device (`--config.mesh.colocate=True`). The device count is fixed when JAX starts, so
each is its own `python -m asyncrl.main` process. Last line:
{"placement": {"disjoint": {...}, "colocated": {...}}, "colocated_vs_disjoint": {...}}

`--backend=ray` runs each schedule twice in the same run, its instances as threads here
(local) and as Ray actors on a loopback-only head (each run starts its own); the JSON adds
{"ray_tokens_per_s": {...}, "ray_vs_local": {...}} (the goal: ≥ 0.8).
"""

from __future__ import annotations

from asyncrl.host_devices import split_cpu_host

split_cpu_host(8)  # before JAX is imported

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncrl.cli import exit_on_user_error  # noqa: E402
from asyncrl.run import run  # noqa: E402
from asyncrl.metrics import read_metrics, reported, steady_tokens_per_s  # noqa: E402

SCHEDULES = {
    "staleflow": "experiments.staleflow",
    "sync": "experiments.baselines.sync",
    "one_step_off": "experiments.baselines.one_step_off",
    "token_bucket": "experiments.baselines.token_bucket",
    "barrier": "experiments.baselines.barrier",
}
# A schedule above with one setting changed, measured when asked for by name (--schedules):
# StaleFlow starting work as far ahead as η allows (`auto`, its default, holds one batch on
# a CPU, whose cores the trainer and the instances share).
SETTINGS = {"staleflow_max": ("staleflow", {"staleness.lead": "max"})}


def measure(config, run_dir: pathlib.Path) -> dict:
    """Runs one configured schedule (see `configure`) into run_dir and summarises it."""
    run(config, run_dir)
    return summarize(run_dir)


def configure(name: str, variant: str, steps: int, frozen: bool = False, backend: str = "local"):
    schedule, changes = SETTINGS.get(name, (name, {}))
    c = importlib.import_module(SCHEDULES[schedule]).get_config(
        None if variant == "default" else "tiny")
    for field, value in changes.items():
        section, key = field.split(".")
        c[section][key] = value
    c.distributed.backend = backend
    if variant == "longtail":
        # The untrained model stops at a random token: lengths from 1 to the cap, with a long
        # tail, and answer_first puts no pressure on them, so the tail stays all run long.
        c.rollout.max_new_tokens = 32
    c.train.steps = steps
    if frozen:
        c.train.learning_rate = 1e-12  # validate wants > 0; AdamW's step is then ~1e-12
    return c


def summarize(run_dir: pathlib.Path) -> dict:
    results = json.loads((run_dir / "results.json").read_text())
    rows = read_metrics(run_dir / "metrics.jsonl")
    seconds = rows[-1]["wall_s"] - rows[0]["wall_s"]
    idle = [v for k, v in rows[-1].items() if k.endswith("_idle_frac")]
    return {
        "tokens_per_s": steady_tokens_per_s(rows),
        "final_accuracy": reported(results)["accuracy"],
        "reward_last5": sum(r["reward_mean"] for r in rows[-5:]) / 5,
        "max_staleness": int(max(lag for r in rows for lag in r["staleness"])),
        "mean_staleness": results["staleness"]["mean_after_eta_steps"],  # None: too few steps
        "trainer_busy_frac": rows[-1]["trainer_busy_frac"],
        "instance_idle_frac": sum(idle) / len(idle),
        "seconds": seconds,
    }


def run_placement(name: str, variant: str, steps: int, workdir: pathlib.Path,
                  heldout_size: int | None = None) -> dict:
    """One placement of experiments/grpo.py in its own process, with its own device count."""
    from experiments.grpo import get_config
    from asyncrl.placement import devices_needed

    colocate = name == "colocated"
    mesh = get_config("tiny" if variant == "tiny" else None).mesh
    mesh.colocate = colocate
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split()
             if not f.startswith("--xla_force_host_platform_device_count")]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": " ".join(
        [*flags, f"--xla_force_host_platform_device_count={devices_needed(mesh)}"])}
    command = [sys.executable, "-m", "asyncrl.main",
               "--config=experiments/grpo.py" + (":tiny" if variant == "tiny" else ""),
               f"--config.mesh.colocate={colocate}", f"--config.train.steps={steps}",
               f"--workdir={workdir / name}"]
    if heldout_size:  # evaluation is outside the measured loop: a smaller one only saves time
        command.append(f"--config.eval.heldout_size={heldout_size}")
    print(f"{name}: XLA_FLAGS={env['XLA_FLAGS']} {' '.join(command[1:])}", flush=True)
    start = time.monotonic()
    subprocess.run(command, cwd=ROOT, env=env, check=True)
    return {"devices": devices_needed(mesh), "process_s": time.monotonic() - start,
            **summarize_placement(workdir / name)}


def summarize_placement(run_dir: pathlib.Path) -> dict:
    last = read_metrics(run_dir / "metrics.jsonl")[-1]
    results = json.loads((run_dir / "results.json").read_text())
    return {**summarize(run_dir), "loop_s": results["wall_s"], "layout": results["placement"],
            **{k: last[k] for k in ("trainer_step_s_mean", "decode_step_s_mean", "push_s_mean",
                                    "pull_s_mean")}}


def compare_placement(args) -> None:
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="placement-"))
    names = ("disjoint", "colocated")
    measured = {name: summarize_placement(workdir / name) if args.reuse else
                run_placement(name, args.variant, args.steps, workdir, args.heldout_size)
                for name in names}
    keys = ("tokens_per_s", "seconds", "loop_s", "trainer_busy_frac", "instance_idle_frac",
            "trainer_step_s_mean", "decode_step_s_mean", "push_s_mean", "pull_s_mean",
            "final_accuracy", "max_staleness")
    print(f"\n{'':20s}" + "".join(f"{n:>12s}" for n in names))
    for key in keys:
        print(f"{key:20s}" + "".join(f"{measured[n].get(key, float('nan')):12.4g}" for n in names))
    ratio = lambda key: round(measured["colocated"][key] / measured["disjoint"][key], 3)  # noqa: E731
    print(json.dumps({
        "placement": {n: {"devices": m.get("devices"), "layout": m["layout"],
                          **{k: round(m[k], 4) for k in keys},
                          **({"process_s": round(m["process_s"], 1)} if "process_s" in m else {})}
                      for n, m in measured.items()},
        "colocated_vs_disjoint": {"tokens_per_s": ratio("tokens_per_s"),
                                  "loop_s": ratio("loop_s")},
        "variant": args.variant, "steps": args.steps}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=("tiny", "longtail", "default"), default="tiny")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--schedules", default=",".join(SCHEDULES))
    parser.add_argument("--frozen", action="store_true",
                        help="learning rate 1e-12: the same length distribution for every schedule")
    parser.add_argument("--backend", choices=("local", "ray"), default="local",
                        help="ray: each schedule also with Ray actors, side by side")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--reuse", action="store_true",
                        help="summarise the runs already in --workdir instead of running them")
    parser.add_argument("--heldout_size", type=int, default=None,
                        help="--compare-placement: problems evaluated before and after each run")
    parser.add_argument("--compare-placement", action="store_true",
                        help="experiments/grpo.py disjoint (3 devices) and colocated (1 device)")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.WARNING)
    if args.compare_placement:
        if args.variant == "longtail" or args.frozen:
            parser.error("--compare-placement runs experiments/grpo.py: --variant tiny or default")
        return compare_placement(args)
    names = args.schedules.split(",")
    unknown = [name for name in names if name not in SCHEDULES and name not in SETTINGS]
    if unknown:
        parser.error(f"--schedules: unknown {', '.join(unknown)}; known: "
                     f"{', '.join([*SCHEDULES, *SETTINGS])}")
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="e2e-"))
    on_ray = names if args.backend == "ray" else []
    if args.reuse:
        measured = {name: summarize(workdir / name) for name in names}
        over_ray = {name: summarize(workdir / f"{name}-ray") for name in on_ray}
    else:
        measured, over_ray = {}, {}
        for name in names:  # local then Ray, schedule by schedule: the same machine load
            measured[name] = measure(configure(name, args.variant, args.steps, args.frozen),
                                     workdir / name)
            if name in on_ray:
                over_ray[name] = measure(configure(name, args.variant, args.steps, args.frozen,
                                                   "ray"), workdir / f"{name}-ray")

    print(f"\n{'schedule':14s} {'tok/s':>8s} {'acc':>6s} {'reward':>7s} {'stale':>6s} "
          f"{'trainer busy':>12s} {'inst idle':>9s}")
    rows = {**measured, **{f"{n} (ray)": m for n, m in over_ray.items()}}
    for name, m in rows.items():
        print(f"{name:14s} {m['tokens_per_s']:8.1f} {m['final_accuracy']:6.3f} "
              f"{m['reward_last5']:7.3f} {m['max_staleness']:6d} {m['trainer_busy_frac']:12.2f} "
              f"{m['instance_idle_frac']:9.2f}")
    tps = {n: m["tokens_per_s"] for n, m in measured.items()}
    summary = {"tokens_per_s": {n: round(v, 1) for n, v in tps.items()},
               "final_accuracy": {n: m["final_accuracy"] for n, m in measured.items()},
               "mean_staleness": {n: None if m["mean_staleness"] is None
                                  else round(m["mean_staleness"], 3) for n, m in measured.items()},
               "busy": {n: {"trainer": round(m["trainer_busy_frac"], 3),
                            "instances_idle": round(m["instance_idle_frac"], 3)}
                        for n, m in measured.items()}}
    if "staleflow" in tps:
        baselines = {n: v for n, v in tps.items() if n in SCHEDULES and n != "staleflow"}
        if "sync" in tps:
            summary["staleflow_vs_sync"] = round(tps["staleflow"] / tps["sync"], 3)
        if baselines:
            summary["staleflow_vs_best_baseline"] = round(tps["staleflow"] / max(baselines.values()), 3)
    if over_ray:
        summary["ray_tokens_per_s"] = {n: round(m["tokens_per_s"], 1) for n, m in over_ray.items()}
        summary["ray_vs_local"] = {n: round(m["tokens_per_s"] / tps[n], 3) for n, m in over_ray.items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    exit_on_user_error(main)
