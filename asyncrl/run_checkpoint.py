"""A run's trained policy as the commands after a run read it: `python -m asyncrl.eval` and
`python -m asyncrl.export`.

    c = checkpoint_config(_CONFIG.value, "runs/grpo")    # --config, else the run's run.json
    policy, params, folder = load_params(c, "runs/grpo")  # its latest checkpoint

A checkpoint is a run folder (its latest step), its checkpoints folder, or one step folder in
it; evaluation also takes a model (a Hugging Face folder, a .gguf file, 'embedded'). The
config comes from `--config` when given, else from the run.json of the run folder the
checkpoint lies in, with `--config.<field>` overrides applied as to a config file's.
Import-light: the entry points split the host before JAX starts.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys

import ml_collections

from asyncrl.cli import with_flag_overrides
from asyncrl.config_args import ConfigError
from asyncrl.errors import UserError
from asyncrl.run_folder import RUN_FILE, identity_differences, stored_config

CHECKPOINTS = "checkpoints"  # a run folder's Orbax checkpoint root (asyncrl/run)


def trainer_checkpoint(path: pathlib.Path) -> pathlib.Path | None:
    """The Orbax checkpoint root or step folder that `path` names, if it names one."""
    if (path / CHECKPOINTS).is_dir():
        return path / CHECKPOINTS
    if path.is_dir() and not (path / "config.json").exists():
        return path  # a checkpoints root or one step: the restore says which, or what is wrong
    return None


def run_folder_of(path: pathlib.Path) -> pathlib.Path | None:
    """The run folder a trainer checkpoint lies in: the folder itself, or the one its
    checkpoints folder or step folder is in; None for a model file or folder."""
    root = trainer_checkpoint(path)
    if root is None:
        return None
    if root.name == CHECKPOINTS:
        return root.parent
    return root.parent.parent if root.parent.name == CHECKPOINTS else root


def checked_path(checkpoint: str) -> pathlib.Path:
    """`--checkpoint` as a path, refused when nothing is there ('embedded' is no path)."""
    from asyncrl.train.checkpoint import CheckpointError

    path = pathlib.Path(checkpoint)
    if checkpoint != "embedded" and not path.exists():
        raise CheckpointError(f"checkpoint {path}: does not exist")
    return path


def checkpoint_config(given: ml_collections.ConfigDict | None,
                      checkpoint: str) -> ml_collections.ConfigDict:
    """The config `checkpoint` is read under. `given` (--config) wins when given: a warning
    names the fields the run depends on where it differs from the run's run.json. Else the
    run's run.json, with the command line's --config.<field> overrides."""
    folder = None if checkpoint == "embedded" else run_folder_of(checked_path(checkpoint))
    stored = stored_config(folder) if folder is not None else None
    if given is not None:
        if stored is not None:
            _warn_differences(given, stored, folder)
        return given
    if folder is None:
        raise ConfigError(f"--checkpoint={checkpoint} is a model, not a run folder: no "
                          f"{RUN_FILE} records a config for it; pass --config=<config file> "
                          f"for the task (e.g. --config=experiments/grpo.py)")
    if stored is None:
        raise ConfigError(f"--checkpoint={checkpoint}: {folder} records no config (no "
                          f"{RUN_FILE}: a run folder from before asyncrl recorded one, or "
                          f"not a run folder); pass --config=<the config file it was trained "
                          f"with>, e.g. --config=experiments/grpo.py:tiny")
    return with_flag_overrides(stored)


def _warn_differences(given, stored, folder: pathlib.Path) -> None:
    differing = [f"config.{name} ({here!r} here, {there!r} there)"
                 for name, here, there in identity_differences(given, stored)]
    if differing:
        print(f"warning: --config differs from {folder / RUN_FILE}, which it overrides, in "
              f"{'; '.join(differing)}; leave --config out to use the run's own",
              file=sys.stderr, flush=True)


def load_params(c, checkpoint: str, step: int | None = None):
    """(policy, params, folder) for `checkpoint`, read under the config or spec `c`; folder,
    where its evaluation is written by default: the run folder (a step folder: itself), or
    the folder a model lies in. The config's model section describes the architecture a
    trainer checkpoint was saved from.
    `step`: that step of a run folder or checkpoints folder (default: the latest)."""
    import jax

    from asyncrl.policy import load_policy
    from asyncrl.train.checkpoint import restore_params
    from asyncrl.train.trainer import Trainer, trainer_mesh

    from asyncrl.config import resolve

    c = resolve(c, local_files=False)  # the weights need the model's section, not the data
    path = checked_path(checkpoint)
    root = None if checkpoint == "embedded" else trainer_checkpoint(path)
    if step is not None:
        root = _step_folder(checkpoint, root, step)
    if root is None:  # a model file or folder: it is the policy
        policy = load_policy(dataclasses.replace(c.model, checkpoint=checkpoint))
        return (policy, policy.params,
                pathlib.Path.cwd() if checkpoint == "embedded" else path.parent)
    policy = load_policy(c.model)  # the architecture the trainer checkpoint was saved from
    trainer = Trainer.create(c.train_config(), policy.config,
                             trainer_mesh(jax.devices()[:c.mesh.trainer_devices]),
                             c.rollout.group_size)
    params, restored = restore_params(trainer, root)
    print(f"restored step {restored} from {root}", flush=True)
    return policy, params, root.parent if root.name == CHECKPOINTS else root


def _step_folder(checkpoint: str, root: pathlib.Path | None, step: int) -> pathlib.Path:
    from asyncrl.train.checkpoint import CheckpointError

    if root is None or root.name != CHECKPOINTS:
        raise UserError(f"--step={step}: --checkpoint={checkpoint} is not a run folder or its "
                        f"{CHECKPOINTS} folder, whose steps --step picks from")
    steps = sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
    if step not in steps:
        raise CheckpointError(f"--step={step}: {root} holds no such step (steps: "
                              f"{', '.join(map(str, steps)) or 'none'})")
    return root / str(step)
