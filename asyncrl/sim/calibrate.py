"""A simulator profile and a response-length histogram measured on a run of the real system.

`python -m asyncrl.tools.profile_engine` times the engine alone. A run of the whole system
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

The engine swaps weights between two decode steps and keeps the KV cache, so a simulation of
this system runs with `reprefill_on_resume = False`.
"""

from __future__ import annotations

import pathlib

import numpy as np

from asyncrl.metrics import read_metrics


def system_profile(run_dir: str | pathlib.Path, num_slots: int) -> dict:
    """A simulator profile (the JSON schema of `asyncrl.sim.profile`) from a barrier run."""
    rows = _rows(run_dir)
    last = rows[-1]
    if max(max(r["staleness"], default=0) for r in rows) != 0:
        raise ValueError(f"{run_dir}: not a synchronous run (staleness above 0), whose parts "
                         "overlap; calibrate from a run at η = 0 with the barrier schedule")
    return {
        "name": "system_cpu",
        "model": "the run's policy, as configured",
        "hardware": "the machine the run was measured on",
        "source": f"asyncrl.sim.calibrate.system_profile of the synchronous run {run_dir} "
                  f"({len(rows)} steps)",
        "step_latency": {"a": 0.0, "b": 0.0, "c": last["decode_step_s_mean"], "d": 0.0, "e": 0.0},
        "prefill_s_per_token": last["prefill_s_per_token"],
        "instance": {"num_slots": num_slots},
        "weights_bytes": 0.0,
        "network": {"weight_bandwidth_bytes_per_s": 1.0, "weight_sync_overhead_s": last["push_s_mean"]},
        "trainer": {"gpu_s_per_token": 0.0, "step_overhead_s": last["trainer_step_s_mean"]},
        "reward": {"latency_s": 0.0},
    }


def length_histogram(run_dir: str | pathlib.Path) -> dict:
    """The run's response lengths as an `empirical` histogram (`asyncrl.sim.workload`)."""
    lengths = np.concatenate([np.asarray(r["response_lengths"], np.int64) for r in _rows(run_dir)])
    if lengths.size == 0:
        raise ValueError(f"{run_dir}: the metrics hold no response lengths")
    cap = int(lengths.max())
    counts = np.bincount(lengths, minlength=cap + 1)
    bins = [[n, n + 1, int(k)] for n, k in enumerate(counts[:cap]) if k]
    return {"cap": cap, "bins": bins + [[cap, cap, int(counts[cap])]]}


def mean_prompt_length(run_dir: str | pathlib.Path) -> float:
    return float(np.mean([r["prompt_length"] for r in _rows(run_dir)]))


def _rows(run_dir) -> list[dict]:
    path = pathlib.Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no metrics to calibrate from")
    rows = read_metrics(path)
    missing = {"decode_step_s_mean", "response_lengths", "prompt_length"} - set(rows[-1]) if rows else {"any step"}
    if missing:
        raise ValueError(f"{path}: missing {sorted(missing)}; rerun with this version of asyncrl")
    return rows
