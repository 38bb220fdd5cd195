r"""Time to accuracy: StaleFlow (η = 2) against synchronous GRPO (η = 0), over seeds, with a
negative control.

  python benchmarks/learning.py                          # the default task, 3 seeds each
  python benchmarks/learning.py --scale=tiny --seeds=0   # the tiny config, a smoke test
  python benchmarks/learning.py --workdir=runs/learning --seeds=0   # later: --seeds=0,1,2
                                                         # reuses seed 0's finished runs
  python benchmarks/learning.py --workdir=runs/learning --eta=4      # the harder setting:
                                                         # staleflow and control at η = 4,
                                                         # sync's runs reused

Each run is `python -m asyncrl.main` in its own process, same config except:
  staleflow  experiments/grpo.py (η = 2, or --eta; the StaleFlow admission, lead = auto)
  max        staleflow with `staleness.lead=max`: rollouts run as far ahead as η allows
  sync       experiments/baselines/sync.py (η = 0: generate, train, load weights, repeat)
  control    staleflow's η, the behaviour log-probs ignored (`train.policy_loss=uncorrected`:
             the clip is against the trainer's own weights, so stale samples get no correction)
Time to target is the training wall time (evaluation excluded: it runs on its own thread)
at which the first weights whose validation greedy accuracy reaches the target existed (from
the metrics row of the step that made them, the final weights' included). The
target is the synchronous runs' median final validation accuracy minus `--margin` (default 5 points),
so it asks "how soon does each schedule get where synchronous training ends up". A run that
never reaches it (null) ranks after every run that does, so a schedule's median time exists
while fewer than half its runs miss; speedup_median is sync's median over staleflow's, and
goal_met says whether it is >= 1.5 with staleflow's median final at most 2 points under
sync's. The control is expected to do worse; if it does not, the task does not exercise
staleness. The curves and the target are on the validation split (where settings may be
chosen); `final_accuracy` is each run's test figure after its last step (train-set where the
task holds nothing out: `accuracy_label` says which).
Last line, JSON:
  {"time_to_target_s": {"staleflow": [..], "sync": [..]}, "speedup_median": x,
   "target_above_start": bool (false: the target is no higher than a run's starting accuracy,
   so every time to it is null),
   "final_accuracy": {"staleflow": [..], "sync": [..], "control": [..]}, "target": t, ...}
and, with --plot, accuracy and reward against training wall time for every run.
The full benchmark takes about 3 × 3 runs of the default (20-30 min each on a 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncrl.cli import exit_on_user_error  # noqa: E402
from asyncrl.metrics import read_metrics, reported  # noqa: E402
from experiments.grpo import get_config  # noqa: E402

VARIANTS = {
    "staleflow": ("experiments/grpo.py", []),
    "max": ("experiments/grpo.py", ["--config.staleness.lead=max"]),
    "sync": ("experiments/baselines/sync.py", []),
    "control": ("experiments/grpo.py", ["--config.train.policy_loss=uncorrected",
                                         "--config.train.tis_cap=0"]),
}


DEFAULT_ETA = get_config().staleness.eta
REWARD_WINDOW = 3  # steps in the figure's running mean of batch rewards
GOAL_SPEEDUP = 1.5  # issue 15: median time-to-target, synchronous over StaleFlow
GOAL_FINAL_GAP = 0.02  # and StaleFlow's median final at most this far under synchronous


def asynchronous(variant: str) -> bool:
    return variant != "sync"


def run_dir(workdir: pathlib.Path, variant: str, seed: int, eta: int) -> pathlib.Path:
    """Where one run lives. Runs at another η than the default get their own name, so one
    --workdir holds both settings and sync's runs (η = 0 either way) serve both."""
    tag = f"_eta{eta}" if asynchronous(variant) and eta != DEFAULT_ETA else ""
    return workdir / f"{variant}{tag}_{seed}"


def run_one(variant: str, seed: int, args, workdir: pathlib.Path) -> dict:
    config, extra = VARIANTS[variant]
    config_args = ["tiny"] if args.scale == "tiny" else []
    if asynchronous(variant) and args.eta != DEFAULT_ETA:
        config_args.append(f"eta={args.eta}")
    arg = f":{','.join(config_args)}" if config_args else ""
    command = [sys.executable, "-m", "asyncrl.main", f"--config={config}{arg}",
               f"--config.seed={seed}", f"--config.task.seed={seed}", f"--workdir={workdir}",
               *extra, *args.override]
    if args.steps:
        command.append(f"--config.train.steps={args.steps}")
    if args.eval_every is not None:
        command.append(f"--config.eval.every_steps={args.eval_every}")
    # A finished run with the same command is kept: seeds can be added over several sittings
    # (the same --workdir) without redoing, or losing, the runs already measured.
    recorded = workdir / "benchmark_run.json"  # the command and its process time, once done
    if (workdir / "results.json").exists() and recorded.exists():
        earlier = json.loads(recorded.read_text())
        if earlier["command"] == command[1:]:
            print(f"[learning] {variant} seed {seed}: reusing {workdir}", file=sys.stderr, flush=True)
            return summarize(workdir, earlier["process_s"])
        raise SystemExit(f"{workdir} holds a run made with another command than\n  "
                         f"{' '.join(command[1:])}\nchoose another --workdir")
    # asyncrl.main resumes from the run's latest checkpoint by itself: an interrupted
    # benchmark goes on where it stopped, and says so.
    checkpoints = workdir / "checkpoints"
    resuming = " (resuming its unfinished run)" if checkpoints.exists() else ""
    print(f"[learning] {variant} seed {seed}{resuming}: {' '.join(command[1:])}",
          file=sys.stderr, flush=True)
    # The run's whole output goes to a file in its run dir, kept over attempts: the cause of
    # a failure is often far above the end (Orbax's shutdown noise follows it).
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "output.log"
    start = time.perf_counter()
    # ROOT first, the caller's own path after it (a site of extra packages, say) kept.
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    with log_path.open("a") as log:
        attempt_starts = log.tell()
        log.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(command[1:])}\n")
        log.flush()
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": pythonpath},
                              stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        with log_path.open() as log:
            log.seek(attempt_starts)
            output = log.read()
        first_error = output.find("Traceback (most recent call last)")
        excerpt = output[first_error:first_error + 4000] if first_error >= 0 else output[-4000:]
        raise RuntimeError(f"{variant} seed {seed} failed (exit status {done.returncode}); "
                           f"its whole output is in {log_path}. From its first traceback:\n"
                           f"{excerpt}")
    process_s = time.perf_counter() - start
    recorded.write_text(json.dumps({"command": command[1:], "process_s": process_s}))
    if not args.keep_checkpoints and checkpoints.exists():
        # The measurement is in results.json and metrics.jsonl; a default run's checkpoints
        # are 2.8 GB, and nine or more of them fill a laptop's disk.
        size = sum(f.stat().st_size for f in checkpoints.rglob("*") if f.is_file())
        shutil.rmtree(checkpoints)
        print(f"[learning] {variant} seed {seed}: done; removed its checkpoints "
              f"({size / 2**30:.1f} GiB; --keep-checkpoints keeps them)", file=sys.stderr, flush=True)
    return summarize(workdir, process_s)


def summarize(workdir: pathlib.Path, process_s: float) -> dict:
    results = json.loads((workdir / "results.json").read_text())
    rows = read_metrics(workdir / "metrics.jsonl")
    # (training seconds when the weights existed, accuracy), from before to after.
    curve = [(0.0, results["before"]["accuracy"])]
    curve += [(e["trained_s"], e["accuracy"]) for e in sorted(results.get("evals", []),
                                                               key=lambda e: e["step"])]
    # The final weights are the last step's: they existed at that step's row's wall_s, before
    # the last checkpoint, the shutdown and the final evaluation (results' wall_s counts those).
    last = next((r for r in rows if r["step"] == results["steps"]), None)
    if last is None:
        raise RuntimeError(f"{workdir / 'metrics.jsonl'} has no row for the final step "
                           f"{results['steps']} that {workdir / 'results.json'} reports")
    curve.append((last["wall_s"], results["after"]["accuracy"]))
    final = reported(results)  # the test split's, not the curve's validation split
    return {"curve": curve, "final": final["accuracy"],
            "best": max(a for _, a in curve), "train_s": last["wall_s"],
            "process_s": process_s, "label": final["eval_label"],
            "curve_label": results["after"]["eval_label"],
            "reward": [(r["wall_s"], r["reward_mean"]) for r in rows]}


def time_to(curve: list[tuple[float, float]], target: float) -> float | None:
    return next((t for t, accuracy in curve if accuracy >= target), None)


def target_above_start(measured: dict[str, list[dict]], target: float) -> bool:
    """Whether the target lies above every run's accuracy before its first step. Where sync
    ends near zero (the tiny task on some seeds), its median final minus the margin is not: each
    run would "reach" it at time 0, and a time to it would measure nothing."""
    return all(target > r["curve"][0][1] for runs in measured.values() for r in runs)


def median_time_to(times: list[float | None]) -> float | None:
    """The median over seeds of the time to target, where a run that never got there counts
    as slower than every run that did (its time is past its budget, not unknown): the median
    exists while fewer than half the runs miss, and is None (never) otherwise."""
    median = statistics.median(math.inf if t is None else t for t in times)
    return None if math.isinf(median) else median


def goal_met(speedup: float | None, finals: dict[str, list[float]]) -> bool:
    """The issue's goal: StaleFlow at least 1.5x sooner to the target (medians over seeds),
    its median final accuracy at most 2 points under synchronous training's."""
    gap = statistics.median(finals["sync"]) - statistics.median(finals["staleflow"])
    return speedup is not None and speedup >= GOAL_SPEEDUP and gap <= GOAL_FINAL_GAP


def plot(measured: dict[str, list[dict]], target: float, eta: int, path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, reward) = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"staleflow": "tab:blue", "max": "tab:green", "sync": "tab:orange",
               "control": "tab:gray"}
    label = next(iter(measured.values()))[0]["curve_label"]
    for variant, runs in measured.items():
        for i, r in enumerate(runs):
            name = f"{variant} (η = {eta if asynchronous(variant) else 0})" if i == 0 else None
            t, a = zip(*r["curve"])
            acc.plot(t, a, "o-", color=colours[variant], alpha=0.8, label=name)
            if len(r["reward"]) >= REWARD_WINDOW:
                # A batch holds few prompts (8 on the default): its reward swings by ±0.2 a step.
                t, w = zip(*r["reward"])
                smooth = [sum(w[i - REWARD_WINDOW + 1:i + 1]) / REWARD_WINDOW
                          for i in range(REWARD_WINDOW - 1, len(w))]
                reward.plot(t[REWARD_WINDOW - 1:], smooth, "-", color=colours[variant], alpha=0.6,
                            label=name)
    acc.axhline(target, ls="--", color="k", lw=0.8, label="target")
    acc.set(xlabel="training wall time (s)", ylabel=f"{label} greedy accuracy",
            title="accuracy of the weights trained by then")
    reward.set(xlabel="training wall time (s)",
               ylabel=f"mean batch reward, last {REWARD_WINDOW} steps",
               title="reward of the consumed batches (sampled)")
    acc.legend()
    reward.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=("default", "tiny"), default="default")
    parser.add_argument("--seeds", default="0,1,2")
    # `max` on request (--variants=staleflow,max,sync): the lead's learning comparison.
    parser.add_argument("--variants", default="staleflow,sync,control")
    parser.add_argument("--eta", type=int, default=DEFAULT_ETA,
                        help="staleness bound of staleflow and control (sync is η = 0)")
    parser.add_argument("--steps", type=int, default=0, help="override train.steps (0: config's)")
    parser.add_argument("--eval-every", type=int, default=None, help="override eval.every_steps")
    parser.add_argument("--margin", type=float, default=0.05,
                        help="target = median final sync accuracy minus this")
    parser.add_argument("--override", action="append", default=[],
                        help="one more --config.x=y flag for every run (repeatable)")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--keep-checkpoints", action="store_true",
                        help="keep each finished run's checkpoints (removed by default)")
    parser.add_argument("--plot", default=None, help="where to write the accuracy/reward figure")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown or "sync" not in variants:
        parser.error(f"--variants: need sync and any of {sorted(VARIANTS)}; got {variants}")
    if args.eta < 1:
        parser.error(f"--eta: the asynchronous variants need η >= 1 (sync is the η = 0 one); "
                     f"got {args.eta}")
    workdir = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="learning-"))
    measured = {v: [run_one(v, s, args, run_dir(workdir, v, s, args.eta)) for s in seeds]
                for v in variants}

    # The curves' split, not the reported test figure: time to target reads the curves.
    target = statistics.median(r["curve"][-1][1] for r in measured["sync"]) - args.margin
    timed = target_above_start(measured, target)
    if not timed:
        print(f"[learning] the target {target:.3f} (sync's median final minus --margin) is not "
              f"above every run's starting accuracy: no time to target is reported",
              file=sys.stderr)
    t2t = {v: [time_to(r["curve"], target) if timed else None for r in measured[v]]
           for v in ("staleflow", "max", "sync") if v in measured}
    medians = {v: median_time_to(ts) for v, ts in t2t.items()}
    speedup = None
    if medians.get("staleflow") is not None and medians["sync"] is not None:
        speedup = medians["sync"] / max(medians["staleflow"], 1e-9)
    finals = {v: [r["final"] for r in runs] for v, runs in measured.items()}
    if args.plot:
        plot(measured, target, args.eta, pathlib.Path(args.plot))
    for v, runs in measured.items():
        for s, r in zip(seeds, runs):
            print(f"{v:10s} seed {s}: final {r['final']:.3f} best {r['best']:.3f} "
                  f"training {r['train_s']:.0f} s (process {r['process_s']:.0f} s)", file=sys.stderr)
    print(json.dumps({
        "time_to_target_s": {v: [None if t is None else round(t, 1) for t in ts]
                             for v, ts in t2t.items()},
        "speedup_median": None if speedup is None else round(speedup, 3),
        "final_accuracy": finals,
        "median_time_to_target_s": {v: None if m is None else round(m, 1)
                                    for v, m in medians.items()},
        "goal_met": "staleflow" in finals and goal_met(speedup, finals),
        "best_accuracy": {v: [r["best"] for r in runs] for v, runs in measured.items()},
        "training_s": {v: [round(r["train_s"], 1) for r in runs] for v, runs in measured.items()},
        "target": round(target, 4), "target_above_start": timed, "margin": args.margin,
        "eta": args.eta, "seeds": seeds,
        "scale": args.scale, "accuracy_label": measured["sync"][0]["label"], "workdir": str(workdir),
    }))


if __name__ == "__main__":
    exit_on_user_error(main)
