"""The records every layer shares, one dataclass per fact: a trajectory's payload, an
instance's state, and the sink an instance's events go to.

They live here, import-light, because their producers and their reader sit in layers that may
not import each other: a rollout instance (live), a simulated one and a Ray actor produce
them; the coordinator core reads them. Adding a reported figure is one field here and the one
line per producer that fills it (`RolloutInstance._refresh_snapshot`, `SimInstance.snapshot`);
the drivers pass the record on untouched.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    import numpy as np


@dataclasses.dataclass
class Trajectory:
    """One trajectory's payload: everything needed to resume it anywhere. The engine holds
    exactly this; the TrajectoryServer's record extends it with what the protocol tracks."""

    trajectory_id: int
    prompt: np.ndarray  # [P] int32
    max_new_tokens: int
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)  # behaviour policy
    policy_logprobs: list[float] = dataclasses.field(default_factory=list)  # temperature 1
    versions: list[int] = dataclasses.field(default_factory=list)  # weight version per token
    finish_reason: str | None = None  # "stop" | "length"; None while running or interrupted

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def copy(self):
        """The same record (of the same class) with its own token lists: safe to read while
        the original keeps growing."""
        return dataclasses.replace(self, tokens=list(self.tokens), logprobs=list(self.logprobs),
                                   policy_logprobs=list(self.policy_logprobs),
                                   versions=list(self.versions))

    @classmethod
    def of(cls, record: "Trajectory") -> "Trajectory":
        """The payload alone of a record that extends it: what an engine is handed, so it
        never holds the protocol's fields."""
        return cls(**{f.name: getattr(record, f.name) for f in dataclasses.fields(cls)})


# kw_only: a record of many ints is built by name, so a new figure cannot shift the others.
@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InstanceState:
    """One rollout instance's state, as it reports it (`snapshot()`, live, remote or
    simulated) and as the coordinator core takes it (an event of `Core.step`)."""

    instance: int
    version: int  # the weights new work is generated with (the one being pulled, while syncing)
    running: int  # trajectories in decode slots
    queued: int  # trajectories routed here, waiting for a slot
    kv_tokens: int  # tokens held in the KV cache by running trajectories
    num_slots: int
    syncing: bool  # a pull is pending or in progress
    alive: bool = True  # False: it failed; a driver reports its failure, not this record
    decode_steps: int = 0  # decode steps run so far: how far running trajectories got
    kv_capacity: int = 0  # KV-cache tokens the engine can hold; 0: not limited (or unknown)
    # Where the time went: a simulator profile of this machine is calibrated from it. The
    # core reads none of these.
    idle_s: float = 0.0  # waiting for work
    decode_s: float = 0.0  # in generate and handing finished trajectories over
    prefill_tokens: int = 0  # prompts and, on resume, prompt + tokens so far
    prefill_s: float = 0.0
    kv_pages_used: int = 0  # a paged cache's pages in use (contiguous: slots holding a row)
    kv_pages: int = 0  # pages in the pool (contiguous: slots)
    preemptions: int = 0  # sequences handed back for want of pages, since start
    # How long the engine call in progress (a prefill or a decode step) has run, once its
    # program is compiled (the first call of each kind is not counted); 0 while none runs.
    # The driver's watchdog fails an instance stuck past rollout.stall_timeout_s.
    stalled_s: float = 0.0

    @classmethod
    def starting(cls, instance: int, num_slots: int) -> "InstanceState":
        """Before its first weights: no version yet, nothing held."""
        return cls(instance=instance, version=-1, running=0, queued=0, kv_tokens=0,
                   num_slots=num_slots, syncing=False)

    @property
    def busy_s(self) -> float:
        return self.decode_s + self.prefill_s


class EventSink(Protocol):
    """What an instance tells the coordinator, each call one core event. Implemented by the
    threaded driver's reporter (a queue put), a Ray actor's `Outbox` (an item its driver's
    stand-in polls, then hands the same reporter) and the simulated `Cluster`, so a live
    instance and a simulated one report alike. Cheap and thread-safe: called from instance
    threads."""

    def finished(self, instance: int, trajectory_ids: Sequence[int]) -> None: ...

    def extracted(self, instance: int, trajectory_ids: Sequence[int]) -> None: ...

    def synced(self, instance: int, version: int) -> None: ...

    def failed(self, instance: int, error: BaseException, rejoining: bool = False) -> None: ...
