"""Per-step metrics to a JSONL file and TensorBoard event files in the workdir, and to
Weights & Biases when the config asks (config.log.wandb; docs/metrics.md says what each is).

JSONL is the record tests and notebooks read back (one object per line, flushed every step so
a killed run keeps what it logged); TensorBoard files come from tensorboardX, which writes
them without TensorFlow; W&B (the optional `wandb` extra) writes under <workdir>/wandb.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import pathlib
import secrets
from typing import Any, Iterable

import numpy as np

from asyncrl.errors import UserError
from asyncrl.sections import Section, fail, section

# The W&B sink's modes; the version the `wandb` extra pins (pyproject.toml), for the error
# that says how to install it.
WANDB_MODES = ("online", "offline")
WANDB_REQUIREMENT = "wandb==0.31.0"


@section
class LogSection(Section):
    """`config.log`: the optional W&B sink, checked before anything loads, not when the
    run's first row is written."""

    name = "log"
    wandb: bool
    wandb_project: str
    wandb_entity: str  # '': the logged-in user's default
    wandb_mode: str

    def check(self) -> None:
        if self.wandb_mode not in WANDB_MODES:
            fail("log.wandb_mode", self.wandb_mode, f"one of {', '.join(map(repr, WANDB_MODES))}")
        if not self.wandb_project:
            fail("log.wandb_project", self.wandb_project, "a W&B project name")

    def check_installed(self) -> None:
        if self.wandb and importlib.util.find_spec("wandb") is None:
            fail("log.wandb", True, f"wandb is not installed: pip install {WANDB_REQUIREMENT} "
                 f"(or pip install -e .[wandb])")


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
                 resume_step: int = 0, log: LogSection | None = None,
                 run_config: dict[str, Any] | None = None):
        """`resume_step`: the step the run restarts from. Rows a killed run logged after its
        last checkpoint describe steps that will run again: they move to
        `superseded.<filename>` (kept, not lost), so each step has one row.
        `log`: with log.wandb the rows also go to W&B, which records `run_config` (the
        run's config as JSON data) beside them."""
        from tensorboardX import SummaryWriter  # here: checking a LogSection loads none of it

        self.workdir = pathlib.Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        # First: W&B is the sink that can refuse to start (not logged in).
        self._wandb_sink = (WandbSink(self.workdir, log, run_config or {})
                            if log is not None and log.wandb else None)
        self.path = self.workdir / filename
        if self.path.exists():
            self._set_aside_rows_after(resume_step)
        self._jsonl = self.path.open("a", encoding="utf-8")
        self._tensorboard = SummaryWriter(str(self.workdir / "tensorboard"))

    def write(self, step: int, scalars: dict[str, float],
              histograms: dict[str, Iterable[float]] | None = None,
              records: dict[str, Any] | None = None) -> None:
        """`scalars` go to every sink; `histograms` to TensorBoard and W&B as histograms and
        to JSONL as value lists; `records` (ids, tables) to JSONL only."""
        line = {"step": step, **scalars}
        numbers = {name: float(value) for name, value in scalars.items()
                   if isinstance(value, (int, float, np.number)) and not isinstance(value, bool)}
        for name, value in numbers.items():
            self._tensorboard.add_scalar(name, value, step)
        arrays = {name: np.asarray(list(values), dtype=np.float64)
                  for name, values in (histograms or {}).items()}
        for name, values in arrays.items():
            line[name] = values
            if values.size:
                self._tensorboard.add_histogram(name, values, step)
        line.update(records or {})
        self._jsonl.write(json.dumps(_plain(line)) + "\n")
        self._jsonl.flush()
        if self._wandb_sink is not None:
            self._wandb_sink.write(step, numbers, arrays)

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
        if self._wandb_sink is not None:
            self._wandb_sink.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class WandbSink:
    """A Weights & Biases run in <workdir>/wandb: the config at its start, then each row's
    scalars and histograms. One W&B run per run folder: its id is kept there, so a resumed
    run continues it (online, W&B drops a row whose step it already holds: the rows a killed
    run logged after its last checkpoint keep their first values there, unlike
    metrics.jsonl, where the rerun's replace them)."""

    def __init__(self, workdir: pathlib.Path, log: LogSection, run_config: dict[str, Any]) -> None:
        import wandb  # the optional extra, imported only when config.log.wandb asks for it

        self._wandb = wandb
        folder = workdir / "wandb"
        folder.mkdir(parents=True, exist_ok=True)
        id_file = folder / "asyncrl_run_id"
        if not id_file.exists():
            id_file.write_text(secrets.token_hex(4))
        try:
            self._run = wandb.init(
                project=log.wandb_project, entity=log.wandb_entity or None, mode=log.wandb_mode,
                dir=str(workdir), name=workdir.name, id=id_file.read_text().strip(),
                resume="allow", config=run_config,
                # console="off": the console is the progress bar's, which W&B would capture
                # line by line; root_dir: where W&B looks for the git commit it records.
                settings=wandb.Settings(console="off", root_dir=os.getcwd()))
        except wandb.errors.Error as error:
            raise UserError(f"config.log.wandb: Weights & Biases did not start: {error} "
                            f"(--config.log.wandb_mode=offline logs under {folder} with no "
                            f"account, for `wandb sync` later)") from error

    def write(self, step: int, scalars: dict[str, float], histograms: dict[str, np.ndarray]) -> None:
        row: dict[str, Any] = dict(scalars)
        row.update({name: self._wandb.Histogram(values)
                    for name, values in histograms.items() if values.size})
        self._run.log(row, step=step)

    def close(self) -> None:
        self._run.finish()
        # W&B's service process would otherwise live on until this process exits.
        self._wandb.teardown()


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
