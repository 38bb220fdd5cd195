"""Small ablations through the Python API: run a config with some fields changed, summarise
the run from its metrics.jsonl, and plot several runs side by side.

`experiments/notebooks/ablations.ipynb` drives this module (an η sweep and each StaleFlow
strategy switched off one at a time, on the tiny config); the notebook only declares what
to change and shows what comes back.

Throughput here is *steady* throughput: the rollout tokens of the batches trained in steps
2..N over the wall time from the end of step 1 to the end of step N. `results["rollout_tok_s"]`
divides by the whole run's wall time instead, compiles and the "before" evaluation included,
which on a run of a few steps measures the compiler more than the system.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
import time
from typing import Any, Iterable, Mapping

import jax
import matplotlib.pyplot as plt
import ml_collections
import numpy as np

from asyncrl.run import run
from asyncrl.config import with_overrides
from asyncrl.metrics import read_metrics, steady_tokens_per_s


@dataclasses.dataclass(frozen=True)
class Ablation:
    name: str
    overrides: Mapping[str, Any]  # dotted config field -> value, e.g. {"staleness.eta": 0}


@dataclasses.dataclass(eq=False)  # runs compare by identity: `run in runs`
class Run:
    ablation: Ablation
    config: ml_collections.ConfigDict  # the config it ran
    results: dict[str, Any]  # what asyncrl.run.run returned (and wrote to results.json)
    rows: list[dict[str, Any]]  # metrics.jsonl, one row per step
    seconds: float  # run's wall time in this process, set-up and compiles included

    @property
    def name(self) -> str:
        return self.ablation.name

    @property
    def staleness(self) -> list[int]:
        """version - V_traj of every consumed entry, all steps together."""
        return [int(lag) for row in self.rows for lag in row["staleness"]]

    @property
    def steady_tok_s(self) -> float:
        return steady_tokens_per_s(self.rows)

    def summary(self) -> dict[str, Any]:
        rows, lags = self.rows, self.staleness
        tail = rows[-max(1, len(rows) // 4):]  # the last quarter of the steps
        return {
            "run": self.name,
            "steps": len(rows),
            "seconds": self.seconds,
            "first step at (s)": rows[0]["wall_s"],
            "steady tok/s": self.steady_tok_s,
            "run tok/s": self.results["rollout_tok_s"],
            "reward (last quarter)": float(np.mean([r["reward_mean"] for r in tail])),
            "staleness mean": float(np.mean(lags)),
            "staleness max": max(lags),
            "partial rollouts": sum(int(r["partial_rollouts"]) for r in rows),
            "migrated": int(rows[-1]["migrated"]),  # a running count
            "trainer busy": rows[-1]["trainer_busy_frac"],
            "accuracy": f"{self.results['before']['accuracy']:.2f} → "
                        f"{self.results['after']['accuracy']:.2f}",
        }


def enable_compilation_cache(directory: str | pathlib.Path) -> None:
    """JAX's persistent compilation cache, for every compile however small.

    Each `run` builds fresh jitted functions, so a second run in the same process
    traces and compiles again; with this cache the XLA compile of identical programs is read
    back from disk. Measured on the tiny config on a 2-core CPU: step 1 ends ~12 s into the
    first run and ~2 s into the later ones when the machine is idle; a busy machine took
    37 s for the first run and ~10 s for each later one, against ~45 s each without the cache.
    """
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


def run_ablation(base: ml_collections.ConfigDict, ablation: Ablation,
                 workdir: str | pathlib.Path) -> Run:
    """Runs `base` with the ablation's overrides from scratch in `workdir`.

    The workdir is emptied first: `run` resumes from a checkpoint it finds there and
    appends to metrics.jsonl, so a rerun would otherwise mix two runs' rows.
    """
    workdir = pathlib.Path(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    config = with_overrides(base, ablation.overrides)
    start = time.perf_counter()
    results = run(config, workdir)
    seconds = time.perf_counter() - start
    return Run(ablation, config, results, read_metrics(workdir / "metrics.jsonl"), seconds)


# ------------------------------------------------------------------------------ figures


def plot_reward_vs_time(runs: Iterable[Run], title: str = "reward vs wall time"):
    """One line per run; time counts from the end of step 1, so compiles (and whether the
    compilation cache was warm) do not shift the curves."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for curve in runs:
        t0 = curve.rows[0]["wall_s"]
        ax.plot([r["wall_s"] - t0 for r in curve.rows], [r["reward_mean"] for r in curve.rows],
                marker=".", label=curve.name)
    ax.set(xlabel="wall time after step 1 (s)", ylabel="batch reward mean", title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig


def plot_throughput(runs: Iterable[Run], title: str = "rollout throughput"):
    runs = list(runs)
    fig, ax = plt.subplots(figsize=(7, 0.45 * len(runs) + 1.2))
    names, values = [r.name for r in runs], [r.steady_tok_s for r in runs]
    bars = ax.barh(names, values, color="tab:blue")
    ax.bar_label(bars, fmt="%.0f", padding=3, fontsize="small")
    ax.invert_yaxis()  # first run on top
    ax.set(xlabel="trained rollout tokens / s, steps 2..N", title=title)
    ax.margins(x=0.15)
    fig.tight_layout()
    return fig


def plot_staleness(runs: Iterable[Run], title: str = "staleness of consumed entries"):
    """One histogram per run of version - V_traj over every consumed entry, with its bound η."""
    runs = list(runs)
    fig, axes = plt.subplots(1, len(runs), figsize=(2.6 * len(runs), 2.8), squeeze=False,
                             sharey=True)
    for ax, curve in zip(axes[0], runs):
        lags, eta = curve.staleness, curve.config.staleness.eta
        top = max(max(lags), eta, 1)
        ax.hist(lags, bins=np.arange(-0.5, top + 1.5), rwidth=0.85, color="tab:orange")
        ax.axvline(eta + 0.5, color="black", linestyle="--", linewidth=1, label="η")
        ax.set(title=curve.name, xlabel="version − V_traj", xticks=range(top + 1))
    axes[0][0].set_ylabel("entries")
    axes[0][0].legend(fontsize="small", loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save(fig, directory: str | pathlib.Path, name: str) -> pathlib.Path:
    path = pathlib.Path(directory) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path


def markdown_table(runs: Iterable[Run]) -> str:
    rows = [run.summary() for run in runs]
    columns = list(rows[0])

    def cell(value: Any) -> str:
        if not isinstance(value, float):
            return str(value)
        return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"

    lines = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines)
