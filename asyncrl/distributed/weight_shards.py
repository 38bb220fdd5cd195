"""Weights served where they live: every trainer process serves the shards it owns, in
fixed-size buckets, through `jax.experimental.transfer`; a rollout host pulls each bucket
once, from the process that owns it or from a host that already holds the version (a relay),
checks it, and assembles the weights on its own shardings. No process ever gathers the model.

    layout = plan_layout(policy_leaves, bucket_bytes)   # the same on every trainer process
    holder = ShardHolder(host)                          # one per process that serves weights
    holder.retire()                                     # a trainer process, after a step:
    holder.stage(version, stage_buckets(layout, version, policy_leaves))
    offers = holder.offer(version, layout.bucket_ids(process), requester)  # asked by a puller
    buckets = pull_buckets(holder, [(holder.address, offers)], layout, version, device)
    params = assemble(layout, buckets, shardings)       # the rollout host's layout
    relay.stage(version, buckets)                       # that host now serves v to others

A bucket is one uint8 array on one device: the bytes of the shard pieces it carries, padded
to 4 bytes, then a 16-byte trailer (the version, the bucket's id, a checksum of the content).
A puller checks all three before anything is assembled (`TornWeights` names the bucket and
its holder otherwise), so an instance never switches to weights that are partly another
version's or damaged; relays forward the arrays they received, trailer and all.

Offers are lazy: a holder registers a bucket with its transfer server only when a puller asks
(`offer`), under an id never used before, since jax.experimental.transfer can neither
withdraw an offer nor serve one id twice (a second pull of an id hangs). A puller that gives
up reports its offers `abandoned`; the holder then drains them by pulling them itself (the
only way to make the server drop its reference), under a watchdog. So what a holder keeps is
the versions it staged that someone may still pull: the newest, plus older ones only while
offers of them are out (`staged_bytes`).

Which holder a rollout host pulls from (`parent`): the first `fanout` hosts from the trainer
processes, every other host from a host before it (a `fanout`-ary tree over the hosts in
order), so the trainer serves each version at most `fanout` times however many hosts pull it.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncrl.distributed.watchdog import TransportTimeout, watched

log = logging.getLogger(__name__)

TRAILER_BYTES = 16  # version (2 x uint32), bucket id, checksum
DEFAULT_BUCKET_BYTES = 64 << 20


class TornWeights(ValueError):
    """A bucket that is not what its puller asked for: another version or bucket, or damaged."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """Bytes [lo, hi) of one shard of one leaf (C order), at `offset` in its bucket."""

    leaf: int
    box: tuple[tuple[int, int], ...]  # the shard's (start, stop) per dimension of the leaf
    lo: int
    hi: int
    offset: int


@dataclasses.dataclass(frozen=True)
class Bucket:
    id: int
    process: int  # the trainer process that serves it
    device: int  # the id of the device it is staged on
    nbytes: int  # content; the array is padded to 4 bytes, then the trailer
    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return _pad4(self.nbytes) + TRAILER_BYTES


@dataclasses.dataclass(frozen=True)
class Layout:
    """Which bytes of which shards travel in which bucket: plain data, the same on every
    process that computes it, sent to pullers as it is."""

    leaves: tuple[tuple[tuple[int, ...], str], ...]  # shape, dtype
    buckets: tuple[Bucket, ...]

    def bucket_ids(self, process: int | None = None) -> list[int]:
        return [b.id for b in self.buckets if process is None or b.process == process]

    @property
    def processes(self) -> list[int]:
        return sorted({b.process for b in self.buckets})

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


def _pad4(n: int) -> int:
    return -(-n // 4) * 4


def _box(index: tuple, shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(slice_.indices(dim)[:2] for slice_, dim in zip(index, shape))


def plan_layout(leaves, bucket_bytes: int = DEFAULT_BUCKET_BYTES, dtype=None) -> Layout:
    """Buckets of at most `bucket_bytes` (a larger shard spans several) for `leaves` (arrays
    or ShapeDtypeStructs with shardings), cast to `dtype` (the rollout's; None: as they are)
    as they are staged. Each distinct shard is served once, by the first process (then
    device) holding it, so a replicated leaf travels once, not once a copy."""
    if bucket_bytes < 4:
        raise ValueError(f"bucket_bytes must be at least 4, got {bucket_bytes}")
    pieces: dict[Any, list[tuple[int, tuple, int]]] = {}
    described = []
    for i, leaf in enumerate(leaves):
        shape = tuple(leaf.shape)
        sent = jnp.dtype(dtype or leaf.dtype)
        described.append((shape, sent.name))
        owners: dict[tuple, Any] = {}
        for device, index in leaf.sharding.devices_indices_map(shape).items():
            box = _box(index, shape)
            if box not in owners or (device.process_index, device.id) < (
                    owners[box].process_index, owners[box].id):
                owners[box] = device
        for box, device in owners.items():
            nbytes = math.prod(stop - start for start, stop in box) * sent.itemsize
            pieces.setdefault(device, []).append((i, box, nbytes))
    buckets: list[Bucket] = []
    for device in sorted(pieces, key=lambda d: (d.process_index, d.id)):
        segments, filled = [], 0

        def close():
            nonlocal segments, filled
            if segments:
                buckets.append(Bucket(len(buckets), device.process_index, device.id, filled,
                                      tuple(segments)))
            segments, filled = [], 0

        for leaf, box, nbytes in pieces[device]:
            lo = 0
            while lo < nbytes:
                if filled == bucket_bytes:
                    close()
                hi = min(nbytes, lo + bucket_bytes - filled)
                segments.append(Segment(leaf, box, lo, hi, filled))
                filled += hi - lo
                lo = hi
        close()
    return Layout(tuple(described), tuple(buckets))


# ------------------------------------------------------------------------ device programs


def _as_bytes(x) -> jax.Array:
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    return jax.lax.bitcast_convert_type(x, jnp.uint8).reshape(-1)


def _checksum(content: jax.Array) -> jax.Array:
    """A position-weighted sum of the content's 32-bit words, wrapping: catches changed,
    swapped or shifted bytes (it is no defence against an adversary)."""
    words = jax.lax.bitcast_convert_type(content.reshape(-1, 4), jnp.uint32)
    weights = (jnp.arange(words.shape[0], dtype=jnp.uint32) % jnp.uint32(65521)) + 1
    return jnp.sum(words * weights, dtype=jnp.uint32) ^ jnp.uint32(words.shape[0])


def _with_trailer(content: jax.Array, version, bucket_id: int) -> jax.Array:
    pad = _pad4(content.shape[0]) - content.shape[0]
    content = jnp.pad(content, (0, pad))
    version = jnp.asarray(version, jnp.uint32)  # versions stay below 2^32
    trailer = jnp.stack([version, jnp.uint32(0), jnp.uint32(bucket_id), _checksum(content)])
    return jnp.concatenate([content, jax.lax.bitcast_convert_type(trailer, jnp.uint8).reshape(-1)])


@functools.lru_cache(maxsize=8)
def _stager(layout: Layout, process: int):
    """One jitted program per device of `process`: its shards in, its buckets out."""
    programs = {}
    for device_id in sorted({b.device for b in layout.buckets if b.process == process}):
        mine = [b for b in layout.buckets if b.device == device_id]
        inputs = sorted({(s.leaf, s.box) for b in mine for s in b.segments})
        position = {key: n for n, key in enumerate(inputs)}

        def stage(version, shards, mine=mine, position=position, inputs=inputs):
            # The cast to the rollout's dtype fuses into the copy: no second shard-sized copy.
            flat = [_as_bytes(x.astype(layout.leaves[leaf][1]))
                    for x, (leaf, _) in zip(shards, inputs)]
            return [_with_trailer(jnp.concatenate([flat[position[(s.leaf, s.box)]][s.lo:s.hi]
                                                   for s in b.segments]), version, b.id)
                    for b in mine]

        programs[device_id] = (jax.jit(stage), inputs, [b.id for b in mine])
    return programs


def stage_buckets(layout: Layout, version: int, leaves) -> dict[int, jax.Array]:
    """This process's buckets of `leaves` (the arrays `layout` was planned for), each a new
    array on its device: the trainer may donate or change its own buffers after this."""
    process = jax.process_index()
    devices = {d.id: d for d in jax.local_devices()}
    out: dict[int, jax.Array] = {}
    for device_id, (program, inputs, ids) in _stager(layout, process).items():
        shards = []
        for leaf, box in inputs:
            shape = layout.leaves[leaf][0]
            shard = next(s for s in leaves[leaf].addressable_shards
                         if s.device.id == device_id and _box(s.index, shape) == box)
            shards.append(shard.data)
        with jax.default_device(devices[device_id]):
            out.update(zip(ids, program(np.uint32(version), shards)))
    return out


@functools.lru_cache(maxsize=64)
def _verifier(size: int):
    def check(bucket):
        return bucket[size - TRAILER_BYTES:], _checksum(bucket[:size - TRAILER_BYTES])
    return jax.jit(check)


def verify(bucket: jax.Array, layout: Layout, bucket_id: int, version: int, holder: str) -> None:
    """TornWeights unless `bucket` is bucket `bucket_id` of `version`, undamaged."""
    trailer, computed = jax.device_get(_verifier(bucket.shape[0])(bucket))
    got_version, _, got_id, checksum = np.frombuffer(np.asarray(trailer).tobytes(), np.uint32)
    what = f"bucket {bucket_id} of version {version} from {holder}"
    if (int(got_version), int(got_id)) != (version, bucket_id):
        raise TornWeights(f"{what}: it is bucket {int(got_id)} of version {int(got_version)}")
    if bucket.shape[0] != layout.buckets[bucket_id].size:
        raise TornWeights(f"{what}: {bucket.shape[0]} bytes, expected "
                          f"{layout.buckets[bucket_id].size}")
    if int(checksum) != int(computed):
        raise TornWeights(f"{what}: checksum {int(computed):#010x} of the bytes received, "
                          f"{int(checksum):#010x} sent: damaged in transit")


# ------------------------------------------------------------------------ serving


class ShardHolder:
    """A process's transfer server and the versions it serves (module docstring)."""

    def __init__(self, host: str = "127.0.0.1", drain_timeout_s: float = 60.0):
        from jax.experimental import transfer

        self.server = transfer.start_transfer_server(jax.devices()[0].client, f"{host}:0",
                                                     [f"{host}:0"])
        self.address = self.server.address()
        self.drain_timeout_s = drain_timeout_s
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._versions: dict[int, dict[int, jax.Array]] = {}
        self._out: dict[int, tuple[int, int, str]] = {}  # uuid -> version, bucket, requester
        self._connections: dict[str, Any] = {}
        self.served: dict[int, int] = {}  # version -> buckets offered of it

    @property
    def newest(self) -> int:
        with self._lock:
            return max(self._versions, default=-1)

    def holds(self, version: int) -> bool:
        with self._lock:
            return version in self._versions

    def stage(self, version: int, buckets: dict[int, jax.Array]) -> None:
        """Serves `buckets` of `version` from now on; older versions are kept only while
        offers of them are out."""
        with self._lock:
            self._versions[version] = dict(buckets)
            self._forget_unoffered()

    def _forget_unoffered(self, keep_newest: bool = True) -> None:
        newest = max(self._versions, default=None) if keep_newest else None
        wanted = {v for v, _, _ in self._out.values()}
        for v in [v for v in self._versions if v != newest and v not in wanted]:
            del self._versions[v]

    def retire(self) -> None:
        """Drops every version no offer is out for, the newest too: called before staging the
        next, so that one staged version (not two) sits beside the trainer's own shards. A
        puller asking meanwhile is told None and asks again for the next."""
        with self._lock:
            self._forget_unoffered(keep_newest=False)

    def staged_bytes(self) -> int:
        with self._lock:
            return sum(int(a.nbytes) for bs in self._versions.values() for a in bs.values())

    def offer(self, version: int, bucket_ids, requester: str) -> dict[int, int] | None:
        """Each bucket of `version` under a fresh id, for one pull by `requester`; None when
        this holder does not hold that version (not yet, or no longer)."""
        with self._lock:
            held = self._versions.get(version)
            if held is None:
                return None
            missing = [b for b in bucket_ids if b not in held]
            if missing:
                raise KeyError(f"{self.address} holds version {version} without bucket(s) "
                               f"{missing[:5]}")
            offers = {}
            for b in bucket_ids:
                uuid = next(self._ids)
                self.server.await_pull(uuid, [held[b]])
                self._out[uuid] = (version, b, requester)
                offers[b] = uuid
            self.served[version] = self.served.get(version, 0) + len(offers)
            return offers

    def pulled(self, uuids) -> None:
        """The puller has these: their offers are gone from the transfer server."""
        with self._lock:
            for uuid in uuids:
                self._out.pop(uuid, None)
            if self._versions:
                self._forget_unoffered()

    def connect(self, address: str):
        """A connection to the holder at `address` (made once)."""
        with self._lock:
            if address not in self._connections:
                self._connections[address] = self.server.connect(address)
            return self._connections[address]

    def abandoned(self, uuids) -> None:
        """A puller gave these up: pull them here, which is what drops the server's reference
        (an offer cannot be withdrawn). All at once, waited for `drain_timeout_s` in all: one
        its puller took after all (it died mid-pull) never completes, and is left to its
        daemon thread (logged) without holding up the others."""
        connection = self.connect(self.address)
        with self._lock:
            taken = [(u, self._out[u]) for u in uuids if u in self._out]
            buckets = [self._versions[v][b] for _, (v, b, _) in taken]
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        threads = []
        for (uuid, _), bucket in zip(taken, buckets):
            aval = jax.ShapeDtypeStruct(bucket.shape, bucket.dtype, sharding=sharding)
            threads.append(threading.Thread(
                target=lambda uuid=uuid, aval=aval: jax.block_until_ready(
                    connection.pull(uuid, [aval])),
                daemon=True, name=f"drain offer {uuid}"))
            threads[-1].start()
        deadline = time.monotonic() + self.drain_timeout_s
        for (uuid, _), thread in zip(taken, threads):
            thread.join(max(deadline - time.monotonic(), 0.0))
            if thread.is_alive():
                log.warning("weight shards: offer %d at %s not drained in %.0f s (its puller "
                            "took it after all?)", uuid, self.address, self.drain_timeout_s)
        self.pulled([u for u, _ in taken])

    def close(self) -> None:
        with self._lock:
            self._versions.clear()
            self._connections.clear()


def pull_buckets(holder: ShardHolder, offers: list[tuple[str, dict[int, int]]], layout: Layout,
                 version: int, device, have: dict[int, jax.Array] | None = None,
                 timeout_s: float = 120.0, on_bucket=None) -> dict[int, jax.Array]:
    """Every bucket `offers` names ((address, {bucket: uuid}) per holder), onto `device`
    through `holder`'s transfer server, each checked (`verify`) as it arrives and added to
    `have`. The holders are pulled from at once (a thread each), each one's buckets in turn.
    A holder that fails or goes silent (each bucket waited for at most `timeout_s`) raises
    once the others are done; `have` keeps what arrived, so the rest can be pulled from
    another holder."""
    sharding = jax.sharding.SingleDeviceSharding(device)
    have = {} if have is None else have
    lock, errors = threading.Lock(), []

    def from_holder(address: str, ids: dict[int, int]) -> None:
        try:
            connection = holder.connect(address)
            for bucket_id, uuid in ids.items():
                aval = jax.ShapeDtypeStruct((layout.buckets[bucket_id].size,), jnp.uint8,
                                            sharding=sharding)
                what = f"bucket {bucket_id} of version {version} from {address}"
                bucket = watched(lambda: jax.block_until_ready(connection.pull(uuid, [aval])[0]),
                                 timeout_s, what)
                verify(bucket, layout, bucket_id, version, address)
                with lock:
                    have[bucket_id] = bucket
                    if on_bucket is not None:
                        on_bucket(bucket_id)
        except BaseException as error:  # raised on the caller's thread below
            errors.append(error)

    threads = [threading.Thread(target=from_holder, args=(address, ids), daemon=True,
                                name=f"pull from {address}") for address, ids in offers if ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return have


@functools.lru_cache(maxsize=8)
def _assembler(layout: Layout):
    """One jitted program: every bucket in, the leaves out, on the buckets' device."""
    def assemble(buckets):
        by_id = dict(zip(sorted(b.id for b in layout.buckets), buckets))
        parts: dict[tuple, list] = {}
        for b in layout.buckets:
            for s in b.segments:
                parts.setdefault((s.leaf, s.box), []).append(
                    (s.lo, by_id[b.id][s.offset:s.offset + s.hi - s.lo]))
        leaves = []
        for i, (shape, dtype) in enumerate(layout.leaves):
            dtype = jnp.dtype(dtype)
            leaf = jnp.zeros(shape, dtype)
            for (leaf_id, box), pieces in parts.items():
                if leaf_id != i:
                    continue
                data = jnp.concatenate([p for _, p in sorted(pieces, key=lambda x: x[0])])
                box_shape = tuple(stop - start for start, stop in box)
                if dtype.itemsize > 1:
                    data = data.reshape(*box_shape, dtype.itemsize)
                value = jax.lax.bitcast_convert_type(
                    data.reshape(box_shape) if dtype.itemsize == 1 else data,
                    jnp.uint8 if dtype == jnp.bool_ else dtype)
                if dtype == jnp.bool_:
                    value = value.astype(jnp.bool_)
                leaf = jax.lax.dynamic_update_slice(leaf, value, [start for start, _ in box])
            leaves.append(leaf)
        return leaves

    return jax.jit(assemble)


def assemble(layout: Layout, buckets: dict[int, jax.Array], shardings=None) -> list[jax.Array]:
    """The leaves from every bucket (all on one device), then on `shardings` (one per leaf)
    if given."""
    missing = [b for b in layout.bucket_ids() if b not in buckets]
    if missing:
        raise TornWeights(f"assembling without bucket(s) {missing[:5]} of {len(layout.buckets)}")
    leaves = _assembler(layout)([buckets[b] for b in layout.bucket_ids()])
    return leaves if shardings is None else jax.device_put(leaves, list(shardings))


# ------------------------------------------------------------------------ who pulls from whom


def parent(host: int, fanout: int) -> int | None:
    """The rollout host that `host` pulls from; None: the trainer processes (the first
    `fanout` hosts). A fanout-ary tree over the hosts in order: at most `fanout` children."""
    if fanout < 1:
        raise ValueError(f"fanout must be at least 1, got {fanout}")
    return None if host < fanout else host // fanout - 1


def offers_from_trainer(layout: Layout, holders: dict[int, ShardHolder | Any], version: int,
                        requester: str) -> list[tuple[str, dict[int, int]]] | None:
    """Offers of every bucket from the trainer processes that own them; None while one of
    them has not staged `version` yet. `holders`: process -> its holder (or a handle with
    `address` and `offer`)."""
    offers = []
    for process in layout.processes:
        ids = holders[process].offer(version, layout.bucket_ids(process), requester)
        if ids is None:
            return None
        offers.append((holders[process].address, ids))
    return offers


def wait_for_offers(ask, timeout_s: float, what: str, poll_s: float = 0.01):
    """`ask()` until it is not None, at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (offers := ask()) is None:
        if time.monotonic() > deadline:
            raise TransportTimeout(f"{what}: no holder offered it in {timeout_s:.1f} s")
        time.sleep(poll_s)
    return offers
