"""Orbax checkpoints that hold everything a resume needs, and refuse anything else loudly.

One checkpoint (directory `<root>/<step>/`) has three items:
- `state`: the TrainState (params, Adam moments, step, RNG, reference params) as a flat
  dict `"params.blocks.attn.q" -> array`, so shape errors and missing entries have names;
- `meta` (JSON): configs, the data iterator's position, `StalenessManager.state_dict()`,
  the trajectories' JSON metadata, and a fingerprint of every array;
- `trajectories`: the trajectories' arrays (tokens, log-probs, versions, ...), if any.
No pickles anywhere: a checkpoint stays readable when the code moves on.

Saves are asynchronous: Orbax copies the arrays to host before `save` returns, so the next
(donating) train step may overwrite the device buffers while the files are written. Not on a
CPU: there the "host copy" is a view of the state's own buffers, a train step cannot donate
a buffer something else views, and it would allocate a whole second state (1.6 GB for
SmolLM2) while the files are written; so a CPU trainer's saves are synchronous. A save
first checks that its directory has room for it (a SmolLM2-135M checkpoint is 1.6 GB with the
Adam moments) and refuses with the sizes if not, before writing anything; a write that fails
anyway (the disk filled meanwhile) surfaces as a CheckpointError when the save is awaited.
Either way the earlier checkpoints stay whole and the run resumes from the latest.

Restores check before they trust: every item present, every array's name, shape and dtype
as the current config expects, and every array's fingerprint as it was saved (Orbax does
not checksum raw chunks, so a flipped bit would otherwise load silently).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

from asyncrl.errors import UserError
from asyncrl.model.loading import export_hf
from asyncrl.train.trainer import Trainer, TrainState

FORMAT = 2  # 2: `coordinator` (the core's whole state) replaced `staleness`
# Room a save leaves beside its own bytes: Orbax's metadata files, and the rest of the run
# (metrics, logs) that writes to the same disk.
SPARE_BYTES = 64 << 20
_ITEMS = ("state", "meta", "trajectories")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that cannot be resumed from; the message names its path and the fault."""


@dataclasses.dataclass
class ResumeData:
    """What a resume needs beside the TrainState. Plain data: JSON and numpy arrays only.

    data_state: the data iterator's position, e.g. {"cursor": {"position": 1280}}.
    coordinator: the coordinator core's `state_dict()`: the admission's protocol state (the
        StalenessManager's, for StaleFlow), prompts to retry, aborted entries, counters.
    trajectories: JSON metadata of every trajectory finished or partial at save time,
        e.g. {"meta": [{"id": "p3/1", "status": "RUNNING", "v_traj": 4, "len": 37}, ...]}.
    trajectory_arrays: their payloads by name, e.g. {"tokens": int32 [n, T],
        "logprobs": float32 [n, T], "versions": int32 [n, T]}; numeric or bool dtypes.
    """

    data_state: dict[str, Any] = dataclasses.field(default_factory=dict)
    coordinator: dict[str, Any] | None = None
    trajectories: dict[str, Any] = dataclasses.field(default_factory=dict)
    trajectory_arrays: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    run_wall_s: float = 0.0  # the run's wall seconds at save, over every process before it


def _name(path) -> str:
    parts = []
    for key in path:
        part = getattr(key, "key", getattr(key, "name", getattr(key, "idx", None)))
        parts.append(str(part))
    if parts and parts[-1] == "value":  # nnx.Variable's payload: 'q.value' reads as 'q'
        parts.pop()
    return ".".join(parts)


def flatten_state(state: TrainState) -> tuple[dict[str, Any], Any]:
    """{dotted name: leaf} and the treedef to rebuild the TrainState."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(state)
    flat = {_name(path): leaf for path, leaf in leaves}
    if len(flat) != len(leaves):
        raise ValueError("two TrainState leaves map to one checkpoint name")
    return flat, treedef


@jax.jit
def _fingerprints(flat: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """uint32 digest per array: Σ bits·(2i+1) mod 2³². Integer sums are exact in any order,
    so the digest does not depend on how the array is sharded."""

    def one(x):
        if x.dtype.itemsize == 4:
            bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
        elif x.dtype.itemsize == 2:
            bits = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
        else:
            bits = x.astype(jnp.uint32)
        index = jnp.arange(bits.size, dtype=jnp.uint32).reshape(bits.shape)
        return (bits * (2 * index + 1)).sum(dtype=jnp.uint32)

    return {k: one(v) for k, v in flat.items()}


def _host_fingerprints(flat) -> dict[str, int]:
    with jax.transfer_guard("allow"):  # an intended, tiny device → host copy
        return {k: int(v) for k, v in jax.device_get(_fingerprints(flat)).items()}


def _sha256(x: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()


class Checkpointer:
    """Saves and restores (TrainState, ResumeData) under one root directory, keeping N."""

    def __init__(
        self, directory: str | Path, trainer: Trainer, keep: int = 3,
        async_save: bool | None = None,
    ):
        """`async_save` None: asynchronous unless the trainer's devices are a CPU's (see the
        module docstring)."""
        if async_save is None:
            async_save = not all(d.platform == "cpu" for d in trainer.mesh.devices.flat)
        self.directory = Path(directory).absolute()
        self.trainer = trainer
        self.keep = keep
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=async_save, create=True
            ),
            item_handlers={
                "state": ocp.StandardCheckpointHandler(),
                "meta": ocp.JsonCheckpointHandler(),
                "trajectories": ocp.StandardCheckpointHandler(),
            },
        )

    # -- save -------------------------------------------------------------------------------

    def save(self, state: TrainState, resume: ResumeData) -> int:
        """Starts a save at the state's step (written before it returns where saves are
        synchronous); returns the step."""
        step = int(jax.device_get(state.step))
        flat, _ = flatten_state(state)
        arrays = {k: np.asarray(v) for k, v in resume.trajectory_arrays.items()}
        for name, array in arrays.items():
            if array.dtype.kind not in "biuf" or "." in name or "/" in name:
                raise ValueError(
                    f"trajectory array {name!r}: need a numeric/bool dtype and a name without "
                    f"'.' or '/'; received dtype {array.dtype}"
                )
        for field in ("data_state", "coordinator", "trajectories"):
            value = getattr(resume, field)
            # JSON turns tuples into lists and int keys into strings: refuse what would not
            # come back equal, rather than resume from something subtly different.
            if json.loads(json.dumps(value)) != value:
                raise ValueError(
                    f"ResumeData.{field} does not survive JSON unchanged (tuples or non-str keys?)"
                )
        meta = {
            "format": FORMAT,
            "step": step,
            "model_config": dataclasses.asdict(self.trainer.model_config),
            "train_config": dataclasses.asdict(self.trainer.config),
            "fingerprints": _host_fingerprints(flat),
            "data_state": resume.data_state,
            "coordinator": resume.coordinator,
            "trajectories": resume.trajectories,
            "run_wall_s": float(resume.run_wall_s),
            "trajectory_arrays": {
                k: {"shape": list(a.shape), "dtype": a.dtype.str, "sha256": _sha256(a)}
                for k, a in arrays.items()
            },
        }
        # Fail here, with the caller on the stack, not in Orbax's thread.
        meta_bytes = len(json.dumps(meta))
        self._check_room(step, flat, arrays, meta_bytes)
        args = {"state": ocp.args.StandardSave(flat), "meta": ocp.args.JsonSave(meta)}
        # Orbax cannot write zero-size arrays; their shape and dtype in meta are all they hold.
        stored = {k: a for k, a in arrays.items() if a.size}
        if stored:
            args["trajectories"] = ocp.args.StandardSave(stored)
        try:
            self._manager.save(step, args=ocp.args.Composite(**args))
        except Exception as error:  # Orbax awaits the previous save first: its failure too
            raise self._save_failed(error) from error
        return step

    def _check_room(self, step: int, flat: dict[str, Any], arrays: dict[str, np.ndarray],
                    meta_bytes: int) -> None:
        """Refuses a save the disk cannot hold, before any of it is written. Orbax deletes
        the oldest checkpoint only once the new one is complete, so the new one needs room
        of its own."""
        self.wait()  # an earlier save still writing takes room too
        needed = (sum(leaf.nbytes for leaf in flat.values())
                  + sum(a.nbytes for a in arrays.values()) + meta_bytes)
        self.directory.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.directory).free
        if free < needed + SPARE_BYTES:
            raise CheckpointError(
                f"checkpoint of step {step}: needs about {_size(needed + SPARE_BYTES)} under "
                f"{self.directory}, which has {_size(free)} free. Make room there (each "
                f"checkpoint kept takes about {_size(needed)}; checkpoint.keep is {self.keep}), "
                f"then run the same command again: {self._resumes_from()}")

    def _save_failed(self, error: Exception) -> CheckpointError:
        full = "No space left on device" in str(error)
        return CheckpointError(
            f"checkpoint save under {self.directory} failed"
            f"{' (the disk is full)' if full else ''}: {_brief(error)}{_partials(self.directory)}. "
            f"Run the same command again once it is fixed: {self._resumes_from()}")

    def _resumes_from(self) -> str:
        # From the disk, not the manager: it counts a step from the moment its save starts.
        finished = [int(p.name) for p in self.directory.iterdir() if p.name.isdigit()]
        latest = max(finished, default=None)
        return ("it starts over, no checkpoint is complete" if latest is None
                else f"it resumes from step {latest}, the latest complete checkpoint")

    def wait(self) -> None:
        """Until the save in flight is written; CheckpointError if it failed."""
        try:
            self._manager.wait_until_finished()
        except Exception as error:
            raise self._save_failed(error) from error

    def close(self) -> None:
        try:
            self.wait()
        except CheckpointError:
            # Closing awaits the failed save again: the error being raised already says it.
            with contextlib.suppress(Exception):
                self._manager.close()
            raise
        self._manager.close()

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    # -- restore ----------------------------------------------------------------------------

    def restore(self, step: int | None = None) -> tuple[TrainState, ResumeData]:
        """The checkpoint at `step` (default: the latest), verified; CheckpointError if not."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise CheckpointError(
                f"checkpoint {self.directory}: no finished checkpoint{_partials(self.directory)}"
            )
        path = self.directory / str(step)
        if not path.is_dir():
            raise CheckpointError(f"checkpoint {path}: does not exist{_partials(self.directory)}")
        for item in ("state", "meta"):
            if not (path / item).is_dir():
                raise CheckpointError(f"checkpoint {path}: {_missing(item)}")
        try:
            meta_args = ocp.args.Composite(meta=ocp.args.JsonRestore())
            meta = self._manager.restore(step, args=meta_args)["meta"]
            on_disk = self._manager.item_metadata(step)["state"]
        except Exception as err:  # Orbax/tensorstore raise many types; all mean unreadable here
            raise CheckpointError(f"checkpoint {path}: unreadable metadata: {_brief(err)}") from err
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise CheckpointError(f"checkpoint {path}: meta is not asyncrl format {FORMAT}")
        if meta.get("step") != step:
            raise CheckpointError(f"checkpoint {path}: meta says step {meta.get('step')}")

        expected, treedef = flatten_state(self.trainer.abstract_state())
        on_disk = {k: (tuple(v.shape), v.dtype) for k, v in on_disk.tree.items()}
        _check_layout(path, expected, on_disk)
        specs = meta.get("trajectory_arrays", {})
        stored = any(math.prod(spec["shape"]) for spec in specs.values())
        if stored and not (path / "trajectories").is_dir():
            raise CheckpointError(f"checkpoint {path}: {_missing('trajectories')}")
        args = {"state": ocp.args.StandardRestore(expected)}
        if stored:
            args["trajectories"] = ocp.args.StandardRestore()
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**args))
        except Exception as err:
            message = f"checkpoint {path}: unreadable array data: {_brief(err)}"
            raise CheckpointError(message) from err

        flat = restored["state"]
        saved_fp = meta["fingerprints"]
        for name, digest in _host_fingerprints(flat).items():
            if saved_fp.get(name) != digest:
                raise CheckpointError(
                    f"checkpoint {path}: {name} does not match its saved fingerprint (corrupt data)"
                )
        arrays = {}
        for name, spec in specs.items():
            if math.prod(spec["shape"]):
                array = np.asarray(restored["trajectories"][name])
            else:
                array = np.zeros(spec["shape"], np.dtype(spec["dtype"]))
            if _sha256(array) != spec["sha256"]:
                raise CheckpointError(
                    f"checkpoint {path}: trajectory array {name!r} is corrupt (sha256 differs)"
                )
            arrays[name] = array
        state = jax.tree_util.tree_unflatten(treedef, [flat[k] for k in expected])
        resume = ResumeData(meta["data_state"], meta["coordinator"], meta["trajectories"], arrays,
                            meta.get("run_wall_s", 0.0))  # absent in checkpoints before it
        return state, resume


def _check_layout(path: Path, expected: dict[str, Any], on_disk: dict[str, tuple]) -> None:
    problems = []
    for name in expected.keys() - on_disk.keys():
        problems.append(f"{name}: missing from the checkpoint")
    for name in on_disk.keys() - expected.keys():
        problems.append(f"{name}: in the checkpoint but not in this model/config")
    for name in expected.keys() & on_disk.keys():
        want, (shape, dtype) = expected[name], on_disk[name]
        if tuple(want.shape) != shape:
            problems.append(f"{name}: expected {tuple(want.shape)}, checkpoint has {shape}")
        elif np.dtype(want.dtype) != np.dtype(dtype):
            problems.append(
                f"{name}: expected dtype {np.dtype(want.dtype)}, checkpoint has {np.dtype(dtype)}"
            )
    if problems:
        problems.sort(key=lambda p: (not p.startswith("params."), p))  # weights first
        more = f"; … {len(problems) - 8} more" if len(problems) > 8 else ""
        listed = "; ".join(problems[:8]) + more
        raise CheckpointError(f"checkpoint {path}: does not match the model config: {listed}")


def _missing(item: str) -> str:
    return f"missing item {item!r} (partial or damaged save)"


def _brief(err: Exception) -> str:
    # Tensorstore errors carry a full JSON spec; the first line says what went wrong.
    lines = str(err).strip().splitlines() or [""]
    return f"{type(err).__name__}: {lines[0][:300]}"


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def _partials(root: Path) -> str:
    tmp = sorted(p.name for p in root.glob("*.orbax-checkpoint-tmp*")) if root.is_dir() else []
    return f" (unfinished saves: {', '.join(tmp)})" if tmp else ""


def restore_or_init(
    trainer: Trainer, workdir: str | Path, resume_from: str | Path | None = None, keep: int = 3,
    initial_params=None,
) -> tuple[Checkpointer, TrainState, ResumeData | None, str]:
    """The run's starting point, in this order:

    1. the latest checkpoint in `workdir/checkpoints`: a restarted run carries on;
    2. `resume_from`: a checkpoint root or one step directory of another run;
    3. a fresh state, from `initial_params` (e.g. a loaded checkpoint) or a random init.
    A checkpoint that is found but damaged or mismatched raises CheckpointError; it never
    silently falls through to a fresh start, which would throw the run away.
    Returns the workdir's Checkpointer, the state, the ResumeData (None if fresh) and a
    one-line description of the source.
    """
    ckpt = Checkpointer(Path(workdir) / "checkpoints", trainer, keep=keep)
    try:
        if ckpt.latest_step() is not None:
            state, resume = ckpt.restore()
            return ckpt, state, resume, f"resumed from {ckpt.directory / str(ckpt.latest_step())}"
        if resume_from is not None:
            state, resume, where = _restore_elsewhere(trainer, Path(resume_from).absolute())
            return ckpt, state, resume, f"resumed from {where}"
    except BaseException:
        ckpt.close()  # no Orbax threads left behind when the run stops here
        raise
    if initial_params is not None:
        return ckpt, trainer.init_state(initial_params), None, "initialised from the policy's weights"
    return ckpt, trainer.init_state(), None, "initialised from scratch"


def _restore_elsewhere(trainer: Trainer, source: Path) -> tuple[TrainState, ResumeData, Path]:
    """`source` is a checkpoint root (its latest step) or one step directory."""
    if not source.exists():
        raise CheckpointError(f"checkpoint {source}: does not exist")
    step = None
    if source.name.isdigit() and any((source / item).exists() for item in _ITEMS):
        source, step = source.parent, int(source.name)
    other = Checkpointer(source, trainer)
    try:
        state, resume = other.restore(step)
    finally:
        other.close()
    return state, resume, source / str(int(jax.device_get(state.step)))


def restore_params(trainer: Trainer, source: str | Path) -> tuple[Any, int]:
    """The policy params and step of a checkpoint root (its latest step) or one step folder."""
    state, _, _ = _restore_elsewhere(trainer, Path(source).absolute())
    return trainer.policy_params(state.params), int(jax.device_get(state.step))


def export_policy(folder: str | Path, trainer: Trainer, state: TrainState, tokenizer=None) -> Path:
    """The trained policy as a Hugging Face folder (`AutoModelForCausalLM.from_pretrained`)."""
    with jax.transfer_guard("allow"):  # an intended gather of every shard to the host
        params = jax.device_get(trainer.policy_params(state.params))
    return export_hf(folder, trainer.model_config, params, tokenizer)
