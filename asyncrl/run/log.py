"""What a run records, each in one place: a metrics row per trained step (metrics.jsonl,
TensorBoard, W&B if asked, the progress bar), the evaluations as they finish, and results.json.

    record = RunLog(workdir, progress, layout, earlier_wall_s)  # results.json, if resumed
    record.before(result, test)                                  # once per run, not per resume
    record.open(step, chrono, evaluations, rollouts, config)     # metrics.jsonl, TensorBoard, W&B
    record.batch(step, figures); record.evaluating(step)         # per step, as trained
    record.step(late.push(step, metrics))                        # its row, a step late
    record.close_evaluations(); record.close()
    record.finish(accounting, eta)                               # training over: results.json
    record.after(result, test, step, problems)                   # the run done: results.json

`result` is the evaluation of config.eval.split (what periodic evaluations read: the curves);
`test` the test split's, or None when that is the same split or the task holds nothing out.
results.json keeps them as "before" / "after" and "test": {"before", "after"}.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import sys
from collections.abc import Callable
from typing import Any

from asyncrl.eval.accuracy import BackgroundEvaluator, EvalResult, describe
from asyncrl.metrics import LogSection, MetricsWriter, read_metrics, staleness_summary
from asyncrl.rewards.watch import BatchAnswers, RewardHackingWatch
from asyncrl.run.progress import Progress
from asyncrl.run.timing import Chrono

# The run's logger, not this module's: its warnings read as they did when they were
# written from asyncrl/run/__init__.py, and a filter on that name still catches them.
log = logging.getLogger("asyncrl.run")


class RunLog:
    """The run's record. results.json is rewritten whole at each milestone (before, the end
    of training, after), so a run that stops or fails keeps what it had reached."""

    # Set by open(), when the loop starts: what each metrics row reads besides its step.
    writer: MetricsWriter
    chrono: Chrono
    evaluations: BackgroundEvaluator
    rollouts: Any  # drivers.rollouts.Rollouts (either backend): their figures()

    def __init__(self, workdir: pathlib.Path, progress: Progress, layout: str,
                 earlier_wall_s: float = 0.0):
        self.workdir, self.progress = workdir, progress
        self.path = workdir / "results.json"
        self.results: dict[str, Any] = (json.loads(self.path.read_text())
                                        if self.path.exists() else {})
        # This process's placement: a resumed run may be placed differently.
        self.results["placement"] = layout
        # Wall time counts over the processes of one run: a resumed one starts where its
        # checkpoint was saved (the time a killed process spent after that is redone, not counted).
        self.earlier_wall_s = earlier_wall_s
        self.rollout_tokens = 0
        self.watch = RewardHackingWatch()
        self._batches: dict[int, dict[str, Any]] = {}  # step -> its batch's figures, until logged
        self._evals: dict[str, float] = {}  # the latest finished evaluation's figures, until logged
        self._published_at: dict[int, float] = {}  # version -> run wall seconds when it existed

    def _write(self) -> None:
        self.path.write_text(json.dumps(self.results, indent=2))

    def before(self, result: EvalResult, test: EvalResult | None) -> None:
        self._record("before", result, test, self.progress.note)
        self._write()

    def _record(self, when: str, result: EvalResult, test: EvalResult | None,
                say: Callable[[str], None]) -> None:
        say(f"{when}: {describe(result)}")
        self.results[when] = dataclasses.asdict(result)
        if test is not None:
            say(f"{when}: {describe(test)}")
            self.results.setdefault("test", {})[when] = dataclasses.asdict(test)

    def open(self, step: int, chrono: Chrono, evaluations: BackgroundEvaluator, rollouts,
             log: LogSection, run_config: dict[str, Any]) -> None:
        """Starts the metrics rows at `step`; each row also reads the trainer's clock, the
        periodic evaluations and the rollouts' figures. `log` says where rows go besides
        metrics.jsonl and TensorBoard; a W&B run records `run_config` (JSON data)."""
        self.chrono, self.evaluations, self.rollouts = chrono, evaluations, rollouts
        self.writer = MetricsWriter(self.workdir, resume_step=step, log=log, run_config=run_config)

    def wall_s(self) -> float:
        return self.earlier_wall_s + self.chrono.wall_s()

    def batch(self, step: int, figures: dict[str, Any]) -> None:
        """The figures of the batch that trained `step`, kept until its row is written."""
        # A row's wall_s is when its step's weights existed, not when the row is written
        # (a step later, or after a checkpoint save): curves against time need the former.
        self._batches[step] = {**figures, "wall_s": self.wall_s()}

    def evaluating(self, step: int) -> None:
        """`step`'s weights went to the evaluator: its result records when they existed."""
        self._published_at[step] = self._batches[step]["wall_s"]

    def step(self, done: tuple[int, dict[str, float]] | None) -> None:
        """The metrics row of a step whose train metrics were read (LateMetrics), if any."""
        if done is None:
            return
        logged, metrics = done
        figures = self._batches.pop(logged)
        self.rollout_tokens += figures["rollout_tokens"]
        if "format_rate" in figures:
            figures["reward_hacking_suspected"] = int(self._watch(logged, figures))
        self._collect(self.evaluations.results())
        scalars = {"rollout_tok_s": self.rollout_tokens / self.chrono.wall_s(), **metrics,
                   **{k: v for k, v in figures.items() if isinstance(v, (int, float))},
                   **self.rollouts.figures(), **self.chrono.figures(),
                   "eval_s": self.evaluations.evaluate.seconds,
                   "evals_skipped": self.evaluations.skipped, **self._evals,
                   "wall_s": figures["wall_s"]}
        self._evals.clear()
        self.writer.write(logged, scalars,
                          {k: figures[k] for k in ("staleness", "response_lengths")},
                          {k: figures[k] for k in ("entries", "batch_digest")})
        self.progress.update(logged, scalars)

    def close_evaluations(self) -> None:
        """Waits for the evaluations submitted: before the last rows, each gets one."""
        self._collect(self.evaluations.close())

    def close(self) -> None:
        self.writer.close()

    def finish(self, accounting: dict[str, Any], eta: int) -> None:
        """Training is over (done or stopped): the protocol's and the staleness figures."""
        self.results["protocol"] = accounting
        # From the metrics file, not this process's steps: a resumed run reports all of its own.
        self.results["staleness"] = staleness_summary(read_metrics(self.writer.path), eta)
        self._write()

    def after(self, result: EvalResult, test: EvalResult | None, step: int, problems: int) -> None:
        """The evaluations after the last step, and the run's lines: before -> after."""
        self._record("after", result, test, lambda line: print(line, file=sys.stderr))
        self.results["steps"] = step
        self.results["rollout_tok_s"] = self.rollout_tokens / self.chrono.wall_s()
        self.results["wall_s"] = self.wall_s()
        self._write()
        lines = [(self.results, result.eval_label)]
        if test is not None:
            lines.append((self.results["test"], test.eval_label))
        for figures, label in lines:
            # A run resumed from an older results.json may lack a "before" of the test split.
            before = figures.get("before", {}).get("accuracy")
            print(f"{label} accuracy: {'?' if before is None else f'{before:.3f}'} -> "
                  f"{figures['after']['accuracy']:.3f} ({problems} problems)")
        print(f"results in {self.path}")

    def no_signal(self, step: int, message: str) -> None:
        """The first steps carried no learning signal (asyncrl/run/learning_signal.py)."""
        self.results["no_learning_signal"] = {"step": step, "why": message}
        self.progress.note(f"warning: {message}")
        log.warning("%s", message)

    def _watch(self, step: int, figures: dict[str, Any]) -> bool:
        suspected = self.watch.update(BatchAnswers(figures["reward_mean"], figures["format_rate"],
                                                   figures["rewarded_unformatted"]))
        if self.watch.turned_on:
            self.results.setdefault("reward_hacking", []).append(
                {"step": step, "why": self.watch.why})
            self.progress.note(f"step {step}: possible reward hacking: {self.watch.why}")
            log.warning("step %d: possible reward hacking: %s", step, self.watch.why)
        return suspected

    def _collect(self, finished: list[tuple[int, EvalResult]]) -> None:
        for version, result in finished:
            self.progress.note(f"version {version}: {describe(result)}")
            self._evals.update(result.as_dict("eval"), eval_version=version)
            self.results.setdefault("evals", []).append(
                {"step": version, "trained_s": self._published_at.pop(version),
                 "wall_s": self.wall_s(), **dataclasses.asdict(result)})
