"""One post-training run: `run(config, workdir)`, what `python -m asyncrl.main` calls.

The trainer runs on the calling thread; the coordinator and each rollout instance on their
own threads (`asyncrl.drivers`); rewards in worker processes. In a trainer group (several
processes, `distributed.*`), process 0 runs all of this and the others only follow its
trainer's collectives (asyncrl/distributed/trainer_ops.py): the loop reaches the trainer
through `TrainerGroup` alone, which with one process is the plain calls. Read top to bottom: build,
restore, start the rollouts, then per step wait for a batch, train, publish the weights,
evaluate, log and checkpoint; finish with the final evaluation and the results file. What the
run records (metrics rows, evaluations, results.json) goes through one `RunLog`
(asyncrl/run_log.py); the loop only says when.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import pathlib
import sys
import threading
from typing import Any, Callable

import jax
import numpy as np

from asyncrl import config as config_lib
from asyncrl.coordinator.records import Batch
from asyncrl.data.sources import build_task_data
from asyncrl.drivers.local import local_rollouts
from asyncrl.drivers.rollouts import Rollouts
from asyncrl.drivers.threaded import StopRequested
from asyncrl.distributed.trainer_group import check_devices_per_process
from asyncrl.distributed.trainer_ops import TrainerGroup, follow
from asyncrl.errors import local_workdir
from asyncrl.eval.accuracy import BackgroundEvaluator, EvalResult, Evaluator, resolve_format_check
from asyncrl.model import graphdef_for
from asyncrl.placement import describe_layout, place
from asyncrl.plan.hbm import check_devices_hold_the_state
from asyncrl.policy import encode, load_policy
from asyncrl.progress import Progress
from asyncrl.rewards import REWARDS
from asyncrl.model.sampling import SamplingParams
from asyncrl.run_log import RunLog
from asyncrl.servers.parameters import ParameterServer
from asyncrl.timing import Chrono
from asyncrl.train.checkpoint import restore_or_init
from asyncrl.train.losses import LossConfig
from asyncrl.train.late_metrics import LateMetrics
from asyncrl.train.trainer import TrainBatch, TrainConfig, Trainer

log = logging.getLogger(__name__)


def run(c, workdir: str | pathlib.Path, *, stop: threading.Event | None = None,
        on_built: Callable[[Rollouts], None] | None = None) -> dict[str, Any]:
    """Post-trains the policy asynchronously; returns (and writes) the before/after figures.

    `stop`, once set (main sets it on SIGINT/SIGTERM), ends the run after the step in flight
    with a checkpoint; the same call resumes it. `on_built` sees the rollouts before they
    start (tests inject faults there).
    """
    stop = stop or threading.Event()
    workdir = local_workdir(workdir)
    workdir.mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------- build
    check(c)
    if jax.process_index() > 0:
        follow_group(c, workdir)
        return {}
    data, policy, layout, trainer, rollouts, evaluate = build(c, workdir)
    if on_built is not None:
        on_built(rollouts)

    # ---------------------------------------------------------------- restore
    # 1. the latest checkpoint in workdir  2. scratch: the configured policy's weights.
    progress = Progress(c.train.steps)
    ckpt, state, resume, source = restore(c, trainer, policy, workdir)
    # The trainer holds its own copy now. Kept, the loaded weights would stay resident for
    # the whole run (on a CPU host, 0.5 GB of the default run's memory).
    policy.params = None
    group = TrainerGroup(trainer, ckpt)
    progress.note(f"train: {source}; placement: {layout}")
    if resume is not None:
        rollouts.restore(resume)
    step = int(jax.device_get(state.step))  # from here on the step lives on the host
    record = RunLog(workdir, progress, layout, resume.run_wall_s if resume is not None else 0.0)
    params = group.host_params(state)
    if "before" not in record.results:
        record.before(*evaluate_reported(c, data, evaluate, params, step, "before", workdir))

    # ---------------------------------------------------------------- start rollouts
    chrono, late = Chrono(), LateMetrics()
    # Periodic evaluation on its own thread: the trainer hands the weights over and goes on.
    background = BackgroundEvaluator(evaluate, c.eval.split)
    stated = answer_check(c, policy)
    checkpoint_every = c.checkpoint.every_steps or c.train.steps
    record.open(step, chrono, background, rollouts)
    progress.start(step)
    rollouts.start(params, step)

    # ---------------------------------------------------------------- train loop
    failed = True  # until the loop ends normally: the group's followers learn which it was
    stopped = False  # on request after a step (a stop while waiting says so as it happens)
    try:
        while step < c.train.steps:
            chrono.phase("wait")
            try:
                batch = rollouts.wait_batch(step, c.train.batch_timeout_s, stop.is_set)
            except StopRequested:
                log.warning("train: stopping at step %d (interrupted while waiting for a batch)", step)
                break
            chrono.phase("step")
            state, metrics, train_batch = train_step(c, group, state, batch, step, rollouts.max_len)
            step += 1
            record.batch(step, describe_batch(batch, train_batch, stated))
            params = group.host_params(state)
            rollouts.publish(step, params)
            if c.eval.every_steps and step % c.eval.every_steps == 0 and step < c.train.steps:
                record.evaluating(step)
                submit_evaluation(background, rollouts, step, params)
            record.step(late.push(step, metrics))
            if step % checkpoint_every == 0 and step < c.train.steps and not stop.is_set():
                chrono.phase("checkpoint")
                record.step(late.flush())  # a NaN step must not become a checkpoint
                save_checkpoint(group, state, rollouts, record)
            stopped = stop.is_set()
            if stopped or step == c.train.steps:
                chrono.phase("checkpoint")
                break
        end_training(record, late, group, state, rollouts, step)
        if stopped:
            log.warning("train: stopped at step %d on request; checkpoint saved", step)
        if step >= c.train.steps:  # the final evaluation's weights, while the group is there
            params = group.host_params(state)
        failed = False
    finally:
        chrono.phase(None)
        shut_down(rollouts, record, group, progress, failed)

    # ---------------------------------------------------------------- finish
    record.finish(rollouts.accounting(), c.staleness.eta)
    if step < c.train.steps:
        log.info("stopped at step %d of %d; rerun the same command to resume", step, c.train.steps)
        return record.results
    record.after(*evaluate_reported(c, data, evaluate, params, step, "after", workdir), step,
                 c.eval.heldout_size)
    return record.results


def evaluate_reported(c, data, evaluate: Evaluator, params, step: int, when: str,
                      workdir: pathlib.Path) -> tuple[EvalResult, EvalResult | None]:
    """`when` is 'before' or 'after': the split periodic evaluations read (config.eval.split),
    and the test split beside it when that is another split and the task holds one out. Each
    greedy response goes to responses/<when>[_test].jsonl."""
    responses = workdir / "responses"
    result = evaluate(params, step, when, split=c.eval.split,
                      responses_to=responses / f"{when}.jsonl")
    if c.eval.split == "test" or not data.heldout_disjoint:
        return result, None
    return result, evaluate(params, step, when, split="test",
                            responses_to=responses / f"{when}_test.jsonl")


def check(c) -> None:
    """What can refuse the config before anything loads, on every process of the run."""
    # Each process is checked for its own devices: see asyncrl/placement.py.
    config_lib.validate(c, jax.local_device_count(), jax.process_count(), jax.process_index())
    check_devices_per_process()
    train_config(c)  # its loss names and ε are checked by the losses (JAX): before any loading


def build(c, workdir: pathlib.Path):
    """Process 0's parts: the task's data, the policy, where the meshes went (a line), the
    trainer, the rollouts and the evaluator."""
    data = build_task_data(c.task, c.eval.heldout_size, workdir)  # before the model: it may refuse
    build_rollouts, placement = rollouts_for(c)
    trainer_mesh, rollout_meshes = placement(c.mesh)
    # Before any weights load: a run its accelerators cannot hold ends here, saying why.
    check_devices_hold_the_state(c, trainer_mesh.devices.flat,
                                 [m.devices.flat for m in rollout_meshes])
    policy = load_policy(c.model)
    layout = describe_layout(trainer_mesh, rollout_meshes)
    trainer = trainer_for(c, policy, trainer_mesh)
    rollouts = build_rollouts(c, policy, rollout_meshes, data)
    evaluate = Evaluator(c, graphdef_for(policy.config), policy.config, rollout_meshes[0],
                         data, lambda p: encode(c, policy, p).tokens, policy.decode)
    return data, policy, layout, trainer, rollouts, evaluate


def train_step(c, group: TrainerGroup, state, batch: Batch, step: int, max_len: int):
    """Trains `step` on `batch`; returns the new state, its metrics (still on device) and
    the batch as trained."""
    train_batch = TrainBatch.from_groups(batch.groups, batch.v_traj, step, max_len,
                                         c.rollout.group_size)
    state, metrics = group.step(state, train_batch)
    # JAX dispatches the step and returns at once. Waiting for it here makes its time the
    # trainer's "step" (not the next "wait": the busy fraction measures compute), and
    # publishes a version only once its weights exist: an instance syncing to it would
    # otherwise stall inside its pull until the step is done.
    return jax.block_until_ready(state), metrics, train_batch


def end_training(record: RunLog, late: LateMetrics, group: TrainerGroup, state, rollouts,
                 step: int) -> None:
    """Training is over, done or stopped: the run waits for its evaluations, so each gets a
    metrics row, writes the last row, then saves the checkpoint a rerun resumes from."""
    record.close_evaluations()
    record.step(late.flush())  # a NaN step must not become a checkpoint
    if step > 0 and group.checkpointer.latest_step() != step:
        save_checkpoint(group, state, rollouts, record)


def save_checkpoint(group: TrainerGroup, state, rollouts, record: RunLog) -> None:
    group.save(state, dataclasses.replace(rollouts.resume_data(), run_wall_s=record.wall_s()))


def shut_down(rollouts, record: RunLog, group: TrainerGroup, progress: Progress,
              failed: bool) -> None:
    """Each part is shut down even when one before it fails: above all the checkpointer,
    whose close awaits the save in flight (skipped, the process would exit mid-write)."""
    # ExitStack runs them last-registered first; a failure is raised at the end, any
    # earlier one chained to it.
    with contextlib.ExitStack() as shutdown:
        shutdown.callback(record.close)
        shutdown.callback(progress.close)
        shutdown.callback(group.stop, failed)
        shutdown.callback(record.close_evaluations)
        shutdown.callback(rollouts.stop)


def submit_evaluation(background: BackgroundEvaluator, rollouts, version: int, params) -> None:
    """Evaluates `version` in the background. In-process rollouts keep the published version
    in memory, never changed: evaluation reads that one rather than a copy of the trainer's
    (which the next step donates), one copy of the weights fewer while it runs (on a CPU
    host, where device memory is the host's, 0.5 GB of the default run's peak). Ray's
    rollouts keep no such copy here: evaluation copies the trainer's weights."""
    if isinstance(rollouts.parameters, ParameterServer):
        latest = rollouts.parameters.latest()
        if latest is None or latest[0] != version:
            raise RuntimeError(f"evaluation of version {version}: the parameter server's "
                               f"newest is {None if latest is None else latest[0]}")
        background.submit(version, latest[1], copy=False)
    else:
        background.submit(version, params)


def follow_group(c, workdir: pathlib.Path) -> None:
    """Process > 0 of a trainer group: the same trainer on the same global mesh, restored from
    the same checkpoint, then process 0's collectives mirrored until it says stop. No data,
    rollouts, evaluation or files of its own."""
    policy = load_policy(c.model)
    _, placement = rollouts_for(c)
    trainer_mesh, _ = placement(c.mesh)
    trainer = trainer_for(c, policy, trainer_mesh)
    ckpt, state, _, source = restore(c, trainer, policy, workdir)
    # The console's one line from this process (as process 0's progress notes): where it began.
    print(f"trainer group process {jax.process_index()}: {source}; following process 0",
          file=sys.stderr)
    follow(trainer, ckpt, state)


# The lead and the followers of a trainer group build and restore the trainer through these
# two alone: a trainer that differed between processes would hang or garble the collectives.
def trainer_for(c, policy, mesh) -> Trainer:
    return Trainer.create(train_config(c), policy.config, mesh, c.rollout.group_size)


def restore(c, trainer: Trainer, policy, workdir: pathlib.Path):
    """The latest checkpoint in workdir, else the configured policy's weights."""
    return restore_or_init(trainer, workdir, keep=c.checkpoint.keep, initial_params=policy.params)


def rollouts_for(c) -> tuple[Callable[..., Rollouts], Callable]:
    """What builds the rollouts (one class, its backend chosen here) and where this process's
    meshes go: instances as threads on this host's devices (local), or as Ray actors with
    devices of their own (ray)."""
    if c.distributed.backend == "ray":
        # Ray loads only when asked for.
        from asyncrl.distributed.rollouts import RayInstances, ray_rollouts

        return ray_rollouts, RayInstances.place
    return local_rollouts, place


def train_config(c) -> TrainConfig:
    try:
        loss = LossConfig(advantage=c.train.advantage, policy_loss=c.train.policy_loss,
                          eps_low=c.train.eps_low or None, eps_high=c.train.eps_high or None,
                          tis_cap=c.train.tis_cap or None, kl_coef=c.train.kl_coef,
                          entropy_coef=c.train.entropy_coef, aggregation=c.train.aggregation)
    except ValueError as error:  # checked here, not in config.validate: the losses need JAX
        raise config_lib.ConfigError(f"config.train: {error}") from None
    return TrainConfig(loss=loss, learning_rate=c.train.learning_rate,
                       lr_schedule=c.train.lr_schedule, warmup_steps=c.train.warmup_steps,
                       total_steps=c.train.steps, weight_decay=c.train.weight_decay,
                       max_grad_norm=c.train.max_grad_norm,
                       num_microbatches=c.train.num_microbatches, remat=c.train.remat,
                       sampling=SamplingParams.of_rollout(c.rollout), seed=c.seed)


def answer_check(c, policy) -> Callable[[list[int]], bool] | None:
    """Whether a response's tokens state an answer in the format the task asks for (the
    format check of config.eval.format_reward), or None without one."""
    name = resolve_format_check(c)
    if name is None:
        return None
    check = REWARDS.get(name)
    return lambda tokens: check(response=policy.decode(tokens)) >= 1.0


def describe_batch(batch: Batch, train_batch: TrainBatch,
                   stated: Callable[[list[int]], bool] | None = None) -> dict[str, Any]:
    """The figures of one consumed batch: staleness, rewards, lengths, partial work; with
    `stated` (asyncrl.run.answer_check) the share of responses in the asked-for format."""
    records = [r for g in batch.groups for r in g]
    lengths = [len(r.tokens) for r in records]
    answers = {}
    if stated is not None:
        formatted = [stated(r.tokens) for r in records]
        answers = {"format_rate": float(np.mean(formatted)),
                   "rewarded_unformatted": float(np.mean(
                       # Full credit only: partial credit (answer_first) is shaping by design.
                       [r.reward >= 1.0 and not ok for r, ok in zip(records, formatted)]))}
    return {
        **answers,
        "cut_rate": float(np.mean([r.finish_reason == "length" for r in records])),
        "entries": batch.entries, "staleness": batch.staleness,
        # Identifies the batch's exact tokens: runs that must match can be compared.
        "batch_digest": hashlib.sha256(train_batch.tokens.tobytes()).hexdigest()[:16],
        # Generated by more than one weight version: weights changed mid-trajectory.
        "partial_rollouts": sum(len(set(r.versions)) > 1 for r in records),
        "rollout_tokens": sum(lengths),
        "reward_mean": float(np.mean([r.reward for r in records])),
        "response_length": float(np.mean(lengths)),
        "response_lengths": lengths,
        "prompt_length": float(np.mean([len(r.prompt) for r in records])),
        "interrupted": sum(r.interruptions for r in records),
        "migrated_in_batch": sum(r.migrations for r in records),
    }
