"""Experiment configs resolved once into the run's spec: `resolve(config) -> RunSpec`.

A config file is Python with `get_config(arg)` returning a ConfigDict;
`--config=experiments/grpo.py:tiny,eta=1` passes "tiny,eta=1" as `arg` and `--config.x=`
overrides its fields. Before anything is built, `resolve` turns it into a frozen `RunSpec`
of typed sections, each declared and checked beside the component that reads it and the
registries it names (asyncrl/sections.py): a bad value fails with one error naming the
field, the value and what is allowed. The checks that span sections are here. From then on
every part of the run reads the spec, each component only its own section (a test holds
them to it: tests/test_spec_sections.py).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any

import ml_collections

from asyncrl.config_args import ConfigError, missing_field, parse_arg  # noqa: F401 - the config API
from asyncrl.coordinator.config import CoordinatorSection, StalenessSection
from asyncrl.data.section import TaskSection
from asyncrl.distributed.section import DistributedSection
from asyncrl.eval.section import EvalSection
from asyncrl.metrics import LogSection
from asyncrl.model.chat import CHAT_TEMPLATE_SETTINGS
from asyncrl.model.section import ModelSection
from asyncrl.placement import MeshSection, check_devices
from asyncrl.rewards.registry import BOXED_REWARDS
from asyncrl.rewards.section import RewardsSection
from asyncrl.rollout.section import RolloutSection
from asyncrl.sections import check_keys, fail, int_at_least, typed
from asyncrl.train.section import CheckpointSection, TrainSection


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A run's whole configuration, typed and checked; what `asyncrl.run.run` and the
    commands around it (evaluation, export, the planner) read. Frozen: a component cannot
    change what another one reads."""

    seed: int
    model: ModelSection
    task: TaskSection
    rollout: RolloutSection
    train: TrainSection
    staleness: StalenessSection
    coordinator: CoordinatorSection
    mesh: MeshSection
    rewards: RewardsSection
    eval: EvalSection
    checkpoint: CheckpointSection
    log: LogSection
    distributed: DistributedSection

    def train_config(self):
        """The trainer's settings (asyncrl.train.settings.train_config); loads JAX."""
        from asyncrl.train.settings import train_config

        return train_config(self.train, self.rollout.sampling(), self.seed)


SECTIONS = tuple(f.name for f in dataclasses.fields(RunSpec) if f.name != "seed")


def resolve(config: ml_collections.ConfigDict | RunSpec, *, local_files: bool = True,
            processes: int | None = None) -> RunSpec:
    """The run's spec from a config, every field checked; a RunSpec passes through.

    `local_files`: check that the files the config names exist here (not when planning a
    run for other machines, asyncrl/plan). `processes`: the trainer group's size, where the
    caller knows it (default: what distributed.* says). Devices are `validate`'s business.
    """
    if isinstance(config, RunSpec):
        return config
    hints = typing.get_type_hints(RunSpec)
    check_keys(list(config.keys()), list(hints), list(hints))
    # A config with several faults reports them one at a time, the reward plugins first:
    # they register their rewards before task.reward is looked up among them.
    resolved = {}
    for name in ("rewards", *(s for s in SECTIONS if s != "rewards")):
        resolved[name] = hints[name].from_node(config[name], name)
        resolved[name].check()
    spec = RunSpec(seed=typed(config["seed"], int, "seed"), **resolved)
    int_at_least("seed", spec.seed, 0)
    _check_across(spec, processes)
    if local_files:
        _check_files(spec)
    return spec


def _check_files(spec: RunSpec) -> None:
    """What the spec names on this machine: the model, the data, a router's latency model,
    the W&B package. Each process of a trainer group checks its own machine."""
    spec.model.check_files()
    spec.task.check_files()
    spec.coordinator.check_files()
    spec.log.check_installed()


def _check_across(spec: RunSpec, processes: int | None) -> None:
    """What no one section decides alone."""
    spec.coordinator.check_admission_params(spec.staleness.eta, spec.train.batch_size)
    spec.rollout.check_pool_admits_a_group(spec.coordinator.partial_rollout)
    spec.eval.check_against(spec.task.reward)
    spec.distributed.check_instance_chips(spec.mesh.devices_per_instance)
    _check_prompt(spec.task)
    _check_row_budget(spec)
    d = spec.distributed
    _check_batch_split(spec, processes or max(d.trainer_processes, d.num_processes, 1))


def _check_prompt(task: TaskSection) -> None:
    """The template's name is checked here, not by TaskSection: the data package may not
    import the model's (tests/test_layers.py). The prompt must ask for the format the reward
    reads: a boxed-only reward under "Answer with only the number." scores every response 0
    and learns nothing, without an error anywhere."""
    if task.chat_template not in CHAT_TEMPLATE_SETTINGS:
        fail("task.chat_template", task.chat_template,
             f"one of {', '.join(map(repr, CHAT_TEMPLATE_SETTINGS))} ('auto': the checkpoint's own)")
    if task.reward in BOXED_REWARDS and "\\boxed" not in f"{task.system_prompt} {task.instruction}":
        fail("task.instruction", task.instruction,
             f"task.reward = {task.reward!r} reads the final answer only from \\boxed{{}}, and "
             f"neither task.system_prompt nor task.instruction asks for one (e.g. "
             f"--config.task.instruction='Put the final answer in \\boxed{{}}.')")


def _check_row_budget(spec: RunSpec) -> None:
    """A packed row holds at least one whole trajectory."""
    budget, longest = spec.train.tokens_per_row, spec.rollout.max_len
    if budget and budget < longest:
        fail("train.tokens_per_row", budget,
             f"0 (one trajectory per row) or at least rollout.prompt_bucket + "
             f"rollout.max_new_tokens = {longest}, the longest trajectory")


def _check_batch_split(spec: RunSpec, processes: int) -> None:
    """The batch splits over the trainer's devices and micro-batches (packed rows are
    counted to split, whatever the number of trajectories)."""
    if spec.train.tokens_per_row:
        return
    sequences = spec.train.batch_size * spec.rollout.group_size
    trainer_devices = spec.mesh.trainer_devices * processes
    if sequences % (spec.train.num_microbatches * trainer_devices):
        group = f" × {processes} processes" if processes > 1 else ""
        fail("train.num_microbatches", spec.train.num_microbatches,
             f"the batch of {spec.train.batch_size} entries × {spec.rollout.group_size} "
             f"responses = {sequences} sequences must split evenly into micro-batches × "
             f"mesh.trainer_devices ({spec.mesh.trainer_devices}){group}")


def with_overrides(config: ml_collections.ConfigDict,
                   overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """A copy of `config` with dotted fields set. A field that does not exist is an error
    (ConfigDict.update_from_flattened_dict would add a misspelt one silently)."""
    config = config.copy_and_resolve_references()
    for dotted, value in overrides.items():
        *parents, leaf = dotted.split(".")
        node = config
        for part in parents:
            node = node[part]
        if leaf not in node:
            raise missing_field(dotted, list(node.keys()))
        node[leaf] = value
    return config


def validate(config: ml_collections.ConfigDict | RunSpec, device_count: int, processes: int = 1,
             process_index: int = 0, local_files: bool = True) -> RunSpec:
    """`resolve`, then whether this process's devices hold what it must place.

    `device_count`: this process's own (local) devices. In a trainer group of `processes`,
    the trainer mesh takes mesh.trainer_devices of every process and the instances run on
    process 0's (asyncrl/placement.py), so each process is checked for what it must hold.
    """
    spec = resolve(config, local_files=local_files, processes=processes)
    # A spec resolved elsewhere (main, before the group's size was known; the lead process,
    # for a follower on another machine) is checked again for this process.
    _check_batch_split(spec, processes)
    if local_files and isinstance(config, RunSpec):
        _check_files(spec)
    check_devices(spec.mesh, spec.distributed.backend, device_count, processes, process_index)
    return spec
