"""What crosses between a rollout instance and its driver: plain records, no JAX."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Trajectory:
    """Host record of one trajectory: everything needed to resume it anywhere."""

    trajectory_id: int
    prompt: np.ndarray  # [P] int32
    max_new_tokens: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)  # behaviour
    policy_logprobs: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)  # weight version per token
    finish_reason: str | None = None  # "stop" | "length"; None while running or interrupted

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def copy(self) -> "Trajectory":
        return dataclasses.replace(self, tokens=list(self.tokens), logprobs=list(self.logprobs),
                                   policy_logprobs=list(self.policy_logprobs),
                                   versions=list(self.versions))



class InstanceFailed(RuntimeError):
    """`submit` to an instance whose thread has died: the work was not taken."""


@dataclasses.dataclass
class Work:
    """A group to start (one prefill fanned out into its members) or one trajectory to resume."""

    trajectories: list[Trajectory]  # new members have no tokens; a resume holds one partial

    @property
    def resume(self) -> bool:
        return len(self.trajectories) == 1 and bool(self.trajectories[0].tokens)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """An instance's state for its driver: what the coordinator sees, and where time went."""

    version: int
    running: int
    queued: int
    kv_tokens: int
    num_slots: int
    syncing: bool
    alive: bool
    idle_s: float  # seconds waiting for work
    # Where the busy time went; a simulator profile of this machine is calibrated from it.
    decode_steps: int = 0
    decode_s: float = 0.0  # in generate and handing finished trajectories over
    prefill_tokens: int = 0  # prompts and, on resume, prompt + tokens so far
    prefill_s: float = 0.0
    kv_capacity: int = 0  # KV-cache tokens the engine holds (slots × cache length); 0: unknown
    kv_pages_used: int = 0  # a paged cache's pages in use (contiguous: slots holding a row)
    kv_pages: int = 0  # pages in the pool (contiguous: slots)
    preemptions: int = 0  # sequences handed back for want of pages, since start

    @property
    def busy_s(self) -> float:
        return self.decode_s + self.prefill_s
