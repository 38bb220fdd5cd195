"""Every collective of a run's trainer, made by every process of the group in one order.

Every process of a run runs the same loop (asyncrl/run/) and reaches the trainer through
one `TrainerGroup`, whose methods are the only operations that touch the trainer's arrays:

    group = TrainerGroup(trainer, checkpointer)
    batch = group.next_batch(fetch)              # process 0's fetch(); None: the loop ends
    state, metrics = group.step(state, batch)
    params = group.host_params(state, step)      # for the rollouts and the evaluator
    if group.agree(flag): ...                    # process 0's flag, on every process
    group.save(state, resume)                    # the Orbax checkpoint
    group.stop()                                 # checkpoints close

One process: these are the plain calls (no broadcast), so a single-process run is what it
was. A trainer group (multi-controller JAX): every process runs the same program on one
global mesh, so each collective must be made by every process, in the same order. Process 0
alone has the rollouts, the data and the schedule: what only it knows (the batch, whether to
checkpoint now, the checkpoint's trajectory arrays) it broadcasts with `multihost_utils`, and
what the others pass in its place is ignored (Orbax writes host arrays and JSON from process 0
alone: theirs only need the right structure). Before each collective process 0 names it (an
op code and a JSON header: the batch's shapes, the checkpoint's arrays) and every other
process checks that it is about to make the same one: a process 0 that failed says so instead
(FAIL), and the others raise rather than wait in a collective it will never join.

Restoring the checkpoint and building the trainer happen once, before the first operation,
in the same order on every process (run.py), so they need no announcement.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from typing import Callable

import jax
import numpy as np

from asyncrl.distributed import group_watch
from asyncrl.distributed.trainer_group import gather_to_lead, share
from asyncrl.train.checkpoint import Checkpointer, ResumeData
from asyncrl.train.trainer import TrainBatch, Trainer, TrainState

log = logging.getLogger(__name__)

BATCH, STEP, PARAMS, AGREE, SAVE, STOP, FAIL = 1, 2, 3, 4, 5, 6, 7
_NAMES = {BATCH: "next batch", STEP: "train step", PARAMS: "weight gather",
          AGREE: "agreement", SAVE: "checkpoint save", STOP: "stop",
          FAIL: "stop (process 0 failed)"}


def shard_settings(distributed, policy_dtype: str) -> dict | None:
    """What `TrainerGroup` needs to serve weights where they live (`distributed`: the run's
    config.distributed), or None when the run moves them otherwise: the address this process
    serves on (the configured transfer host on process 0 or on one machine, else this node's
    address) and the dtype the policy computes in."""
    from asyncrl.distributed import transport_name

    if transport_name(distributed) != "shards":
        return None
    host = distributed.transfer_host
    if jax.process_index() != 0 and host not in ("127.0.0.1", "localhost", "::1"):
        import ray

        host = ray.util.get_node_ip_address()
    return {"host": host, "dtype": policy_dtype, "timeout_s": distributed.pull_timeout_s}


class TrainerGroupError(RuntimeError):
    """A collective of the trainer group failed: a process died or left the group."""


class TrainerGroup:
    """This process's side of each collective of the trainer (see the module doc)."""

    def __init__(self, trainer: Trainer, checkpointer: Checkpointer, shards: dict | None = None):
        """`shards`: serve the weights where they live (distributed.transport = 'shards';
        `shard_settings`) instead of gathering them to process 0."""
        self.trainer, self.checkpointer, self.shards = trainer, checkpointer, shards
        self.processes = jax.process_count()
        self.lead = jax.process_index() == 0
        self._broken = False  # a collective failed: the others cannot be told anything more
        self._trained: int | None = None  # the last train step, as the metrics count them
        self._next: int | None = None  # the step the batch in hand trains

    def next_batch(self, fetch: Callable[[], TrainBatch | None] | None) -> TrainBatch | None:
        """Process 0's `fetch()` (called there alone; the others pass None): the next batch,
        on every process, or None on every process when process 0 ends the loop."""
        if self.processes == 1:
            return fetch()
        batch = fetch() if self.lead else None
        header = None
        if self.lead:  # batch v trains version v into v + 1
            header = ({"end": True} if batch is None else
                      {"shapes": _shapes(batch), "step": int(np.asarray(batch.buffer_version)) + 1})
        with self._collective(BATCH, header) as header:
            if header.get("end"):
                return None
            self._next = header["step"]
            local = batch if self.lead else _placeholder_batch(header["shapes"], self.trainer.group_size)
            return share(local, self.trainer.mesh)

    def step(self, state: TrainState, batch: TrainBatch):
        if self.processes == 1:
            return self.trainer.step(state, self.trainer.put_batch(batch))
        with self._collective(STEP, {}, f"the train step {self._next}"):
            out = self.trainer.step(state, self.trainer.put_batch(batch))
        self._trained = self._next
        return out

    def host_params(self, state: TrainState, version: int):
        """Weights process 0 can hand to its rollouts and evaluator. In a group the arrays
        span every process (not addressable here): every process takes part in gathering
        them, process 0 alone gets host copies, the others None. Served where they live
        (`shards`), every process stages its own shards as `version` and process 0 gets a
        `shard_service.Weights` naming it (no collective, no gather)."""
        if self.shards is not None:
            from asyncrl.distributed import shard_service

            service = shard_service.for_trainer(state.params, **self.shards)
            service.stage(version, state.params)
            return shard_service.Weights(service, version) if self.lead else None
        if self.processes == 1:
            return self.trainer.policy_params(state.params)
        with self._collective(PARAMS, {}):
            return gather_to_lead(self.trainer.policy_params(state.params), self.trainer.mesh)

    def agree(self, flag: bool) -> bool:
        """Process 0's `flag`, on every process (a decision only it can make)."""
        if self.processes == 1:
            return flag
        with self._collective(AGREE, {"flag": bool(flag)} if self.lead else None) as header:
            return bool(header["flag"])

    def save(self, state: TrainState, resume: ResumeData | None) -> int:
        """`resume`: process 0's (the others pass None)."""
        if self.processes == 1:
            return self.checkpointer.save(state, resume)
        header = None
        if self.lead:
            header = {"arrays": {k: [list(np.shape(a)), np.asarray(a).dtype.str]
                                 for k, a in resume.trajectory_arrays.items()}}
        with self._collective(SAVE, header) as header:
            if not self.lead:
                resume = ResumeData(trajectory_arrays={
                    k: np.zeros(shape, np.dtype(dtype)) for k, (shape, dtype) in header["arrays"].items()})
            return self.checkpointer.save(state, resume)

    def stop(self, failed: bool = False) -> None:
        """Process 0 tells the others the run ended (or failed), the others hear it (unless a
        collective already broke), then the checkpointer closes: its async saves finish
        together on every process. From here on silence is no failure: the watchdog stops."""
        try:
            if self.processes > 1 and not self._broken and (self.lead or not failed):
                with self._collective(FAIL if failed else STOP, {}):
                    pass
        finally:
            group_watch.stop()
            self.checkpointer.close()
            if self.shards is not None:
                from asyncrl.distributed import shard_service

                shard_service.close_current()

    @contextlib.contextmanager
    def _collective(self, op: int, header: dict | None, what: str = ""):
        """Process 0 announces `op` with its header; another process receives the
        announcement, checks it is `op` and yields its header. Then the body runs the
        collective, under the watchdog's eye (`what`: the name its error gives it)."""
        watch = group_watch.current()
        if not what:
            what = f"the {_NAMES[op]} " + (f"after the train step {self._trained}"
                                           if self._trained else "before the first train step")
        doing = watch.doing(what) if watch else contextlib.nullcontext()
        try:
            with doing:
                if self.lead:
                    announce(op, header or {}, self.trainer.mesh)
                    yield header or {}
                else:
                    yield self._expect(op)
        except TrainerGroupError:
            self._broken = True
            raise
        except Exception as error:
            self._broken = True
            raise group_error(op, error) from error

    def _expect(self, op: int) -> dict:
        announced, header = receive(self.trainer.mesh)
        if announced == FAIL:
            raise TrainerGroupError(
                f"trainer group: process 0 failed (its log says why); process "
                f"{jax.process_index()} stops with it")
        if announced != op:
            raise TrainerGroupError(
                f"trainer group: process 0 began the {_NAMES.get(announced, announced)} where "
                f"process {jax.process_index()} was at the {_NAMES[op]}: the processes run "
                f"different code or configs (start every process from the same checkout and "
                f"flags)")
        return header


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
    # A field left None (the packing's, when rows are not packed) stays None on every process.
    return {f.name: [list(np.shape(getattr(batch, f.name))), np.asarray(getattr(batch, f.name)).dtype.str]
            for f in dataclasses.fields(batch)
            if f.name != "group_size" and getattr(batch, f.name) is not None}


def _placeholder_batch(shapes: dict[str, list], group_size: int) -> TrainBatch:
    return TrainBatch(**{k: np.zeros(shape, np.dtype(dtype)) for k, (shape, dtype) in shapes.items()},
                      group_size=group_size)
