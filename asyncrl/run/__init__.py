"""One post-training run: `run(config, workdir)`, what `python -m asyncrl.main` calls.

The trainer runs on the calling thread; the coordinator and each rollout instance on their
own threads (`asyncrl.drivers`); rewards in worker processes. In a trainer group (several
processes, `distributed.*`) every process runs the same loop on the same batches; process 0
alone fetches them, publishes weights, evaluates and records (its `Lead`), and the loop
reaches the trainer through `TrainerGroup` alone (asyncrl/distributed/trainer_ops.py), which
broadcasts what only process 0 knows and with one process is the plain calls. Read top to
bottom: build, restore, start the rollouts, then per step wait for a batch, train, publish the
weights, evaluate, log and checkpoint; finish with the final evaluation and the results file.
What the run records (metrics rows, evaluations, results.json) goes through one `RunLog`
(asyncrl/run/log.py); the loop only says when.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import logging
import pathlib
import sys
import threading
import time
from typing import Any, Callable

import jax
import numpy as np

from asyncrl import config as config_lib
from asyncrl import run_folder
from asyncrl.config_args import config_json
from asyncrl.coordinator.records import Batch
from asyncrl.data.sources import build_task_data
from asyncrl.drivers.local import local_rollouts
from asyncrl.drivers.rollouts import Rollouts
from asyncrl.drivers.threaded import StopRequested
from asyncrl.distributed.trainer_group import check_devices_per_process
from asyncrl.distributed.trainer_ops import TrainerGroup, shard_settings
from asyncrl.errors import local_workdir
from asyncrl.eval.accuracy import BackgroundEvaluator, EngineSettings, EvalResult, Evaluator
from asyncrl.model import graphdef_for
from asyncrl.model.attention import check_runs_here
from asyncrl.placement import describe_layout, place
from asyncrl.plan.hbm import check_devices_hold_the_state
from asyncrl.policy import encode, load_policy
from asyncrl.rewards import REWARDS
from asyncrl.run.learning_signal import LearningSignalWatch, NoLearningSignal, signal_figures
from asyncrl.run.log import RunLog
from asyncrl.run.progress import Progress
from asyncrl.run.timing import Chrono
from asyncrl.servers.parameters import ParameterServer
from asyncrl.train.checkpoint import restore_or_init
from asyncrl.train.late_metrics import LateMetrics
from asyncrl.train.trainer import TrainBatch, Trainer

log = logging.getLogger(__name__)


def run(config, workdir: str | pathlib.Path, *, stop: threading.Event | None = None,
        on_built: Callable[[Rollouts], None] | None = None, experiment: str | None = None,
        resume_anyway: bool = False) -> dict[str, Any]:
    """Post-trains the policy asynchronously; returns (and writes) the before/after figures.

    `config`: the experiment's ConfigDict (resolved here, once) or its RunSpec
    (asyncrl.config.resolve).

    `stop`, once set (main sets it on SIGINT/SIGTERM), ends the run after the step in flight
    with a checkpoint; the same call resumes it. `on_built` sees the rollouts before they
    start (tests inject faults there). Every process of a trainer group runs this loop; what
    only process 0 does (rollouts, evaluation, records) goes through its `Lead`.

    The workdir's run.json (asyncrl/run_folder.py) must name this run: `experiment` (the
    config file and argument; None from the Python API, which compares the config alone)
    and the config's identity fields; `resume_anyway` uses another run's folder all the same.
    """
    stop = stop or threading.Event()
    workdir = local_workdir(workdir)
    with disk_full_is_user_error(workdir):
        spec = check(config)
        if jax.process_index() == 0:  # before anything is written there
            run_folder.claim(workdir, spec, experiment, resume_anyway)
        workdir.mkdir(parents=True, exist_ok=True)
        return _run(spec, workdir, stop, on_built)


@contextlib.contextmanager
def disk_full_is_user_error(workdir: pathlib.Path):
    """A full disk is the user's to fix, and the run resumes from its last checkpoint once
    it is: one line naming the folder, not a traceback from whichever write hit it."""
    try:
        yield
    except OSError as error:
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise run_folder.folder_write_error(workdir, error) from error
        raise


def _run(c, workdir: pathlib.Path, stop: threading.Event, on_built) -> dict[str, Any]:
    # ---------------------------------------------------------------- build and restore
    lead = Lead.build(c, workdir, on_built) if jax.process_index() == 0 else None
    policy, trainer = (lead.policy, lead.trainer) if lead else follower_trainer(c)
    # 1. the latest checkpoint in workdir  2. scratch: the configured policy's weights.
    ckpt, state, resume, source = restore(c, trainer, policy, workdir)
    # The trainer holds its own copy now. Kept, the loaded weights would stay resident for
    # the whole run (on a CPU host, 0.5 GB of the default run's memory).
    policy.params = None
    group = TrainerGroup(trainer, ckpt, shard_settings(c.distributed, c.model.param_dtype))
    step = int(jax.device_get(state.step))  # from here on the step lives on the host
    if lead is None:  # the console's one line from this process: where it began
        print(f"trainer group process {jax.process_index()}: {source}; following process 0",
              file=sys.stderr)
    params = group.host_params(state, step)

    # ---------------------------------------------------------------- train loop
    failed = True  # until the loop ends normally: the group's other processes learn which
    try:
        if lead:
            lead.begin(source, resume, step, params)
        fetch = (lambda: lead.fetch(step, stop)) if lead else None
        while (batch := group.next_batch(fetch)) is not None:
            state, metrics = group.step(state, batch)
            # JAX dispatches the step and returns at once. Waiting for it here makes its
            # time the trainer's "step" (not the next "wait": the busy fraction measures
            # compute), and publishes a version only once its weights exist: an instance
            # syncing to it would otherwise stall inside its pull until the step is done.
            state = jax.block_until_ready(state)
            step += 1
            started = time.perf_counter()
            params = group.host_params(state, step)
            if lead:
                lead.trained(step, metrics, params, time.perf_counter() - started)
            if (step % (c.checkpoint.every_steps or c.train.steps) == 0 and step < c.train.steps
                    and group.agree(not stop.is_set())):
                group.save(state, lead.checkpointing() if lead else None)
        # Training is over, done or stopped: the evaluations are awaited (each gets its
        # metrics row), then the checkpoint a rerun resumes from.
        if lead:
            lead.close_evaluations()
        if step > 0 and ckpt.latest_step() != step:
            group.save(state, lead.checkpointing() if lead else None)
        if step >= c.train.steps:  # the final evaluation's weights, while the group is there
            params = group.host_params(state, step)
            if lead:  # served where they live: pulled while every process still serves
                params = lead.arrays(params)
        failed = False
    finally:
        if lead:
            lead.shut_down(group, failed)
        else:
            group.stop(failed)
    saved = ckpt.latest_step()
    return lead.finish(step, params, stop.is_set(),
                       None if saved is None else ckpt.directory / str(saved)) if lead else {}


class Lead:
    """What process 0 alone does around the loop: its data, rollouts, evaluations, progress
    bar and records (asyncrl/run/log.py)."""

    def __init__(self, c, workdir: pathlib.Path, data, policy, layout: str, trainer: Trainer,
                 rollouts: Rollouts, evaluate: Evaluator):
        self.c, self.workdir, self.data, self.policy, self.layout = c, workdir, data, policy, layout
        self.trainer, self.rollouts, self.evaluate = trainer, rollouts, evaluate
        self.progress = Progress(c.train.steps)
        self.chrono, self.late = Chrono(), LateMetrics()
        # Periodic evaluation on its own thread: the trainer hands the weights over and goes on.
        self.background = BackgroundEvaluator(evaluate, c.eval.split)
        self.stated = answer_check(c.eval.format_check(c.task.reward), policy)
        self.signal = LearningSignalWatch(
            c.task.reward, "task.instruction / task.system_prompt", c.rollout.group_size)
        self.record: RunLog | None = None
        # The batch in training, as consumed and as trained: its figures are logged.
        self.batch: Batch | None = None
        self.train_batch: TrainBatch | None = None

    @classmethod
    def build(cls, c, workdir: pathlib.Path, on_built) -> "Lead":
        lead = cls(c, workdir, *build(c, workdir))
        if on_built is not None:
            on_built(lead.rollouts)
        return lead

    def begin(self, source: str, resume, step: int, params) -> None:
        """After the restore: the records, the first evaluation, then the rollouts start."""
        self.progress.note(f"train: {source}; placement: {self.layout}")
        if self.rollouts.lead_note:
            self.progress.note(self.rollouts.lead_note)
        if resume is not None:
            self.rollouts.restore(resume)
        self.record = RunLog(self.workdir, self.progress, self.layout,
                             resume.run_wall_s if resume is not None else 0.0)
        if "before" not in self.record.results:
            self.record.before(*evaluate_reported(self.c, self.data, self.evaluate,
                                                  self.arrays(params), step, "before",
                                                  self.workdir))
        self.record.open(step, self.chrono, self.background, self.rollouts, self.c.log,
                         config_json(self.c))
        self.progress.start(step)
        self.rollouts.start(params, step)

    def fetch(self, step: int, stop: threading.Event) -> TrainBatch | None:
        """The batch that trains `step` into step + 1; None once the run is done or stopped."""
        if step >= self.c.train.steps or stop.is_set():
            return None
        self.chrono.phase("wait")

        def stop_waiting() -> bool:  # asked every half second while the batch is not there
            if self.c.coordinator.dynamic_sampling:
                counters = self.rollouts.core.counters
                self._nothing_to_learn(step, self.signal.filtered(
                    step, counters.filtered_groups, counters.kept_groups,
                    self.c.train.batch_size))
            return stop.is_set()

        try:
            self.batch = self.rollouts.wait_batch(step, self.c.train.batch_timeout_s, stop_waiting)
        except StopRequested:
            log.warning("train: stopping at step %d (interrupted while waiting for a batch)", step)
            return None
        self.chrono.phase("step")
        self.train_batch = self.trainer.host_batch(self.batch.groups, self.batch.v_traj, step,
                                                   self.rollouts.max_len)
        return self.train_batch

    def trained(self, step: int, metrics, params, staged_s: float = 0.0) -> None:
        """Step `step` is trained: its weights published, its figures, maybe evaluated.
        `staged_s`: what getting its weights out of the trainer took (a gather, or staging
        the shards), which `publish_s` adds to the publish."""
        started = time.perf_counter()
        self.rollouts.publish(step, params)
        figures = describe_batch(self.batch, self.train_batch, self.stated)
        figures["publish_s"] = staged_s + time.perf_counter() - started
        self.record.batch(step, figures)
        self._nothing_to_learn(step, self.signal.update(step, figures), metrics)
        if self.c.eval.every_steps and step % self.c.eval.every_steps == 0 and step < self.c.train.steps:
            self.record.evaluating(step)
            submit_evaluation(self.background, self.rollouts, step, self.arrays(params))
        self.record.step(self.late.push(step, metrics))

    def arrays(self, params):
        """The weights as arrays: pulled onto the evaluation's mesh when the group serves
        them where they live (distributed.transport = 'shards'), else as they are."""
        from asyncrl.distributed.shard_service import Weights

        if isinstance(params, Weights):
            return params.fetch(self.evaluate.mesh.devices.flat[0])
        return params

    def _nothing_to_learn(self, step: int, message: str | None, metrics=None) -> None:
        """What LearningSignalWatch found, if anything: said once, or the run's end (`metrics`:
        those of `step`, trained, whose row is then written with the rest first)."""
        if message is None:
            return
        if self.c.train.stop_without_signal:
            if metrics is not None:
                self.record.step(self.late.push(step, metrics))
            self.record.step(self.late.flush())
            raise NoLearningSignal(f"{message} (the run stops: train.stop_without_signal is True)")
        self.record.no_signal(step, message)

    def checkpointing(self):
        """The resume data of a checkpoint about to be written."""
        self.chrono.phase("checkpoint")
        self.record.step(self.late.flush())  # a NaN step must not become a checkpoint
        return dataclasses.replace(self.rollouts.resume_data(), run_wall_s=self.record.wall_s())

    def close_evaluations(self) -> None:
        """Training is over: the evaluations awaited, each with its row, and the last row."""
        self.chrono.phase("checkpoint")
        self.record.close_evaluations()
        self.record.step(self.late.flush())

    def shut_down(self, group: TrainerGroup, failed: bool) -> None:
        """Each part is shut down even when one before it fails: above all the checkpointer,
        whose close awaits the save in flight (skipped, the process would exit mid-write)."""
        self.chrono.phase(None)
        # ExitStack runs them last-registered first; a failure is raised at the end, any
        # earlier one chained to it.
        with contextlib.ExitStack() as shutdown:
            if self.record is not None:
                shutdown.callback(self.record.close)
            shutdown.callback(self.progress.close)
            shutdown.callback(group.stop, failed)
            if failed:  # no final evaluation follows: its graders' processes end here
                shutdown.callback(self.evaluate.close)
            if self.record is not None:
                shutdown.callback(self.record.close_evaluations)
            shutdown.callback(self.rollouts.stop)

    def finish(self, step: int, params, stopped: bool,
               checkpoint: pathlib.Path | None) -> dict[str, Any]:
        """The accounting, then (the run done) the final evaluation: results.json.
        `checkpoint`: the latest one in the workdir, if any was written."""
        with contextlib.closing(self.evaluate):  # the run's last evaluation, if any
            return self._finish(step, params, stopped, checkpoint)

    def _finish(self, step: int, params, stopped: bool,
                checkpoint: pathlib.Path | None) -> dict[str, Any]:
        self.record.finish(self.rollouts.accounting(), self.c.staleness.eta)
        if step < self.c.train.steps:
            if stopped:
                log.warning("train: stopped on request at step %d of %d; %s", step,
                            self.c.train.steps,
                            f"its checkpoint is {checkpoint}: rerun the same command to resume"
                            if checkpoint is not None else
                            "no checkpoint was written (none before the first step): a rerun "
                            "starts from the beginning")
            return self.record.results
        self.record.after(*evaluate_reported(self.c, self.data, self.evaluate,
                                             self.arrays(params), step, "after", self.workdir),
                          step, self.c.eval.heldout_size)
        return self.record.results


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


def check(config) -> config_lib.RunSpec:
    """The run's spec, or what refuses the config before anything loads, on every process
    of the run."""
    # Each process is checked for its own devices: see asyncrl/placement.py.
    spec = config_lib.validate(config, jax.local_device_count(), jax.process_count(),
                               jax.process_index())
    check_devices_per_process()
    spec.train_config()  # its loss names and ε are checked by the losses (JAX): before any loading
    check_runs_here(spec.train.attention, packed=spec.train.tokens_per_row > 0)
    return spec


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
    return data, policy, layout, trainer, rollouts, evaluator_for(c, policy, rollout_meshes[0], data)


def evaluator_for(c, policy, mesh, data) -> Evaluator:
    """The run's evaluation (its `eval` section) of `policy` on `mesh`: engines like the
    rollouts' (slots, prompt bucket, sampling), the task's prompts and reward."""
    engines = EngineSettings(num_slots=c.rollout.num_slots, prompt_bucket=c.rollout.prompt_bucket,
                             sampling=c.rollout.sampling(), seed=c.seed)
    return Evaluator(c.eval, engines, graphdef_for(policy.config), policy.config, mesh, data,
                     lambda p: encode(policy, p, c.task, c.rollout.prompt_bucket).tokens,
                     policy.decode, reward=c.task.reward, reward_pool=c.rewards.pool)










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




def follower_trainer(c):
    """A process > 0 of a trainer group: the policy (for its config and initial weights) and
    the same trainer on the same global mesh; no data, rollouts, evaluation or files."""
    policy = load_policy(c.model)
    _, placement = rollouts_for(c)
    trainer_mesh, _ = placement(c.mesh)
    return policy, trainer_for(c, policy, trainer_mesh)


# The lead and the followers of a trainer group build and restore the trainer through these
# two alone: a trainer that differed between processes would hang or garble the collectives.
def trainer_for(c, policy, mesh) -> Trainer:
    return Trainer.create(c.train_config(), policy.config, mesh, c.rollout.group_size)


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


def answer_check(name: str | None, policy) -> Callable[[list[int]], bool] | None:
    """Whether a response's tokens state an answer in the format the task asks for (`name`:
    the format check config.eval.format_reward names), or None without one."""
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
    prompt_tokens = sum(len(r.prompt) for r in records)
    answers = {}
    if stated is not None:
        formatted = [stated(r.tokens) for r in records]
        answers = {"format_rate": float(np.mean(formatted)),
                   "rewarded_unformatted": float(np.mean(
                       # Full credit only: partial credit (answer_first) is shaping by design.
                       [r.reward >= 1.0 and not ok for r, ok in zip(records, formatted)]))}
    return {
        **answers,
        **signal_figures([[r.reward for r in group] for group in batch.groups]),
        "cut_rate": float(np.mean([r.finish_reason == "length" for r in records])),
        "entries": batch.entries, "staleness": batch.staleness,
        # Identifies the batch's exact tokens: runs that must match can be compared.
        "batch_digest": hashlib.sha256(train_batch.tokens.tobytes()).hexdigest()[:16],
        # Generated by more than one weight version: weights changed mid-trajectory.
        "partial_rollouts": sum(len(set(r.versions)) > 1 for r in records),
        "rollout_tokens": sum(lengths),
        # Of the trained rows' tokens, those no trajectory fills (packing lowers it).
        "padding_fraction": 1.0 - (sum(lengths) + prompt_tokens) / train_batch.tokens.size,
        "reward_mean": float(np.mean([r.reward for r in records])),
        "response_length": float(np.mean(lengths)),
        "response_lengths": lengths,
        "prompt_length": float(np.mean([len(r.prompt) for r in records])),
        "interrupted": sum(r.interruptions for r in records),
        "migrated_in_batch": sum(r.migrations for r in records),
    }
