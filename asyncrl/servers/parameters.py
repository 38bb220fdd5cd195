"""ParameterServer: versioned weights between the trainer mesh and the rollout meshes.

The trainer pushes version v+1 after each step; each rollout instance pulls when its sync
policy says so, with the weights landing on its own mesh through `jax.device_put` (device to
device; JAX stages through host memory only where no direct path exists). Pushes are
exclusive, pulls shared. Only the newest version and versions some pull is still reading are
kept, so memory holds at most a couple of copies however far instances lag.

The pushed params are copied on the trainer's devices: the train step donates its state, so
the trainer's own buffers are overwritten by the next step while instances may still pull.

Colocated (asyncrl/placement.py), an instance's mesh holds the same devices as the trainer's
and, on one device, the same layout. The push is then a same-device copy, still needed for
the reason above; the pull moves nothing: `jax.device_put` onto a sharding with the same
devices and layout (another mesh or axis name over the one device) returns an array over the
server's own buffer, not a copy (tests/servers/test_parameters.py). That reference is safe
because nothing ever donates the server's copy (the engine donates only its decode state and
prefix cache, never params) and nothing deletes it: dropping an old version here only drops
the server's reference, and an instance still decoding with it keeps the buffer alive until
it pulls a newer one. So a colocated device holds the trainer's params, the server's newest
copy and at most one older copy per instance, as the disjoint layout does across devices.
Pulls onto a different layout (several devices, FSDP to replicated) are real transfers.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp

PyTree = Any


@dataclasses.dataclass
class _Version:
    params: PyTree
    readers: int = 0


class ParameterServer:
    def __init__(self, max_latency_records: int = 1024):
        self._versions: dict[int, _Version] = {}
        self._latest = -1
        self._writing = False
        self._cond = threading.Condition()
        self._held: dict[Any, int] = {}  # instance -> version it last pulled
        self.push_seconds: collections.deque[float] = collections.deque(maxlen=max_latency_records)
        self.pull_seconds: collections.deque[float] = collections.deque(maxlen=max_latency_records)
        self._copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))

    @property
    def latest_version(self) -> int:
        """Newest pushed version; -1 before the first push."""
        with self._cond:
            return self._latest

    def held_versions(self) -> dict[Any, int]:
        with self._cond:
            return dict(self._held)

    def stored_versions(self) -> list[int]:
        with self._cond:
            return sorted(self._versions)

    def push(self, version: int, params: PyTree) -> None:
        """Publishes `params` as `version` (must be newer than every earlier push)."""
        start = time.perf_counter()
        with self._cond:
            if version <= self._latest:
                raise ValueError(
                    f"push of version {version}: versions must increase, latest is {self._latest}")
            while self._writing:
                self._cond.wait()
            self._writing = True
        try:
            copy = self._copy(params)
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()
        with self._cond:
            self._versions[version] = _Version(copy)
            self._latest = version
            self._free_unread()
        self.push_seconds.append(time.perf_counter() - start)

    def pull(self, instance: Any, shardings: PyTree, *, newer_than: int = -1
             ) -> tuple[int, PyTree] | None:
        """The newest version placed on `shardings` (the instance's mesh), or None if there is
        none newer than `newer_than`. Blocks until the weights are on the target devices."""
        start = time.perf_counter()
        with self._cond:
            while self._writing:
                self._cond.wait()
            version = self._latest
            if version <= newer_than:
                return None
            entry = self._versions[version]
            entry.readers += 1
        try:
            params = jax.block_until_ready(jax.device_put(entry.params, shardings))
        finally:
            with self._cond:
                entry.readers -= 1
                self._held[instance] = version
                self._free_unread()
        self.pull_seconds.append(time.perf_counter() - start)
        return version, params

    def _free_unread(self) -> None:
        for version in [v for v, e in self._versions.items() if v != self._latest and e.readers == 0]:
            del self._versions[version]
