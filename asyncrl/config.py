"""Experiment configs: the `:k=v` argument parser and the up-front validation of every field.

A config file is Python with `get_config(arg)`; `--config=experiments/grpo.py:tiny,eta=1`
passes "tiny,eta=1" as `arg`. Validation runs before anything is built: each bad value fails
with one error naming the field, the value and what is allowed, with the allowed names read
from the registries so they cannot drift.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from collections.abc import Mapping
from typing import Any

import ml_collections

from asyncrl.config_args import ConfigError, missing_field, parse_arg  # noqa: F401 - the config API
from asyncrl.coordinator.admission import ADMISSIONS, LEADS, build_admission
from asyncrl.coordinator.migration import MIGRATION_POLICIES
from asyncrl.rollout.pages import ATTENTION_BACKENDS, PREEMPTION
from asyncrl.coordinator.redundancy import REDUNDANCY_POLICIES
from asyncrl.coordinator.routing import BINDINGS, DISPATCH_MODES, ROUTERS, router_needs_latency
from asyncrl.coordinator.sync import SYNC_POLICIES, build_sync_policy
from asyncrl.data.arithmetic import KINDS
from asyncrl.data.math_data import ANSWER_FORMATS, Fields, check_fields
from asyncrl.data.sources import DATASETS, SPLITS, file_fields
from asyncrl.distributed import BACKENDS, TPU_HOST_CHIP_BOUNDS, TRANSPORTS
from asyncrl.model.remat import REMAT_POLICIES
from asyncrl.model.chat import CHAT_TEMPLATE_SETTINGS
from asyncrl.placement import devices_needed
from asyncrl.rewards.registry import BOXED_REWARDS, REWARDS, format_check


# The W&B sink's modes; the version the `wandb` extra pins (pyproject.toml), for the error
# that says how to install it.
WANDB_MODES = ("online", "offline")
WANDB_REQUIREMENT = "wandb==0.31.0"


def _fail(field: str, value: Any, allowed: str) -> None:
    raise ConfigError(f"config.{field} = {value!r} is not allowed: {allowed}")


def _int_at_least(config, field: str, minimum: int) -> None:
    value = _get(config, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        _fail(field, value, f"expected an int ≥ {minimum}")


def _positive(config, field: str) -> None:
    value = _get(config, field)
    if not isinstance(value, (int, float)) or not value > 0:
        _fail(field, value, "expected a number > 0")


def _one_of(config, field: str, registry) -> None:
    value = _get(config, field)
    if value not in registry:
        _fail(field, value, f"registered: {', '.join(registry.names())}")


def _validate_clip(config) -> None:
    low, high = config.train.eps_low, config.train.eps_high
    if not isinstance(low, (int, float)) or not 0 <= low < 1:
        _fail("train.eps_low", low, "expected a number in [0, 1) (0: the policy loss's own ε)")
    if not isinstance(high, (int, float)) or not high >= 0:
        _fail("train.eps_high", high, "expected a number ≥ 0 (0: the policy loss's own ε)")
    if not isinstance(config.train.tis_cap, (int, float)) or config.train.tis_cap < 0:
        _fail("train.tis_cap", config.train.tis_cap, "expected a number ≥ 0 (0 turns the cap off)")


def _import_reward_plugins(config) -> None:
    plugins = config.rewards.plugins
    if isinstance(plugins, str) or not all(isinstance(m, str) and m for m in plugins):
        _fail("rewards.plugins", plugins, "a tuple of module names, e.g. ('my_project.rewards',)")
    for module in plugins:
        try:
            importlib.import_module(module)
        except ImportError as error:
            _fail("rewards.plugins", plugins, f"module {module!r} cannot be imported: {error}")


def _validate_answer_format(config) -> None:
    """The prompt must ask for the format the reward reads, and the format rate must measure
    that format: a boxed-only reward under "Answer with only the number." scores every
    response 0 and learns nothing, without an error anywhere."""
    reward, check = config.task.reward, config.eval.format_reward
    if check not in ("", "auto") and check not in REWARDS:
        _fail("eval.format_reward", check,
              f"'auto' (the task reward's own), '' (none) or a registered reward: "
              f"{', '.join(REWARDS.names())}")
    if check not in ("", "auto") and format_check(reward) not in (None, check):
        _fail("eval.format_reward", check,
              f"'auto' or {format_check(reward)!r}: the format task.reward = {reward!r} reads")
    prompt = f"{config.task.system_prompt} {config.task.instruction}"
    if reward in BOXED_REWARDS and "\\boxed" not in prompt:
        _fail("task.instruction", config.task.instruction,
              f"task.reward = {reward!r} reads the final answer only from \\boxed{{}}, and "
              f"neither task.system_prompt nor task.instruction asks for one (e.g. "
              f"--config.task.instruction='Put the final answer in \\boxed{{}}.')")


def _get(config, field: str) -> Any:
    node = config
    for part in field.split("."):
        node = node[part]
    return node


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


def validate(config: ml_collections.ConfigDict, device_count: int, processes: int = 1,
             process_index: int = 0, local_files: bool = True) -> None:
    """Checks every field a run depends on, before any model or thread is built.

    `device_count`: this process's own (local) devices. In a trainer group of `processes`,
    the trainer mesh takes mesh.trainer_devices of every process and the instances run on
    process 0's (asyncrl/placement.py), so each process is checked for what it must hold.
    `local_files`: check that the files the config names exist here (not when planning a
    run for other machines, asyncrl/plan/planner.py).
    """
    # A config with several faults reports them one at a time, in this order; the reward
    # plugins register their rewards before task.reward is looked up among them.
    _validate_scalars(config)
    _validate_admission(config)
    _import_reward_plugins(config)
    _validate_registered(config)
    _validate_clip(config)
    _validate_task(config, local_files)
    _validate_answer_format(config)
    _validate_schedule(config)
    _validate_batch_split(config, processes)
    validate_distributed(config)
    _check_devices(config, device_count, processes, process_index)
    if local_files:
        _validate_named_files(config)
    if not 0 < config.rollout.temperature:
        _fail("rollout.temperature", config.rollout.temperature, "expected > 0 (sampling)")
    _validate_kv(config.rollout, config.coordinator.partial_rollout)
    _validate_log(config.log, local_files)


def _validate_log(log, local_files: bool) -> None:
    """The optional W&B sink (asyncrl/metrics.py): checked here, not when the run's first
    metrics row is written, after the model has loaded."""
    if not isinstance(log.wandb, bool):
        _fail("log.wandb", log.wandb, "expected True or False")
    if log.wandb_mode not in WANDB_MODES:
        _fail("log.wandb_mode", log.wandb_mode, f"one of {', '.join(map(repr, WANDB_MODES))}")
    if not isinstance(log.wandb_project, str) or not log.wandb_project:
        _fail("log.wandb_project", log.wandb_project, "a W&B project name")
    if not isinstance(log.wandb_entity, str):
        _fail("log.wandb_entity", log.wandb_entity,
              "a W&B user or team name, or '' (the logged-in user's default)")
    if log.wandb and local_files and importlib.util.find_spec("wandb") is None:
        _fail("log.wandb", True, f"wandb is not installed: pip install {WANDB_REQUIREMENT} "
              f"(or pip install -e .[wandb])")


def _validate_scalars(config) -> None:
    for field, minimum in [
        ("staleness.eta", 0), ("train.batch_size", 1), ("train.steps", 1),
        ("rollout.group_size", 1), ("rollout.num_slots", 1), ("rollout.max_new_tokens", 1),
        ("mesh.trainer_devices", 1), ("mesh.rollout_instances", 1),
        ("mesh.devices_per_instance", 1), ("train.num_microbatches", 1),
        ("checkpoint.every_steps", 0), ("checkpoint.keep", 1), ("rewards.workers", 1),
        ("eval.heldout_size", 0), ("eval.every_steps", 0), ("eval.samples", 0),
        ("train.warmup_steps", 0), ("rollout.page_size", 0), ("rollout.num_pages", 0),
        ("rollout.decode_steps_per_dispatch", 1),
        ("task.seed", 0), ("seed", 0),
    ]:
        _int_at_least(config, field, minimum)
    for field in ("train.learning_rate", "rewards.timeout_s", "train.max_grad_norm",
                  "train.batch_timeout_s", "rollout.stall_timeout_s"):
        _positive(config, field)
    if not config.coordinator.migration_interval_s >= 0:
        _fail("coordinator.migration_interval_s", config.coordinator.migration_interval_s,
              "expected seconds ≥ 0 (0: at every coordinator step)")
    for field in ("coordinator.partial_rollout", "coordinator.dynamic_sampling", "task.skip_malformed",
                  "mesh.colocate", "train.stop_without_signal"):
        if not isinstance(_get(config, field), bool):
            _fail(field, _get(config, field), "expected True or False")


def _validate_admission(config) -> None:
    """What the admission is built from: the lead, and every admission's parameters, which
    must build whichever admission is chosen (an override may switch to any of them)."""
    if config.staleness.lead not in LEADS:
        _fail("staleness.lead", config.staleness.lead,
              "'auto' (start rollouts only as far ahead as keeps the trainer fed) or 'max' "
              "(as far ahead as η allows)")
    for name, params in config.coordinator.admission_params.items():
        field = f"coordinator.admission_params.{name}"
        if name not in ADMISSIONS:
            _fail(field, params.to_dict(), f"registered admissions: {', '.join(ADMISSIONS.names())}")
        try:
            build_admission(name, eta=config.staleness.eta, batch_size=max(config.train.batch_size, 1),
                            redundant_batch_size=max(config.train.batch_size, 1),
                            sync=build_sync_policy("greedy"), **params.to_dict())
        except (TypeError, ValueError) as error:
            _fail(field, params.to_dict(), str(error))


def _validate_registered(config) -> None:
    for field, registry in [
        ("coordinator.admission", ADMISSIONS), ("coordinator.routing", ROUTERS), ("coordinator.sync", SYNC_POLICIES),
        ("coordinator.dispatch", DISPATCH_MODES), ("coordinator.binding", BINDINGS),
        ("coordinator.migration", MIGRATION_POLICIES), ("coordinator.redundancy", REDUNDANCY_POLICIES),
        ("task.reward", REWARDS), ("train.remat", REMAT_POLICIES),
    ]:
        _one_of(config, field, registry)


def _validate_task(config, local_files: bool) -> None:
    if config.task.dataset not in DATASETS:
        _fail("task.dataset", config.task.dataset, f"one of {', '.join(DATASETS)}")
    if config.task.dataset != "arithmetic" and local_files:
        for field in ("task.train_path", "task.test_path"):
            if not os.path.isfile(_get(config, field)):
                _fail(field, _get(config, field),
                      f"the path of a local {config.task.dataset} file (task.dataset)")
    _validate_fields(config.task, local_files)
    for kind in config.task.kinds:
        if kind not in KINDS:
            _fail("task.kinds", tuple(config.task.kinds), f"registered kinds: {', '.join(KINDS.names())}")
    if config.task.chat_template not in CHAT_TEMPLATE_SETTINGS:
        _fail("task.chat_template", config.task.chat_template,
              f"one of {', '.join(map(repr, CHAT_TEMPLATE_SETTINGS))} ('auto': the checkpoint's own)")
    if config.task.system_prompt and not config.task.chat_template:
        _fail("task.system_prompt", config.task.system_prompt,
              "a system prompt needs a chat template (task.chat_template is '', raw prompts)")


def _validate_fields(task, local_files: bool) -> None:
    """The `prompts` format's field names, read by it alone: set for another dataset they
    would be ignored. Checked against the files' first rows here, before anything is built."""
    defaults = Fields()
    for field, value, default in (("prompt_field", task.prompt_field, defaults.prompt),
                                  ("answer_field", task.answer_field, defaults.answer),
                                  ("answer_format", task.answer_format, defaults.answer_format)):
        if task.dataset != "prompts" and value != default:
            _fail(f"task.{field}", value, f"{default!r}: it is read only with task.dataset = "
                  f"'prompts', and task.dataset is {task.dataset!r}")
        if field != "answer_format" and not (isinstance(value, str) and value):
            _fail(f"task.{field}", value, "the name of a field of the data file's rows")
    if task.answer_format not in ANSWER_FORMATS:
        _fail("task.answer_format", task.answer_format, f"one of {', '.join(ANSWER_FORMATS)}")
    if task.dataset == "prompts" and local_files:
        for path in (task.train_path, task.test_path):
            check_fields(path, file_fields(task))


def _validate_schedule(config) -> None:
    """Evaluation's pass@k against its samples, and the learning-rate warmup against the run."""
    ks = tuple(config.eval.pass_k)
    if config.eval.split not in SPLITS:
        _fail("eval.split", config.eval.split, f"one of {', '.join(SPLITS)} (what periodic "
              f"evaluations read; the test split is also evaluated before and after training)")
    if config.eval.samples and not all(isinstance(k, int) and 1 <= k <= config.eval.samples for k in ks):
        _fail("eval.pass_k", ks, f"each k an int in [1, eval.samples = {config.eval.samples}]")
    if config.train.warmup_steps > config.train.steps:
        _fail("train.warmup_steps", config.train.warmup_steps,
              f"at most train.steps ({config.train.steps})")
    if config.train.lr_schedule == "cosine" and config.train.warmup_steps == config.train.steps:
        # optax's cosine needs a step to decay over: it would fail inside the run's first step.
        _fail("train.warmup_steps", config.train.warmup_steps,
              f"below train.steps ({config.train.steps}) with train.lr_schedule = 'cosine'")


def _validate_batch_split(config, processes: int) -> None:
    """A group fits the slots it is prefilled into; the batch splits over the trainer."""
    if config.rollout.group_size > config.rollout.num_slots:
        _fail("rollout.group_size", config.rollout.group_size,
              f"a group is prefilled into group_size slots at once; at most rollout.num_slots "
              f"({config.rollout.num_slots})")
    sequences = config.train.batch_size * config.rollout.group_size
    trainer_devices = config.mesh.trainer_devices * processes
    if sequences % (config.train.num_microbatches * trainer_devices):
        group = f" × {processes} processes" if processes > 1 else ""
        _fail("train.num_microbatches", config.train.num_microbatches,
              f"the batch of {config.train.batch_size} entries × {config.rollout.group_size} "
              f"responses = {sequences} sequences must split evenly into micro-batches × "
              f"mesh.trainer_devices ({config.mesh.trainer_devices}){group}")


def _validate_named_files(config) -> None:
    """The model checkpoint and the latency model a router reads exist on this machine."""
    checkpoint = config.model.checkpoint
    if checkpoint not in ("embedded", "random") and not os.path.exists(checkpoint):
        _fail("model.checkpoint", checkpoint,
              "'embedded', 'random', or the path of a Hugging Face folder or a .gguf file")
    routing = config.coordinator.routing
    if router_needs_latency(routing) and not os.path.isfile(config.coordinator.latency_model):
        _fail("coordinator.latency_model", config.coordinator.latency_model,
              f"{routing} routing needs the JSON fitted by python benchmarks/profile_engine.py")


def _validate_kv(rollout, partial_rollout: bool) -> None:
    max_len = rollout.prompt_bucket + rollout.max_new_tokens
    if rollout.page_size and max_len % rollout.page_size:
        _fail("rollout.page_size", rollout.page_size,
              f"0 (contiguous) or a divisor of rollout.prompt_bucket + rollout.max_new_tokens "
              f"= {max_len}")
    if rollout.num_pages and not rollout.page_size:
        _fail("rollout.num_pages", rollout.num_pages, "0 unless rollout.page_size > 0")
    if rollout.num_pages and rollout.num_pages < max_len // rollout.page_size:
        _fail("rollout.num_pages", rollout.num_pages,
              f"at least one sequence of {max_len} positions: "
              f"{max_len // rollout.page_size} pages of {rollout.page_size}")
    if rollout.page_size:
        # What one group needs through its first dispatch (the prompt's full pages once, a
        # private last page and the dispatch's growth each), or with partial rollout off its
        # whole budget each: a pool smaller than that could never admit it.
        ps, group = rollout.page_size, rollout.group_size
        width = max_len // ps
        need = (rollout.prompt_bucket // ps
                + group * (1 + -(-rollout.decode_steps_per_dispatch // ps)))
        if not partial_rollout:
            need = group * width
        pages = rollout.num_pages or rollout.num_slots * width
        if pages < need:
            field = "rollout.num_pages" if rollout.num_pages else "rollout.num_slots"
            _fail(field, getattr(rollout, field.split(".")[1]),
                  f"a pool of {pages} pages of {ps} cannot admit a group of {group} "
                  f"(needs {need}" + ("" if partial_rollout else
                                      ": without partial rollout, each its whole budget") + ")")
    if rollout.preemption not in PREEMPTION:
        _fail("rollout.preemption", rollout.preemption, f"one of {PREEMPTION}")
    if rollout.attention not in ATTENTION_BACKENDS:
        _fail("rollout.attention", rollout.attention, f"one of {ATTENTION_BACKENDS}")


def _check_devices(config, device_count: int, processes: int = 1, process_index: int = 0) -> None:
    mesh = config.mesh
    if process_index > 0:  # a follower of the trainer group holds a part of the trainer alone
        if mesh.trainer_devices > device_count:
            _fail("mesh.trainer_devices", mesh.trainer_devices,
                  f"at most the {device_count} local devices of trainer-group process "
                  f"{process_index} (distributed.process_id): every process of the group "
                  f"gives the trainer mesh that many of its own devices")
        return
    if config.distributed.backend == "ray":  # each instance actor brings its own devices
        if mesh.colocate:
            _fail("mesh.colocate", True, "False with distributed.backend='ray': each instance "
                  "actor owns its devices (colocate with the local backend)")
        if mesh.trainer_devices > device_count:
            _fail("mesh.trainer_devices", mesh.trainer_devices,
                  f"at most this host's {device_count} devices (the instances are Ray actors)")
        return
    t, k, d = mesh.trainer_devices, mesh.rollout_instances, mesh.devices_per_instance
    if mesh.colocate and d > t:
        _fail("mesh.devices_per_instance", d, f"colocated, each instance runs on devices of the "
              f"trainer's mesh: at most mesh.trainer_devices ({t})")
    needed = devices_needed(mesh)
    if needed <= device_count:
        return
    cpu_hint = "on a CPU, set XLA_FLAGS=--xla_force_host_platform_device_count"
    host = "this host" if processes == 1 else (
        f"process 0 of the trainer group of {processes} (distributed.num_processes; it holds "
        f"its part of the trainer and every instance)")
    if mesh.colocate:
        _fail("mesh", f"colocated on {t} trainer devices", f"needs {needed} devices, {host} "
              f"has {device_count} (lower mesh.trainer_devices; {cpu_hint})")
    _fail("mesh", f"{t} + {k} × {d}", f"needs {needed} devices, {host} has {device_count} "
          f"({cpu_hint}; or share devices: --config.mesh.colocate=True runs the trainer and all "
          f"{k} instances on the first mesh.trainer_devices ({t}) devices)")


def validate_distributed(config) -> None:
    """The `distributed` section alone: main checks it before it starts Ray or a trainer
    group, which happen before JAX (and so the rest of `validate`) can run."""
    d = config.distributed
    if d.backend not in BACKENDS:
        _fail("distributed.backend", d.backend, f"one of {', '.join(BACKENDS)}")
    if d.transport != "auto":
        _one_of(config, "distributed.transport", TRANSPORTS)
        if d.backend not in TRANSPORTS.get(d.transport)["backends"]:
            serving = [n for n in TRANSPORTS.names() if d.backend in TRANSPORTS.get(n)["backends"]]
            _fail("distributed.transport", d.transport,
                  f"backend {d.backend!r} moves weights with 'auto' or {', '.join(serving)}")
    for field in ("ray_num_cpus", "ray_object_store_mb", "num_processes",
                  "max_instance_restarts"):
        _int_at_least(config, f"distributed.{field}", 0)
    _int_at_least(config, "distributed.trainer_processes", 1)
    if d.trainer_processes > 1:
        if d.backend != "ray":
            _fail("distributed.trainer_processes", d.trainer_processes,
                  f"1 with distributed.backend={d.backend!r}: the other trainer processes are "
                  "Ray actors (backend='ray'); without Ray start every process yourself "
                  "(distributed.num_processes, process_id, coordinator_address)")
        for field, unset in (("num_processes", 0), ("process_id", -1), ("coordinator_address", "")):
            if _get(config, f"distributed.{field}") != unset:
                _fail("distributed.trainer_processes", d.trainer_processes,
                      f"1 when distributed.{field} is set ({_get(config, f'distributed.{field}')!r}):"
                      " trainer_processes > 1 has the driver spawn its group as Ray actors, "
                      f"distributed.{field} is for a group whose every process runs the command")
    for field in ("instance_cpus", "instance_gpus", "trainer_cpus", "trainer_gpus"):
        value = _get(config, f"distributed.{field}")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            _fail(f"distributed.{field}", value, "expected a number ≥ 0 (Ray resources)")
    for field in ("poll_wait_s", "heartbeat_timeout_s", "start_timeout_s", "pull_timeout_s",
                  "stop_timeout_s"):
        _positive(config, f"distributed.{field}")
    if not d.heartbeat_timeout_s > d.poll_wait_s:
        _fail("distributed.heartbeat_timeout_s", d.heartbeat_timeout_s,
              f"must exceed distributed.poll_wait_s ({d.poll_wait_s}): an idle actor answers "
              "only that often")
    for field in ("instance_resource", "trainer_resource"):
        if not isinstance(_get(config, f"distributed.{field}"), str):
            _fail(f"distributed.{field}", _get(config, f"distributed.{field}"),
                  "'' or the name of a custom Ray resource (`ray start --resources`)")
    if not d.ray_address or not isinstance(d.ray_address, str):
        _fail("distributed.ray_address", d.ray_address,
              "'local' (a loopback-only head in this process), 'auto' or 'host:port'")
    if d.instance_platform not in ("", "cpu", "cuda", "gpu", "tpu", "rocm"):
        _fail("distributed.instance_platform", d.instance_platform,
              "'' (as the node has it) or a JAX platform: cpu, cuda, gpu, rocm, tpu")
    chips = config.mesh.devices_per_instance
    if d.instance_platform == "tpu" and d.ray_address == "local":
        _fail("distributed.instance_platform", d.instance_platform,
              "not 'tpu' with distributed.ray_address = 'local': each TPU instance owns its "
              "host's first chips, and here the trainer and every instance share one host "
              "(one TPU VM: the local backend; a slice: launch/tpu_vms.sh or tpu_slice.sh)")
    if d.instance_platform == "tpu" and chips not in TPU_HOST_CHIP_BOUNDS:
        *most, last = TPU_HOST_CHIP_BOUNDS
        _fail("mesh.devices_per_instance", chips,
              f"{', '.join(map(str, most))} or {last} with distributed.instance_platform = 'tpu': "
              "each instance is a TPU process alone on its host, owning that many chips")
    if d.coordinator_address not in ("", "auto") and ":" not in d.coordinator_address:
        _fail("distributed.coordinator_address", d.coordinator_address,
              "'' (from JAX_COORDINATOR_ADDRESS), 'host:port' of process 0, or 'auto' (a TPU "
              "slice: JAX reads the group from the VM's metadata)")
    if not isinstance(d.process_id, int) or isinstance(d.process_id, bool) or d.process_id < -1 \
            or (d.num_processes and d.process_id >= d.num_processes):
        _fail("distributed.process_id", d.process_id,
              f"-1 (from JAX_PROCESS_ID) or an int in [0, distributed.num_processes = "
              f"{d.num_processes})")
