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

On a CPU host every device is host memory of this process, so a copy per device buys
nothing: `place` hands a replicated CPU target the server's own buffers (zero-copy, through
a read-only host view), and every instance reads the one published copy. That is safe for
the reasons above (a published version is never donated, written or deleted; a reader keeps
its buffer alive), and it takes the default SmolLM2 run's weight copies from one per
instance to one per live version (docs/results.md). `shared_bytes` and `copied_bytes` count
what pulls shared and what they copied.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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
        self.shared_bytes = 0  # pulled without a copy (one CPU host): see `place`
        self.copied_bytes = 0

    @property
    def latest_version(self) -> int:
        """Newest pushed version; -1 before the first push."""
        with self._cond:
            return self._latest

    def held_versions(self) -> dict[Any, int]:
        with self._cond:
            return dict(self._held)

    def latest(self) -> tuple[int, PyTree] | None:
        """The newest version and its weights as published: read them, never write, donate
        or delete them (instances decode with these buffers). None before the first push."""
        with self._cond:
            if self._latest < 0:
                return None
            return self._latest, self._versions[self._latest].params

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
            params, shared = place(entry.params, shardings)
            params = jax.block_until_ready(params)
        finally:
            with self._cond:
                entry.readers -= 1
                self._held[instance] = version
                self._free_unread()
        with self._cond:
            self.shared_bytes += shared
            self.copied_bytes += _nbytes(params) - shared
        self.pull_seconds.append(time.perf_counter() - start)
        return version, params

    def _free_unread(self) -> None:
        for version in [v for v, e in self._versions.items() if v != self._latest and e.readers == 0]:
            del self._versions[version]


def place(params: PyTree, shardings: PyTree) -> tuple[PyTree, int]:
    """`params` on `shardings`, and how many of its bytes the result shares with `params`.

    A leaf that lives on CPU devices of this process, whole on each (one device or
    replicated), going to a replicated CPU target in this process, is not copied: each
    target device gets an array over the source's host buffer (XLA:CPU takes an aligned
    host array without copying it; the array keeps the source alive). The result is only
    as immutable as the source: callers pass what nothing writes, donates or deletes (a
    published version, or weights that stay unchanged while the result is in use). Any
    other leaf moves with `jax.device_put`.
    """
    leaves, treedef = jax.tree.flatten(params)
    targets = treedef.flatten_up_to(shardings)
    placed, shared = [], 0
    for x, target in zip(leaves, targets):
        if _host_shareable(x, target):
            view = np.asarray(x.addressable_shards[0].data)
            pieces = [jax.device_put(view, d) for d in target.addressable_devices]
            y = jax.make_array_from_single_device_arrays(x.shape, target, pieces)
            if all(p.unsafe_buffer_pointer() == view.ctypes.data for p in pieces):
                shared += x.nbytes
            placed.append(y)
        else:
            placed.append(jax.device_put(x, target))
    return jax.tree.unflatten(treedef, placed), shared


def _host_shareable(x, target) -> bool:
    if not isinstance(x, jax.Array) or not isinstance(target, jax.sharding.Sharding):
        return False
    devices = x.sharding.device_set | target.device_set
    return (all(d.platform == "cpu" and d.process_index == jax.process_index() for d in devices)
            and x.is_fully_replicated and target.is_fully_replicated
            and not x.is_deleted() and x.size > 0)


def _nbytes(tree: PyTree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))
