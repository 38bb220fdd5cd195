"""A run folder's identity: `run.json`, written on the folder's first use, checked on every
later one.

    check_identity(workdir, config, experiment)       # any process: refuses, writes nothing
    claim(workdir, config, experiment)                # process 0: checks, then records
    stored_config(workdir)                            # the config a run trains under

`run.json` holds the experiment (the config file and its argument), the resolved config and
the code version (the git commit and whether the tree was dirty, else the installed package's
version), and one line per later use. A folder written by another experiment, or by a config
that differs in a field the run's state depends on (IDENTITY_FIELDS: the model and its
tokenizer, the task and its data, the optimizer, the group size, the seed, and the protocol's
η, batch size and admission), is refused with one line naming the folder and the differing
fields, before anything is written there:
resuming it would mix two runs' checkpoints, metrics and results into one record.
`resume_anyway` (--resume_anyway) uses it all the same, records what differed, and from then
on the folder is the new config's run. A run.json beside nothing else a run writes records an
attempt that failed while it was built; the next use replaces it.

Other fields may change between uses (train.steps to train longer, the number of rollout
instances, the schedule): a checkpoint restores under them. Import-light: main checks the
folder before JAX starts.
"""

from __future__ import annotations

import datetime
import errno
import importlib.metadata
import json
import os
import pathlib
import subprocess
from typing import Any

import ml_collections

from asyncrl.config_args import config_from_json, config_json
from asyncrl.errors import UserError, local_workdir

RUN_FILE = "run.json"
# What a folder holds once a run got as far as its first evaluation. A run.json with none of
# them beside it records an attempt that failed while it was being built (a model that did
# not load, a data file refused): nothing depends on it, and the corrected rerun replaces it.
_RUN_MARKERS = ("results.json", "metrics.jsonl")
# The fields a run's state depends on: its weights and optimizer state, its data cursor and
# its records mean nothing under other values. A section name covers every field in it.
IDENTITY_FIELDS = (
    "model",  # the weights, and the tokenizer that comes with them
    "task.dataset", "task.train_path", "task.test_path", "task.prompt_field",
    "task.answer_field", "task.answer_format", "task.kinds", "task.style",
    "task.seed", "task.reward", "task.chat_template", "task.system_prompt", "task.instruction",
    "train.learning_rate", "train.lr_schedule", "train.warmup_steps", "train.weight_decay",
    "train.max_grad_norm",
    "rollout.group_size",
    "seed",
    # What the checkpointed protocol and schedule were built for: their state cannot be
    # restored under other values.
    "staleness.eta", "train.batch_size", "coordinator.admission",
)
# Identity fields that name files: compared as the files they resolve to, so the same file
# named relatively and absolutely, or from another directory, is the same run.
_PATH_FIELDS = ("model.checkpoint", "task.train_path", "task.test_path")
_PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]


class RunFolderError(UserError):
    """A workdir that cannot hold this run: another run's folder, a file, not writable, full."""


def experiment_name(config_flag: str | None) -> str | None:
    """`path:arg` of a `--config` value, the path relative to the current directory when it
    lies under it, so the same file named two ways is one experiment."""
    if not config_flag:
        return None
    path, sep, arg = config_flag.partition(":")
    resolved = pathlib.Path(path).resolve()
    try:
        path = resolved.relative_to(pathlib.Path.cwd()).as_posix()
    except ValueError:
        path = resolved.as_posix()
    return f"{path}{sep}{arg}"


def default_workdir(config_flag: str) -> str:
    """runs/<config file's name>[-<its argument>]: each experiment a folder of its own."""
    path, _, arg = config_flag.partition(":")
    name = pathlib.Path(path).stem
    if arg:
        name += "-" + "".join(ch if ch.isalnum() or ch in "=._" else "-" for ch in arg)
    return f"runs/{name}"


def source_version() -> dict[str, Any]:
    """The commit and whether the tree differs from it, when asyncrl runs from a git
    checkout; else the installed package's version."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(_PACKAGE_ROOT), *args], capture_output=True,
                              text=True, check=True, timeout=30).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        return {"commit": commit, "dirty": dirty}
    except (OSError, subprocess.SubprocessError):
        try:
            return {"package_version": importlib.metadata.version("asyncrl")}
        except importlib.metadata.PackageNotFoundError:
            return {"package_version": "unknown"}


def identity_fields(config) -> dict[str, Any]:
    """The IDENTITY_FIELDS of `config`, flattened to dotted names, as JSON values."""
    plain = config_json(config)
    fields: dict[str, Any] = {}
    for name in IDENTITY_FIELDS:
        node: Any = plain
        for part in name.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        fields.update(_flatten(name, node))
    for name in _PATH_FIELDS:
        if isinstance(fields.get(name), str) and os.path.exists(fields[name]):
            fields[name] = os.path.realpath(fields[name])
    return fields


def check_identity(workdir: str | pathlib.Path, config,
                   experiment: str | None, resume_anyway: bool = False) -> dict | None:
    """Raises RunFolderError unless `workdir` may hold this run; returns its run.json (None
    for a folder no run has used). Writes nothing."""
    folder = _usable_folder(workdir)
    record = _read_record(folder)
    if record is not None and not _holds_run(folder):
        return None  # a first attempt that failed before it wrote anything else
    if record is None:
        if _holds_run(folder) and not resume_anyway:
            raise RunFolderError(
                f"workdir {folder} holds a run but no {RUN_FILE} (written by an asyncrl that "
                f"recorded no identity): its config cannot be checked against this one; pass "
                f"--resume_anyway to resume it as this config, or choose another --workdir")
        return None
    differences = _differences(record, config, experiment)
    if differences and not resume_anyway:
        raise RunFolderError(
            f"workdir {folder} holds another run: {'; '.join(differences)}. Choose another "
            f"--workdir, or pass --resume_anyway to resume it with this config")
    return record


def claim(workdir: str | pathlib.Path, config,
          experiment: str | None, resume_anyway: bool = False) -> None:
    """check_identity, then records this use in run.json: the whole identity on first use,
    a line (time, code version, what differed when resumed anyway) on each later one."""
    record = check_identity(workdir, config, experiment, resume_anyway)
    folder = local_workdir(workdir)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    if record is None:
        record = {"created": now, "code": source_version(), "uses": []}
    else:
        use = {"time": now, "code": source_version()}
        differences = _differences(record, config, experiment)
        if differences:
            # From here on the run is this config's: later resumes need no flag, and eval
            # and export read the config it now trains under. What it was stays here.
            use["resumed_anyway"] = differences
        record.setdefault("uses", []).append(use)
        if not differences:
            _write(folder, record)
            return
    record.update(_identity(config, experiment))
    _write(folder, record)


def _identity(config, experiment: str | None) -> dict[str, Any]:
    """What run.json compares a later use against, besides the config it keeps whole."""
    return {"experiment": experiment, "experiment_file": _experiment_file(experiment),
            "config": config_json(config), "identity": identity_fields(config)}


def stored_config(workdir: str | pathlib.Path) -> ml_collections.ConfigDict | None:
    """The resolved config the run in `workdir` trains under (the one it started with, or the
    one --resume_anyway took it over with), or None when the folder has no run.json.
    Sequences come back as tuples, as config files write them."""
    record = _read_record(local_workdir(workdir))
    if record is None:
        return None
    return config_from_json(record["config"])


def _usable_folder(workdir: str | pathlib.Path) -> pathlib.Path:
    folder = local_workdir(workdir)
    for parent in (folder, *folder.parents):
        if parent.exists() and not parent.is_dir():
            raise RunFolderError(f"--workdir={workdir}: {parent} is a file, not a folder")
        if parent.is_dir():
            if not os.access(parent, os.W_OK | os.X_OK):
                what = "it" if parent == folder else f"its parent {parent}"
                raise RunFolderError(f"--workdir={workdir}: {what} cannot be written "
                                     f"(permission denied)")
            break
    return folder


def _read_record(folder: pathlib.Path) -> dict | None:
    path = folder / RUN_FILE
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunFolderError(f"{path}: cannot be read as the run's identity ({error}); it is "
                             f"written when the folder is first used") from None
    if not isinstance(record, dict) or not all(
            isinstance(record.get(key), dict) for key in ("config", "identity")):
        raise RunFolderError(f"{path}: no 'config' and 'identity' objects; it is not a run.json "
                             f"asyncrl wrote")
    return record


def _differences(record: dict, config,
                 experiment: str | None) -> list[str]:
    found = []
    # The same experiment: the same name (a checkout elsewhere, a fresh VM: the same file
    # relative to where it runs), or the same file named another way; each with its argument.
    there = record.get("experiment")
    if experiment and there and experiment != there and (
            record.get("experiment_file"), there.partition(":")[2]) != (
            _experiment_file(experiment), experiment.partition(":")[2]):
        found.append(f"experiment {there} (this run: {experiment})")
    # As recorded, not derived from the stored config again: its paths were resolved from
    # the directory the run started in.
    found += [f"config.{name} = {there!r} there, {here!r} here"
              for name, here, there in _differing(identity_fields(config), record["identity"])]
    return found


def _experiment_file(experiment: str | None) -> str | None:
    return None if not experiment else str(pathlib.Path(experiment.partition(":")[0]).resolve())


def _holds_run(folder: pathlib.Path) -> bool:
    return (any((folder / marker).exists() for marker in _RUN_MARKERS)
            or any(p.name.isdigit() for p in (folder / "checkpoints").glob("*")))


def identity_differences(here: ml_collections.ConfigDict, there: ml_collections.ConfigDict
                         ) -> list[tuple[str, Any, Any]]:
    """(field, value here, value there) for each identity field whose values differ."""
    return _differing(identity_fields(here), identity_fields(there))


def _differing(ours: dict[str, Any], theirs: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    return [(name, ours.get(name), theirs.get(name)) for name in sorted(ours.keys() | theirs.keys())
            if ours.get(name) != theirs.get(name)]


def _write(folder: pathlib.Path, record: dict) -> None:
    path = folder / RUN_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(record, indent=2) + "\n")
        partial.replace(path)  # a full disk leaves the old record whole, not half a new one
    except OSError as error:
        raise folder_write_error(folder, error) from None


def folder_write_error(folder: pathlib.Path, error: OSError) -> RunFolderError:
    """The one line for a write into the run's folder that failed."""
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return RunFolderError(f"workdir {folder}: the disk is full ({error.strerror} writing "
                              f"{error.filename or folder}); free space, or choose another "
                              f"--workdir, then rerun: the run resumes from its last checkpoint")
    return RunFolderError(f"workdir {folder}: cannot write {error.filename or folder}: "
                          f"{error.strerror or error}")


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(f"{prefix}.{key}", item))
        return flat
    return {prefix: value}
