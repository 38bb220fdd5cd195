"""Every collective of a run's trainer, led by process 0 and mirrored by the rest of the group.

run.py talks to the trainer through one `TrainerGroup`; its methods are the only operations
that touch the trainer's arrays:

    group = TrainerGroup(trainer, checkpointer)
    state, metrics = group.step(state, host_batch)   # a TrainBatch of host arrays
    params = group.host_params(state)                # for the rollouts and the evaluator
    group.save(state, resume)                        # the Orbax checkpoint
    group.stop()                                     # the followers leave; checkpoints close

One process: these are the plain calls (no broadcast; `host_params` is
`trainer.policy_params(state.params)`), so a single-process run is what it was. A trainer group (multi-controller JAX): every process runs
the same program on one global mesh, so each collective must be issued by every process, in
the same order. Process 0 decides (it alone has the rollouts, the data and the schedule) and
announces each operation before doing it: an op code and a JSON header (the batch's shapes,
the checkpoint's trajectory arrays), broadcast with `multihost_utils`. The other processes
run `follow`, which does the same operation with placeholders of those shapes: a broadcast
or a gather gives them process 0's data, and Orbax writes host arrays and JSON from process 0
alone, so what they pass there only has to have the right structure.

Restoring the checkpoint and building the trainer happen once, before the first operation,
in the same order on every process (run.py), so they need no announcement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging

import jax
import numpy as np

from asyncrl.distributed import group_watch
from asyncrl.distributed.trainer_group import gather, share
from asyncrl.train.checkpoint import Checkpointer, ResumeData
from asyncrl.train.trainer import TrainBatch, Trainer, TrainState

log = logging.getLogger(__name__)

STEP, PARAMS, SAVE, STOP, FAIL = 1, 2, 3, 4, 5
_NAMES = {STEP: "train step", PARAMS: "weight gather", SAVE: "checkpoint save", STOP: "stop",
          FAIL: "stop (process 0 failed)"}


class TrainerGroupError(RuntimeError):
    """A collective of the trainer group failed: a process died or left the group."""


class TrainerGroup:
    """Process 0's side: each method is one collective of the trainer (see the module doc)."""

    def __init__(self, trainer: Trainer, checkpointer: Checkpointer):
        self.trainer, self.checkpointer = trainer, checkpointer
        self.processes = jax.process_count()
        self._broken = False  # a collective failed: the others cannot be told anything more
        self._trained: int | None = None  # the last train step, as the metrics count them

    def step(self, state: TrainState, batch: TrainBatch):
        if self.processes == 1:
            return self.trainer.step(state, self.trainer.put_batch(batch))
        step = int(np.asarray(batch.buffer_version)) + 1  # batch v trains version v into v + 1
        with self._collective(STEP, {"shapes": _shapes(batch)}, f"the train step {step}"):
            out = self.trainer.step(state, self.trainer.put_batch(share(batch, self.trainer.mesh)))
        self._trained = step
        return out

    def host_params(self, state: TrainState):
        """Weights process 0 can hand to its rollouts and evaluator. In a group the arrays
        span every process (not addressable here): they are gathered to host copies."""
        if self.processes == 1:
            return self.trainer.policy_params(state.params)
        with self._collective(PARAMS, {}):
            return gather(self.trainer.policy_params(state.params))

    def save(self, state: TrainState, resume: ResumeData) -> int:
        if self.processes == 1:
            return self.checkpointer.save(state, resume)
        arrays = {k: [list(np.shape(a)), np.asarray(a).dtype.str]
                  for k, a in resume.trajectory_arrays.items()}
        with self._collective(SAVE, {"arrays": arrays}):
            return self.checkpointer.save(state, resume)

    def stop(self, failed: bool = False) -> None:
        """Tells the followers to leave (unless a collective already broke), then closes the
        checkpointer: its async saves finish together on every process. From here on the
        followers' silence is no failure: the watchdog stops."""
        try:
            if self.processes > 1 and not self._broken:
                with self._collective(FAIL if failed else STOP, {}):
                    pass
        finally:
            group_watch.stop()
            self.checkpointer.close()

    @contextlib.contextmanager
    def _collective(self, op: int, header: dict, what: str = ""):
        """Announces `op` and runs it (the body), under the watchdog's eye (`what`: the name
        its error gives the operation)."""
        watch = group_watch.current()
        if not what:
            what = f"the {_NAMES[op]} " + (f"after the train step {self._trained}"
                                           if self._trained else "before the first train step")
        doing = watch.doing(what) if watch else contextlib.nullcontext()
        try:
            with doing:
                announce(op, header, self.trainer.mesh)
                yield
        except Exception as error:
            self._broken = True
            raise group_error(op, error) from error


def follow(trainer: Trainer, checkpointer: Checkpointer, state: TrainState) -> None:
    """A process > 0: mirrors process 0's operations until it says stop."""
    try:
        while True:
            op, header = receive(trainer.mesh)
            try:
                if op == STEP:
                    batch = share(_placeholder_batch(header["shapes"], trainer.group_size), trainer.mesh)
                    state, _ = trainer.step(state, trainer.put_batch(batch))
                elif op == PARAMS:
                    gather(trainer.policy_params(state.params))
                elif op == SAVE:
                    arrays = {k: np.zeros(shape, np.dtype(dtype))
                              for k, (shape, dtype) in header["arrays"].items()}
                    checkpointer.save(state, ResumeData(trajectory_arrays=arrays))
                elif op == STOP:
                    return
                elif op == FAIL:
                    raise TrainerGroupError(
                        f"trainer group: process 0 failed (its log says why); process "
                        f"{jax.process_index()} stops with it")
                else:
                    raise TrainerGroupError(f"trainer group: unknown operation {op} from process 0")
            except TrainerGroupError:
                raise
            except Exception as error:
                raise group_error(op, error) from error
    finally:
        checkpointer.close()


def group_error(op: int, error: Exception) -> TrainerGroupError:
    return TrainerGroupError(
        f"trainer group: the {_NAMES.get(op, op)} failed on process {jax.process_index()} of "
        f"{jax.process_count()}: another process of the group probably died or left (its log "
        f"says why); restart every process together, they resume from the last checkpoint. "
        f"Cause: {type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}")


# ---------------------------------------------------------------------------- the announcement
# An op code and a header length, then the header's JSON bytes padded to a power of two: every
# broadcast has one of a few shapes, so each compiles once.


def announce(op: int, header: dict, mesh) -> None:
    payload = json.dumps(header).encode() if header else b""
    share(np.asarray([op, len(payload)], np.int32), mesh)
    if payload:
        buffer = np.zeros(_bucket(len(payload)), np.uint8)
        buffer[:len(payload)] = np.frombuffer(payload, np.uint8)
        share(buffer, mesh)


def receive(mesh) -> tuple[int, dict]:
    op, size = (int(x) for x in share(np.zeros(2, np.int32), mesh))
    if not size:
        return op, {}
    buffer = np.asarray(share(np.zeros(_bucket(size), np.uint8), mesh))
    return op, json.loads(buffer[:size].tobytes().decode())


def _bucket(size: int) -> int:
    return max(256, 1 << (size - 1).bit_length())


def _shapes(batch: TrainBatch) -> dict[str, list]:
    return {f.name: [list(np.shape(getattr(batch, f.name))), np.asarray(getattr(batch, f.name)).dtype.str]
            for f in dataclasses.fields(batch) if f.name != "group_size"}


def _placeholder_batch(shapes: dict[str, list], group_size: int) -> TrainBatch:
    return TrainBatch(**{k: np.zeros(shape, np.dtype(dtype)) for k, (shape, dtype) in shapes.items()},
                      group_size=group_size)
