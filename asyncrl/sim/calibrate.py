"""A simulator profile and a response-length histogram measured on a run of the real system.

`python benchmarks/profile_engine.py` times the engine alone. A run of the whole system
also pays for the instance loop in Python, the trajectory server, the reward pool and the
threads sharing the host, and those costs are what the simulator must reproduce to predict
the system on this machine. A synchronous run (η = 0, barrier) measures them one at a time:
rollout, rewards, the train step and the weight push never overlap there, so each mean in its
metrics is that part's own cost:

  decode step     instance decode seconds / decode steps. The engine's shapes are fixed (all
                  slots, the whole cache), so a step costs the same however many slots run:
                  the latency model is that constant (c), with no kv or batch term;
  prefill         instance prefill seconds / prefilled tokens;
  train step      from handing a batch over to asking for the next (the push included);
  weight copy     the push's copy; a pull in a run also waits for the step that produces the
                  weights, which the train step already counts;
  reward          inside the measured steps, not modelled apart (0).

Each cost is the mean over the run's second half (`steady_window`): the metrics hold means
since the start with the counts behind them, so two rows give the window's own mean. The
first steps also compile (every prompt bucket, every train-step shape), which costs more
than the rest of a short run together: a mean since the start predicted a tenth of the
measured throughput of the very run it was taken from.

The engine swaps weights between two decode steps and keeps the KV cache, so a simulation of
this system runs with `reprefill_on_resume = False`. The simulated run builds the same
coordinator core from the same `coordinator` fields, so every admission, and partial rollout
on or off, has its counterpart; only dynamic sampling is refused (the simulator's rewards are
modelled, not the task's).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from asyncrl.metrics import read_metrics, steady_tokens_per_s
from asyncrl.sim.config import run_config


@dataclasses.dataclass(frozen=True)
class Calibration:
    profile: dict  # the JSON schema of `asyncrl.sim.profile`
    lengths: dict  # an `empirical` length histogram (`asyncrl.sim.workload`)
    prompt_length: float  # mean prompt tokens


def from_barrier_run(run_dir: str | pathlib.Path, num_slots: int) -> Calibration:
    """The costs and lengths of a synchronous run; refuses a run whose parts overlapped."""
    path = pathlib.Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics to calibrate from")
    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path}: no step was recorded")
    missing = {"decode_step_s_mean", "decode_steps", "prefill_tokens", "response_lengths",
               "prompt_length"} - set(rows[-1])
    if missing:
        raise ValueError(f"{path}: missing {sorted(missing)}; rerun with this version of asyncrl")
    if max(max(r["staleness"], default=0) for r in rows) != 0:
        raise ValueError(f"{run_dir}: not a synchronous run (staleness above 0), whose parts "
                         "overlap; calibrate from a run at η = 0 with the barrier admission")
    first, last = steady_window(rows)

    def window_mean(mean: str, count: str | None = None) -> float:
        """`mean` over the window; `count` names the count behind it (None: one per step)."""
        n_first, n_last = ((first[count], last[count]) if count else (first["step"], last["step"]))
        if n_last <= n_first:
            return last[mean]  # nothing counted in the window (e.g. no prefill there)
        return (last[mean] * n_last - first[mean] * n_first) / (n_last - n_first)

    profile = {
        "name": "system_cpu",
        "model": "the run's policy, as configured",
        "hardware": "the machine the run was measured on",
        "source": f"asyncrl.sim.calibrate.from_barrier_run of {run_dir} ({len(rows)} steps)",
        "step_latency": {"a": 0.0, "b": 0.0, "c": window_mean("decode_step_s_mean", "decode_steps"),
                         "d": 0.0, "e": 0.0},
        "prefill_s_per_token": window_mean("prefill_s_per_token", "prefill_tokens"),
        "instance": {"num_slots": num_slots},
        "weights_bytes": 0.0,
        "network": {"weight_bandwidth_bytes_per_s": 1.0,
                    "weight_sync_overhead_s": window_mean("push_s_mean")},
        "trainer": {"gpu_s_per_token": 0.0, "step_overhead_s": window_mean("trainer_step_s_mean")},
        "reward": {"latency_s": 0.0},
    }
    lengths = np.concatenate([np.asarray(r["response_lengths"], np.int64) for r in rows])
    if lengths.size == 0:
        raise ValueError(f"{path}: the metrics hold no response lengths")
    cap = int(lengths.max())
    counts = np.bincount(lengths, minlength=cap + 1)
    bins = [[n, n + 1, int(k)] for n, k in enumerate(counts[:cap]) if k]
    return Calibration(profile, {"cap": cap, "bins": bins + [[cap, cap, int(counts[cap])]]},
                       float(np.mean([r["prompt_length"] for r in rows])))


def steady_window(rows: list[dict]) -> tuple[dict, dict]:
    """The rows that open and close the run's second half, its costs without the compiles.
    The last step is left out too: its row also holds the run's final push."""
    if len(rows) < 4:
        raise ValueError(f"{len(rows)} steps recorded; calibration needs at least 4 (the first "
                         "half of a run compiles, the last step finishes the run)")
    return rows[(len(rows) - 2) // 2], rows[-2]


def window_tokens_per_s(rows: list[dict]) -> float:
    """The measured rollout throughput over `steady_window`: what a calibrated simulation
    of the same run must reproduce."""
    first, last = steady_window(rows)
    return steady_tokens_per_s([r for r in rows if first["step"] <= r["step"] <= last["step"]])


def simulator_config(system_config, calibration: Calibration, files_dir: str | pathlib.Path,
                     steps: int):
    """The simulated run of a system config (its instances, slots, groups, batch, η and its
    whole `coordinator` section: admission and its parameters, routing, sync, partial
    rollout, migration, redundancy) on the calibrated costs; the profile and histogram
    files are written to `files_dir`. Throughput is measured from step 2 on, as in the real
    run."""
    c = system_config
    co = c.coordinator
    if co.dynamic_sampling:
        # The simulator filters groups by its own modelled rewards (pass_rate_beta), not by
        # the task's: the prediction would compare runs that filter at different rates.
        raise ValueError("coordinator.dynamic_sampling=True: the simulator's rewards are "
                         "modelled (run_config().pass_rate_beta), not the task's, so it would "
                         "filter another share of groups; calibrate from a run without it")
    files_dir = pathlib.Path(files_dir)
    files_dir.mkdir(parents=True, exist_ok=True)
    (files_dir / "profile.json").write_text(json.dumps(calibration.profile))
    (files_dir / "lengths.json").write_text(json.dumps(calibration.lengths))
    sim = run_config()
    sim.profile = str(files_dir / "profile.json")
    sim.response_lengths = {"name": "empirical", "path": str(files_dir / "lengths.json")}
    sim.prompt_lengths = {"name": "constant", "value": max(1, round(calibration.prompt_length))}
    sim.eta, sim.lead = c.staleness.eta, c.staleness.lead
    # One schema (asyncrl/coordinator/config.py), so the whole section carries over; the
    # parameters of an admission registered by the run's own code are taken in, as the
    # grid's systems take theirs (system_config).
    with sim.coordinator.admission_params.unlocked():
        sim.coordinator.update(co)
    sim.num_instances = c.mesh.rollout_instances
    sim.num_slots = c.rollout.num_slots
    sim.group_size = c.rollout.group_size
    sim.batch_size = c.train.batch_size
    sim.reprefill_on_resume = False
    sim.warmup_steps, sim.measure_steps = 1, steps - 1
    return sim
