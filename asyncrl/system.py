"""The whole asynchronous system in one process: build it from a config, run it, stop it.

    trainer mesh ──push v+1──► ParameterServer ──pull──► RolloutInstance[i] (own mesh, thread)
         ▲                                                     │ finished / partial
         │ consume READY buffer                                ▼
    StalenessManager ◄──reserve / occupy── Coordinator ◄── TrajectoryServer, RewardPool

`run(config, workdir)` is what `python -m asyncrl.main` calls. The trainer runs on the
calling thread; the coordinator and each rollout instance on their own threads; rewards in
worker processes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import pathlib
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from asyncrl import config as config_lib
from asyncrl.coordinator.latency import LatencyModel
from asyncrl.coordinator.loop import Coordinator, Prompt
from asyncrl.coordinator.migration import build_migration_policy
from asyncrl.coordinator.redundancy import build_redundancy
from asyncrl.coordinator.routing import build_router
from asyncrl.coordinator.sync import build_sync_policy
from asyncrl.data.arithmetic import Problem
from asyncrl.data.sources import build_task_data
from asyncrl.data.tokenizer import char_tokenizer
from asyncrl.evaluation import Evaluator
from asyncrl.metrics import MetricsWriter
from asyncrl.model import (ModelConfig, ShardingRules, default_policy_path, graphdef_for,
                           init_params, load_gguf, load_hf, prompt_messages, resolve_chat_template,
                           shardings_for)
from asyncrl.progress import Progress
from asyncrl.rewards import RewardPool
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.rollout.sampling import SamplingParams
from asyncrl.servers.parameters import ParameterServer
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import StalenessManager
from asyncrl.train.checkpoint import ResumeData
from asyncrl.train.loop import StopTraining, train
from asyncrl.train.losses import LossConfig
from asyncrl.train.trainer import TrainBatch, TrainConfig, Trainer, trainer_mesh

log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ the policy


@dataclasses.dataclass
class Policy:
    config: ModelConfig
    params: Any
    tokenizer: Any  # tokenizers.Tokenizer
    source: pathlib.Path | None  # the checkpoint it was loaded from; None for a random init
    _renderers: dict[str, Any] = dataclasses.field(default_factory=dict)

    def encode_prompt(self, problem: Problem, chat_template: str, instruction: str,
                      system_prompt: str = "") -> tuple[int, ...]:
        """`chat_template`: 'auto' (the checkpoint's own), a named format, or '' (raw)."""
        text = problem.question + (f" {instruction}" if instruction else "")
        if chat_template not in self._renderers:
            self._renderers[chat_template] = resolve_chat_template(chat_template, self.source)
        render = self._renderers[chat_template]
        if render is not None:
            # The template writes BOS where the model expects it (Llama 3 does, ChatML does not).
            text = render(prompt_messages(text, system_prompt))
            return tuple(self.tokenizer.encode(text, add_special_tokens=False).ids)
        # Raw prompts start from BOS, as the model saw in pre-training (or, tiny, in RL).
        return (self.config.bos_token_id, *self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)


def load_policy(model_cfg) -> Policy:
    """1. the embedded SmolLM2 GGUF  2. a local HF folder or .gguf file  3. a random preset."""
    dtype = model_cfg.param_dtype
    if model_cfg.checkpoint == "random":
        tokenizer = char_tokenizer()
        preset = getattr(ModelConfig, model_cfg.preset)
        config = preset(param_dtype=dtype, vocab_size=tokenizer.get_vocab_size()) \
            if model_cfg.preset == "tiny" else preset(param_dtype=dtype)
        return Policy(config, init_params(config, 0)[1], tokenizer, None)
    path = default_policy_path() if model_cfg.checkpoint == "embedded" else pathlib.Path(model_cfg.checkpoint)
    if str(path).endswith(".gguf"):
        config, params, tokenizer = load_gguf(path, param_dtype=dtype)
    else:
        config, params, tokenizer = load_hf(path, param_dtype=dtype)
    return Policy(config, params, tokenizer, path)


def encode(c, policy: Policy, problem: Problem) -> Prompt:
    """A problem as the policy's prompt, checked against the rollout's prompt bucket."""
    tokens = policy.encode_prompt(problem, c.task.chat_template, c.task.instruction,
                                  c.task.system_prompt)
    if len(tokens) > c.rollout.prompt_bucket:
        raise config_lib.ConfigError(
            f"config.rollout.prompt_bucket = {c.rollout.prompt_bucket} is shorter than "
            f"prompt {problem.prompt_id} ({len(tokens)} tokens: {problem.question!r})")
    return Prompt(problem.prompt_id, tokens, {"answer": problem.answer})


# ------------------------------------------------------------------------------ meshes


def split_devices(mesh_cfg) -> tuple[Mesh, list[Mesh]]:
    """One trainer mesh and K rollout meshes over disjoint devices."""
    devices = jax.devices()
    t, k, d = mesh_cfg.trainer_devices, mesh_cfg.rollout_instances, mesh_cfg.devices_per_instance
    trainer = trainer_mesh(devices[:t])
    rollout = [Mesh(np.asarray(devices[t + i * d: t + (i + 1) * d]), ("tp",)) for i in range(k)]
    return trainer, rollout


def protocol_eta(c) -> int:
    """The StalenessManager's bound. The token-bucket baseline bounds only unconsumed work, not
    each trajectory: its manager gets a bound so loose it never binds (kept finite because
    reserving scans η + 1 buffers), and the staleness it really reaches is measured."""
    return c.staleness.eta if c.schedule != "token_bucket" else 8 * (c.staleness.eta + 1)


def make_train_config(c) -> TrainConfig:
    loss = LossConfig(advantage=c.train.advantage, policy_loss=c.train.policy_loss,
                      tis_cap=c.train.tis_cap or None, kl_coef=c.train.kl_coef,
                      entropy_coef=c.train.entropy_coef, aggregation=c.train.aggregation)
    return TrainConfig(loss=loss, learning_rate=c.train.learning_rate,
                       schedule=c.train.lr_schedule, warmup_steps=c.train.warmup_steps,
                       total_steps=c.train.steps, weight_decay=c.train.weight_decay,
                       max_grad_norm=c.train.max_grad_norm,
                       num_microbatches=c.train.num_microbatches, remat=c.train.remat,
                       seed=c.seed)


# ------------------------------------------------------------------------------ the system


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived while the trainer waited for a batch."""


class System:
    """Every part of one run, wired together. `DataSource` of the train loop."""

    def __init__(self, c, workdir: str | pathlib.Path):
        self.c = c
        self.workdir = pathlib.Path(workdir)
        self.stop_requested = threading.Event()
        self.policy = load_policy(c.model)
        self.graphdef = graphdef_for(self.policy.config)
        self.trainer_mesh, self.rollout_meshes = split_devices(c.mesh)
        self.trainer = Trainer.create(make_train_config(c), self.policy.config, self.trainer_mesh,
                                      c.rollout.group_size)
        data = build_task_data(c.task, c.eval.heldout_size, self.workdir)
        self.task, self.heldout, self.cursor = data.train, data.heldout, data.cursor
        redundancy = build_redundancy(c.coordinator.redundancy)
        self.sm = StalenessManager(protocol_eta(c), c.train.batch_size,
                                   redundancy.redundant_batch_size(c.train.batch_size))
        self.trajectories = TrajectoryServer()
        self.parameters = ParameterServer()
        self.rewards = RewardPool(c.rewards.workers, c.rewards.timeout_s)
        self.max_len = c.rollout.prompt_bucket + c.rollout.max_new_tokens
        rules = ShardingRules.replicated()
        self.instances = []
        self.coordinator = Coordinator(
            staleness=self.sm, trajectories=self.trajectories, parameters=self.parameters,
            instances=self.instances, rewards=self.rewards, prompts=self._prompts(),
            decode=self.policy.decode, reward_name=c.task.reward, group_size=c.rollout.group_size,
            max_new_tokens=c.rollout.max_new_tokens,
            router=build_router(c.coordinator.routing, self._latency_model()),
            sync=build_sync_policy(c.coordinator.sync),
            migration=build_migration_policy(c.coordinator.migration), redundancy=redundancy,
            schedule=c.schedule, eta=c.staleness.eta,
            dynamic_sampling=c.coordinator.dynamic_sampling)
        sampling = SamplingParams.of_rollout(c.rollout)
        for i, mesh in enumerate(self.rollout_meshes):
            engine = Engine(self.graphdef, self.policy.config, num_slots=c.rollout.num_slots,
                            max_len=self.max_len, prompt_buckets=(c.rollout.prompt_bucket,),
                            sampling=sampling, seed=c.seed, mesh=mesh, rules=rules)
            shardings = shardings_for(self.policy.params, mesh, rules)
            self.instances.append(RolloutInstance(i, engine, self.parameters, shardings,
                                                  self.trajectories, self.coordinator.events.put,
                                                  partial_rollout=c.coordinator.partial_rollout))
        self.batch_stats: dict[str, Any] = {}
        self.evaluate = Evaluator(c, self.graphdef, self.policy.config, self.rollout_meshes[0],
                                  self.heldout, lambda p: self.prompt(p).tokens, self.policy.decode)
        self.trainer_wait_s = 0.0  # waiting for a READY buffer: the trainer's idle time
        # From handing a batch over to asking for the next: the train step and the weight
        # push, evaluations left out (a simulator profile of this machine is fitted on it).
        self.trainer_step_s = 0.0
        self.trainer_steps = 0
        self._batch_handed_at: tuple[float, float] | None = None  # (time, eval seconds then)

    def _latency_model(self) -> LatencyModel | None:
        if self.c.coordinator.routing != "throughput_optimal":
            return None
        return LatencyModel.load(self.c.coordinator.latency_model)

    def _prompts(self):
        while True:
            problem = next(self.cursor)
            yield self.prompt(problem)

    def prompt(self, problem: Problem) -> Prompt:
        return encode(self.c, self.policy, problem)

    # ---------------------------------------------------------------- start / stop

    def start(self, params, version: int) -> None:
        self.parameters.push(version, params)
        for instance in self.instances:
            instance.start()
        self.coordinator.start()

    def stop(self) -> None:
        self.coordinator.stop()
        for instance in self.instances:
            instance.stop()
        self.rewards.close()

    # ---------------------------------------------------------------- the train loop's data source

    def next_batch(self, version: int):
        wait_start = time.perf_counter()
        if self._batch_handed_at is not None:
            handed_at, eval_s = self._batch_handed_at
            self.trainer_step_s += wait_start - handed_at - (self.evaluate.seconds - eval_s)
            self.trainer_steps += 1
        while self.sm.status(version).name != "READY":
            self.coordinator.check()
            if self.stop_requested.is_set():
                raise Interrupted()
            time.sleep(0.002)
        self.trainer_wait_s += time.perf_counter() - wait_start
        with self.coordinator.paused():
            entries = sorted(self.sm.consume())  # sorted: the batch does not depend on timing
            v_traj = {e: self.trajectories.v_traj(e) for e in entries}
            groups = [self.trajectories.consume(e) for e in entries]
            self.coordinator.forget_consumed(entries)
        batch = build_batch(groups, [v_traj[e] for e in entries], version, self.max_len,
                            self.c.rollout.group_size)
        lags = [version - v_traj[e] for e in entries]
        records = [r for g in groups for r in g]
        lengths = [len(r.tokens) for r in records]
        self.batch_stats = {
            "entries": entries, "staleness": lags,
            # Identifies the batch's exact tokens: runs that must match can be compared.
            "batch_digest": hashlib.sha256(batch.tokens.tobytes()).hexdigest()[:16],
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
        self._batch_handed_at = (time.perf_counter(), self.evaluate.seconds)
        return batch


def build_batch(groups, v_traj: list[int], version: int, max_len: int, group_size: int):
    """Consumed groups → a TrainBatch of host arrays, B·G rows right-padded to max_len."""
    rows = [r for g in groups for r in g]
    n = len(rows)
    tokens = np.zeros((n, max_len), np.int32)
    mask = np.zeros((n, max_len), np.float32)
    behaviour = np.zeros((n, max_len), np.float32)
    versions = np.full((n, max_len), version, np.int32)
    for i, r in enumerate(rows):
        p, g = len(r.prompt), len(r.tokens)
        tokens[i, :p] = r.prompt
        tokens[i, p:p + g] = r.tokens
        mask[i, p:p + g] = 1.0
        behaviour[i, p:p + g] = r.logprobs
        versions[i, p:p + g] = r.versions
    positions = np.broadcast_to(np.arange(max_len, dtype=np.int32), (n, max_len)).copy()
    rewards = np.asarray([r.reward for r in rows], np.float32)
    seq_v_traj = np.repeat(np.asarray(v_traj, np.int32), group_size)
    return TrainBatch(tokens, positions, mask, behaviour, versions, rewards, seq_v_traj,
                      np.int32(version), group_size=group_size)


# ------------------------------------------------------------------------------ checkpoints


def resume_data(system: System):
    """Everything beside the TrainState a resume needs; taken with the coordinator paused."""
    with system.coordinator.paused():
        meta, arrays = system.trajectories.state_dict()
        coordinator = system.coordinator
        data_state = {
            "cursor": system.cursor.state_dict(),
            "next_entry_id": coordinator.next_entry_id,
            "live": [[e, p.prompt_id] for e, p in coordinator.prompt_of().items()],
            "retry": [p.prompt_id for p in coordinator.retry_prompts()],
            "aborted": list(coordinator.aborted_ids),
        }
        return ResumeData(data_state, system.sm.state_dict(), meta, arrays)


def restore(system: System, resume) -> None:
    """Rewinds a freshly built (not started) system to a checkpoint's ResumeData."""
    d = resume.data_state
    system.cursor.load_state_dict(d["cursor"])
    system.sm = StalenessManager.from_state_dict(resume.staleness)
    system.trajectories = TrajectoryServer.from_state_dict(resume.trajectories, resume.trajectory_arrays)
    prompt = lambda prompt_id: system.prompt(system.task[prompt_id])  # noqa: E731
    system.coordinator.restore(
        staleness=system.sm, trajectories=system.trajectories, next_entry_id=d["next_entry_id"],
        live={e: prompt(p) for e, p in d["live"]}, retry=[prompt(p) for p in d["retry"]])
    system.coordinator.aborted_ids = list(d["aborted"])
    for instance in system.instances:
        instance.rebind(system.trajectories)


# ------------------------------------------------------------------------------ run


class _Source:
    """The train loop's DataSource over a running System."""

    def __init__(self, system: System):
        self.system = system

    def next_batch(self, version: int):
        try:
            return self.system.next_batch(version)
        except Interrupted:
            raise StopTraining("interrupted while waiting for a batch") from None

    def resume_data(self):
        return resume_data(self.system)

    def restore(self, resume) -> None:
        restore(self.system, resume)


def run(c, workdir: str | pathlib.Path, on_built=None) -> dict[str, Any]:
    """Post-trains the policy asynchronously; returns (and writes) the before/after figures.

    Resume order: 1. the latest checkpoint in `workdir`  2. scratch (the configured policy).
    """
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    config_lib.validate(c, jax.device_count())
    system = System(c, workdir)
    if on_built is not None:
        on_built(system)  # main's signal handler needs it to ask for a stop
    results_path = workdir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    stats_by_version: dict[int, dict[str, Any]] = {}
    evals: dict[int, dict[str, float]] = {}  # step -> figures of the evaluation after it
    progress = Progress(c.train.steps)
    totals = {"rollout_tokens": 0, "rollout_tok_s": 0.0}
    wall_start = time.perf_counter()

    def on_start(state, step: int) -> None:
        if "before" not in results:
            results["before"] = dataclasses.asdict(system.evaluate(state.params, step, "before"))
            results_path.write_text(json.dumps(results, indent=2))
        progress.start(step)
        system.start(state.params, step)

    def after_step(step: int, state) -> None:
        stats_by_version[step - 1] = system.batch_stats
        system.parameters.push(step, state.params)
        every = c.eval.every_steps
        if every and step % every == 0 and step < c.train.steps:
            result = system.evaluate(state.params, step, f"step {step}")
            evals[step] = result.as_dict("eval")
            results.setdefault("evals", []).append(
                {"step": step, "wall_s": time.perf_counter() - wall_start, **dataclasses.asdict(result)})

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        stats = stats_by_version.pop(step - 1, {})
        totals["rollout_tokens"] += stats.get("rollout_tokens", 0)
        totals["rollout_tok_s"] = totals["rollout_tokens"] / (time.perf_counter() - wall_start)
        scalars = {"rollout_tok_s": totals["rollout_tok_s"], **metrics,
                   **{k: v for k, v in stats.items() if isinstance(v, (int, float))},
                   **system_figures(system, time.perf_counter() - wall_start), **evals.pop(step, {})}
        writer.write(step, scalars, {"staleness": stats.get("staleness", []),
                                     "response_lengths": stats.get("response_lengths", [])},
                     {"entries": stats.get("entries", []), "batch_digest": stats.get("batch_digest")})
        progress.update(step, scalars)

    with MetricsWriter(workdir) as writer:
        try:
            state = train(system.trainer, _Source(system), workdir, c.train.steps,
                          c.checkpoint.every_steps or c.train.steps, on_metrics=on_metrics,
                          keep=c.checkpoint.keep, on_start=on_start, after_step=after_step,
                          should_stop=system.stop_requested.is_set,
                          initial_params=system.policy.params)
        finally:
            system.stop()
            progress.close()
    step = int(jax.device_get(state.step))
    results["protocol"] = protocol_accounting(system)
    results_path.write_text(json.dumps(results, indent=2))
    if step < c.train.steps:
        log.info("stopped at step %d of %d; rerun the same command to resume", step, c.train.steps)
        return results
    results["after"] = dataclasses.asdict(system.evaluate(state.params, step, "after"))
    results["steps"] = step
    results["rollout_tok_s"] = totals["rollout_tok_s"]
    results["wall_s"] = results.get("wall_s", 0.0) + time.perf_counter() - wall_start
    results_path.write_text(json.dumps(results, indent=2))
    print(f"held-out accuracy: {results['before']['accuracy']:.3f} -> {results['after']['accuracy']:.3f} "
          f"({c.eval.heldout_size} problems); results in {results_path}")
    return results


def protocol_accounting(system: System) -> dict[str, Any]:
    """Where every dispatched entry ended: a resumed run can prove nothing was lost."""
    state = system.sm.state_dict()
    return {
        "next_entry_id": system.coordinator.next_entry_id,
        "version": state["version"],
        "unconsumed": sorted(e for e, _, s, _, _ in state["entries"] if s in ("reserved", "occupied")),
        "aborted": sorted(system.coordinator.aborted_ids),
    }


def system_figures(system: System, wall_s: float) -> dict[str, float]:
    """Throughput, busy/idle fractions, latencies and counters, for the metrics line."""
    snapshots = [i.snapshot() for i in system.instances]
    figures = {f"instance{i}_idle_frac": s.idle_s / max(s.idle_s + s.busy_s, 1e-9)
               for i, s in enumerate(snapshots)}
    counters = dataclasses.asdict(system.coordinator.counters)
    figures.update({k: float(v) for k, v in counters.items()})
    figures["wall_s"] = wall_s
    figures["eval_s"] = system.evaluate.seconds  # inside wall_s: the trainer waits for evaluations
    figures["trainer_busy_frac"] = 1.0 - system.trainer_wait_s / max(wall_s, 1e-9)
    pulls, pushes = list(system.parameters.pull_seconds), list(system.parameters.push_seconds)
    figures["pull_s_mean"] = float(np.mean(pulls)) if pulls else 0.0
    figures["push_s_mean"] = float(np.mean(pushes)) if pushes else 0.0
    figures["trainer_step_s_mean"] = system.trainer_step_s / max(system.trainer_steps, 1)
    decode_steps = sum(s.decode_steps for s in snapshots)
    figures["decode_step_s_mean"] = sum(s.decode_s for s in snapshots) / max(decode_steps, 1)
    prefill_tokens = sum(s.prefill_tokens for s in snapshots)
    figures["prefill_s_per_token"] = sum(s.prefill_s for s in snapshots) / max(prefill_tokens, 1)
    return figures
