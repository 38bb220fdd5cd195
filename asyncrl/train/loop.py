"""The training loop: resume or start, step, read metrics one step late, checkpoint.

The loop knows nothing of rollouts. It pulls batches from a `DataSource`; in the full system
that is the consume side of the StalenessManager and the TrajectoryServer, which is also
why the source, not the loop, says what a checkpoint must hold beside the TrainState.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Protocol

import jax

from asyncrl.train.checkpoint import ResumeData, restore_or_init
from asyncrl.train.metrics import LateMetrics
from asyncrl.train.trainer import TrainBatch, Trainer, TrainState

log = logging.getLogger(__name__)


class StopTraining(Exception):
    """Raised by a DataSource while waiting for a batch, when the run was asked to stop."""


class DataSource(Protocol):
    def next_batch(self, version: int) -> TrainBatch:
        """The batch that trains model `version` into `version + 1` (host arrays)."""

    def resume_data(self) -> ResumeData:
        """Position, staleness state and in-flight trajectories, as of now."""

    def restore(self, resume: ResumeData) -> None:
        """Rewind to what `resume_data` returned when the checkpoint was taken."""


def train(
    trainer: Trainer,
    data: DataSource,
    workdir: str | Path,
    num_steps: int,
    checkpoint_every: int,
    resume_from: str | Path | None = None,
    on_metrics: Callable[[int, dict[str, float]], None] | None = None,
    keep: int = 3,
    on_start: Callable[[TrainState, int], None] | None = None,
    after_step: Callable[[int, TrainState], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    initial_params=None,
) -> TrainState:
    """Trains until `state.step == num_steps`; returns the final state (checkpointed).

    on_start(state, step): after the restore, before the first batch (start rollouts here).
    after_step(step, state): right after step `step` is dispatched (push weights here).
    should_stop(): checked after every step; when true, or when the data source raises
    StopTraining, the loop checkpoints where it is and returns early.
    initial_params: the weights a fresh run starts from (default: a random init).
    """
    ckpt, state, resume, source = restore_or_init(trainer, workdir, resume_from, keep=keep,
                                                  initial_params=initial_params)
    log.info("train: %s", source)
    if resume is not None:
        data.restore(resume)
    late = LateMetrics()
    report = on_metrics or (lambda step, m: log.info("step %d: %s", step, m))
    # One host read here, before the loop: the step counter then lives on the host, so the
    # loop never waits on the device to decide what to do next.
    step = int(jax.device_get(state.step))
    if on_start is not None:
        on_start(state, step)
    try:
        while step < num_steps:
            try:
                batch = trainer.put_batch(data.next_batch(step))
            except StopTraining as stop:
                log.warning("train: stopping at step %d (%s)", step, stop)
                if step > 0 and ckpt.latest_step() != step:
                    ckpt.save(state, data.resume_data())
                break
            state, metrics = trainer.step(state, batch)
            step += 1
            if after_step is not None:
                after_step(step, state)
            if (done := late.push(step, metrics)) is not None:
                report(*done)
            stopping = should_stop is not None and should_stop()
            if stopping or step % checkpoint_every == 0 or step == num_steps:
                # Check the pending metrics first: a NaN step must not become a checkpoint.
                if (done := late.flush()) is not None:
                    report(*done)
                ckpt.save(state, data.resume_data())
            if stopping:
                log.warning("train: stopped at step %d on request; checkpoint saved", step)
                break
        if (done := late.flush()) is not None:
            report(*done)
    finally:
        ckpt.close()
    return state
