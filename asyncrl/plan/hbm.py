"""Whether a run's devices can hold it: the part of planning that asyncrl.main also does,
against its real accelerators, before it loads any weights (asyncrl/plan/planner.py plans the rest)."""

from __future__ import annotations

import functools
import json
import math
import pathlib

from asyncrl.errors import UserError


class DoesNotFit(UserError):
    """A part exceeds a chip's HBM: the message names it, by how much, and what to change."""


def model_of(c):
    """The model's shape: the checkpoint folder's config.json when it is here, else the
    config's preset (the planner needs no weights)."""
    from asyncrl.model import ModelConfig

    folder = pathlib.Path(c.model.checkpoint)
    if (folder / "config.json").is_file():
        hf = json.loads((folder / "config.json").read_text())
        return ModelConfig.from_hf_config(hf, param_dtype=c.model.param_dtype), str(folder)
    preset = getattr(ModelConfig, c.model.preset, None)
    if preset is None:
        raise UserError(f"config.model.preset = {c.model.preset!r} is not a ModelConfig preset, "
                        f"and {folder} has no config.json to read the shape from")
    return preset(param_dtype=c.model.param_dtype), f"preset {c.model.preset}"


@functools.lru_cache(maxsize=None)
def param_count(model) -> float:
    """Parameters of a ModelConfig, from the abstract model (nothing materialised)."""
    import jax
    import numpy as np

    from asyncrl.model import abstract_params

    return float(sum(np.prod(x.shape) for x in jax.tree.leaves(abstract_params(model)[1])))


def check_devices_hold_the_state(c, trainer_devices, instance_devices=()) -> None:
    """What asyncrl.main checks against its real accelerators before it loads any weights:
    the state each device must hold for the whole run (the trainer's float32 master weights,
    Adam moments and the policy copy, FSDP-split; an instance's weights and KV cache), against
    the device's memory limit. Temporaries are the compiler's to check when it compiles."""
    devices = list(trainer_devices) + [d for mesh in instance_devices for d in mesh]
    if not devices or devices[0].platform == "cpu" or str(c.model.checkpoint).endswith(".gguf"):
        return  # host memory, or a shape only the file says (read with the weights)
    stats = devices[0].memory_stats() or {}
    capacity = stats.get("bytes_limit")
    if not capacity:
        return
    import jax.numpy as jnp

    from asyncrl.model.paged import kv_bytes_per_token

    model, _ = model_of(c)
    count = param_count(model)
    policy = jnp.dtype(model.param_dtype).itemsize
    copies = 3 + (1 if c.train.kl_coef > 0 else 0)  # master, two moments, the reference
    kind = f"{devices[0].device_kind} ({capacity / 1e9:.1f} GB)"
    # float32 master, moments (and reference), and the policy copy rollout gets when the
    # model computes in another dtype: split over the trainer's devices (FSDP).
    trainer = count * (4 * copies + (policy if policy != 4 else 0)) / len(trainer_devices)
    max_len = c.rollout.prompt_bucket + c.rollout.max_new_tokens
    positions = (c.rollout.num_pages * c.rollout.page_size if c.rollout.num_pages
                 else c.rollout.num_slots * max_len)
    kv = positions * kv_bytes_per_token(model)
    instance = count * policy + kv if instance_devices else 0.0
    shared = c.mesh.colocate  # the instances run on the trainer's own devices
    if trainer + (instance if shared else 0.0) > capacity:
        chips = math.ceil(trainer * len(trainer_devices) / (0.8 * capacity))
        raise DoesNotFit(
            f"the trainer does not fit: its parameters and optimizer state are "
            f"{trainer / 1e9:.1f} GB per {kind} over mesh.trainer_devices = "
            f"{len(trainer_devices)}" + (f", beside a colocated instance's {instance / 1e9:.1f} GB"
                                         if shared else "")
            + f"; FSDP splits them: use at least {chips} trainer devices (plan with "
            f"python -m asyncrl.plan)")
    if instance > capacity:
        raise DoesNotFit(
            f"a rollout instance does not fit: its weights ({count * policy / 1e9:.1f} GB) "
            f"and KV cache ({kv / 1e9:.1f} GB, {positions} positions) exceed one {kind}; set "
            f"rollout.page_size and a smaller rollout.num_pages, or fewer rollout.num_slots "
            f"(plan with python -m asyncrl.plan)")
