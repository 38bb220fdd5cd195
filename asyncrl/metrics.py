"""Per-step metrics to a JSONL file and TensorBoard event files in the workdir.

JSONL is the record tests and notebooks read back (one object per line, flushed every step so
a killed run keeps what it logged); TensorBoard files come from tensorboardX, which writes
them without TensorFlow.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any, Iterable

import numpy as np
from tensorboardX import SummaryWriter


def _plain(value: Any) -> Any:
    """JSON has no NaN/Inf or numpy scalars: convert, and keep non-finite values as strings."""
    if isinstance(value, (np.generic,)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(v) for v in (value.tolist() if isinstance(value, np.ndarray) else value)]
    return value


class MetricsWriter:
    def __init__(self, workdir: str | pathlib.Path, filename: str = "metrics.jsonl",
                 resume_step: int = 0):
        """`resume_step`: the step the run restarts from. Rows a killed run logged after its
        last checkpoint describe steps that will run again: they move to
        `superseded.<filename>` (kept, not lost), so each step has one row."""
        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.path = self.workdir / filename
        if self.path.exists():
            self._set_aside_rows_after(resume_step)
        self._jsonl = self.path.open("a", encoding="utf-8")
        self._tensorboard = SummaryWriter(str(self.workdir / "tensorboard"))

    def write(self, step: int, scalars: dict[str, float],
              histograms: dict[str, Iterable[float]] | None = None,
              records: dict[str, Any] | None = None) -> None:
        """`scalars` go to both sinks; `histograms` to TensorBoard as histograms and to JSONL
        as value lists; `records` (ids, tables) to JSONL only."""
        line = {"step": step, **scalars}
        for name, value in scalars.items():
            if isinstance(value, (int, float, np.number)) and not isinstance(value, bool):
                self._tensorboard.add_scalar(name, float(value), step)
        for name, values in (histograms or {}).items():
            values = np.asarray(list(values), dtype=np.float64)
            line[name] = values
            if values.size:
                self._tensorboard.add_histogram(name, values, step)
        line.update(records or {})
        self._jsonl.write(json.dumps(_plain(line)) + "\n")
        self._jsonl.flush()

    def _set_aside_rows_after(self, step: int) -> None:
        kept, later = [], []
        for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True):
            try:
                row_step = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError, TypeError):
                row_step = None  # a torn line: the killed run's last write
            (kept if row_step is not None and row_step <= step else later).append(
                line if line.endswith("\n") else line + "\n")
        if not later:
            return
        with (self.workdir / f"superseded.{self.path.name}").open("a", encoding="utf-8") as f:
            f.writelines(later)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text("".join(kept), encoding="utf-8")
        partial.replace(self.path)  # atomic: a crash here leaves the old file whole

    def close(self) -> None:
        self._jsonl.close()
        self._tensorboard.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | pathlib.Path) -> list[dict[str, Any]]:
    """Reads a metrics.jsonl back; a torn last line (the run was killed mid-write) is skipped."""
    rows = []
    lines = pathlib.Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number}: not a JSON object ({e})") from e
    return rows


def reported(results: dict[str, Any], when: str = "after") -> dict[str, Any]:
    """The evaluation a run reports, from its results.json: the test split's where the task
    holds one out, else the only one there is (a train-set evaluation)."""
    return results.get("test", {}).get(when, results[when])


def staleness_summary(rows: list[dict[str, Any]], eta: int) -> dict[str, float | int | None]:
    """Staleness (consumed version − V_traj) of every entry trained, over the whole run and
    over the steps after the first η (a row's `step` counts from 1, and batch v < η cannot be
    η late, so those steps say nothing about the lead the run settled at). None: no entry."""
    lags = [lag for r in rows for lag in r["staleness"]]
    steady = [lag for r in rows if r["step"] > eta for lag in r["staleness"]]
    return {"mean": float(np.mean(lags)) if lags else None, "max": max(lags, default=None),
            "mean_after_eta_steps": float(np.mean(steady)) if steady else None}


def steady_tokens_per_s(rows: list[dict[str, Any]]) -> float:
    """Rollout tokens trained in steps 2..N over the wall time from the end of step 1: the
    run's throughput with its compiles and first evaluation left out (NaN below 2 steps)."""
    if len(rows) < 2:
        return float("nan")
    seconds = rows[-1]["wall_s"] - rows[0]["wall_s"]
    return sum(r["rollout_tokens"] for r in rows[1:]) / max(seconds, 1e-9)
