"""What the coordinator's policies may see of the rollout instances and of the core.

Policies never touch an engine. They read a snapshot:
  * `InstanceView`: one instance, a frozen row of the cluster (an instance reports an
    `asyncrl.records.InstanceState`; the core folds it into the cluster's arrays);
  * `ClusterView`: all instances as parallel numpy arrays (struct of arrays);
  * `CoreView`: what an admission reads of the core (it decides; only the core acts).

Policies take a `ClusterView`, because a decision at 1,024 instances must cost microseconds:
one vectorised expression over arrays, not 1,024 Python objects per routed request. A live
coordinator builds one with `ClusterView.from_views(views)`; the simulator keeps one and
updates its arrays in place as instances change. Policies must treat it as read-only.
"""

from __future__ import annotations

import dataclasses
from typing import AbstractSet, Protocol, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True, slots=True)
class InstanceView:
    """A snapshot of one rollout instance."""

    id: int  # index of the instance, 0..I-1
    version: int  # weight version it generates with (the one being pulled, while syncing)
    running: int  # trajectories in its decode slots
    queued: int  # trajectories routed to it, waiting for a slot
    kv_tokens: int  # tokens (prompt + generated) held in the KV cache by running trajectories
    num_slots: int  # decode slots: the most trajectories it runs at once
    syncing: bool = False  # pulling weights: it takes work, but decodes none until done
    kv_capacity: float = float("inf")  # KV-cache tokens the engine can hold

    def __post_init__(self):
        for name in ("id", "version", "running", "queued", "kv_tokens", "num_slots"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"InstanceView.{name} must be an int ≥ 0, got {value!r}")
        if self.num_slots < 1:
            raise ValueError(f"InstanceView.num_slots must be ≥ 1, got {self.num_slots}")

    @property
    def load(self) -> int:
        return self.running + self.queued

    @property
    def free(self) -> int:
        return max(0, self.num_slots - self.load)


_FIELDS = ("version", "running", "queued", "kv_tokens", "num_slots", "syncing", "kv_capacity")


@dataclasses.dataclass(slots=True)
class ClusterView:
    """All instances as arrays, index i = instance i. Shapes: [I]."""

    version: np.ndarray  # int64
    running: np.ndarray  # int64
    queued: np.ndarray  # int64
    kv_tokens: np.ndarray  # float64 (estimates may be fractional between decode steps)
    num_slots: np.ndarray  # int64
    syncing: np.ndarray  # bool
    kv_capacity: np.ndarray  # float64; inf: not limited (or not reported)

    @classmethod
    def empty(cls, num_instances: int, num_slots: int) -> "ClusterView":
        if num_instances < 1 or num_slots < 1:
            raise ValueError(
                f"ClusterView: need ≥ 1 instance and ≥ 1 slot, got {num_instances}, {num_slots}"
            )
        zeros = np.zeros(num_instances, dtype=np.int64)
        return cls(
            version=zeros.copy(),
            running=zeros.copy(),
            queued=zeros.copy(),
            kv_tokens=np.zeros(num_instances, dtype=np.float64),
            num_slots=np.full(num_instances, num_slots, dtype=np.int64),
            syncing=np.zeros(num_instances, dtype=bool),
            kv_capacity=np.full(num_instances, np.inf),
        )

    @classmethod
    def from_views(cls, views: Sequence[InstanceView]) -> "ClusterView":
        if not views:
            raise ValueError("ClusterView.from_views: no instances")
        ids = [v.id for v in views]
        if ids != list(range(len(views))):
            raise ValueError(f"ClusterView.from_views: ids must be 0..{len(views) - 1} in order")
        return cls(
            version=np.array([v.version for v in views], dtype=np.int64),
            running=np.array([v.running for v in views], dtype=np.int64),
            queued=np.array([v.queued for v in views], dtype=np.int64),
            kv_tokens=np.array([v.kv_tokens for v in views], dtype=np.float64),
            num_slots=np.array([v.num_slots for v in views], dtype=np.int64),
            syncing=np.array([v.syncing for v in views], dtype=bool),
            kv_capacity=np.array([v.kv_capacity for v in views], dtype=np.float64),
        )

    def __len__(self) -> int:
        return len(self.version)

    @property
    def load(self) -> np.ndarray:
        return self.running + self.queued

    @property
    def free(self) -> np.ndarray:
        return np.maximum(self.num_slots - self.load, 0)

    def view(self, i: int) -> InstanceView:
        return InstanceView(
            id=int(i),
            version=int(self.version[i]),
            running=int(self.running[i]),
            queued=int(self.queued[i]),
            kv_tokens=int(round(self.kv_tokens[i])),
            num_slots=int(self.num_slots[i]),
            syncing=bool(self.syncing[i]),
            kv_capacity=float(self.kv_capacity[i]),
        )

    def copy(self) -> "ClusterView":
        return ClusterView(*(getattr(self, f).copy() for f in _FIELDS))


class CoreView(Protocol):
    """The coordinator core as its admission sees it: facts to read, nothing to call that
    changes the run. An admission's decisions go back to the core as values it applies
    (`asyncrl.coordinator.admission.Abort`, `Recycle`), so the admission needs no core to be
    built or tested, and every change to the run stays in the core's step. The cluster's
    arrays and the dead set are the core's own, updated in place: read them, never write."""

    @property
    def cluster(self) -> ClusterView: ...

    @property
    def dead(self) -> AbstractSet[int]: ...  # failed instances

    @property
    def version(self) -> int: ...  # the next batch the trainer takes

    @property
    def latest_version(self) -> int: ...  # the newest published weights

    @property
    def now(self) -> float: ...  # the driver's clock (s) at the core's current or last step

    @property
    def partial_rollout(self) -> bool: ...  # a weight sync interrupts work, which resumes

    def v_traj(self, entry: int) -> int: ...
