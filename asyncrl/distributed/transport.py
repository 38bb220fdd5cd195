"""One weight transport interface, three ways to move weights to a rollout instance.

    sender = make_sender("object_store", layout)          # the trainer's side
    sender.stage(version, params)                          # after each train step
    handle = sender.offer(version, receiver="instance 1")  # one pull: (version, id, payload)
    params = pull_watched(make_receiver("object_store"), handle, shardings, 120.0, "instance 1")

  device_put    in-process: `jax.device_put` onto the instance's mesh (the local backend's way).
  object_store  Ray's object store: the weights go to host memory once per version, each
                instance maps them zero-copy and puts them on its devices; any hardware.
  jax_transfer  `jax.experimental.transfer`: the receiver pulls device buffers straight from
                the sender's transfer server (device to device where the platform has a path;
                on CPU through sockets).
  shards        served where they live (asyncrl/distributed/shard_service.py): every trainer
                process stages its own shards in checked buckets, no gather; the receiver
                pulls each bucket from the process that owns it, through
                jax.experimental.transfer.

Every pull is named by a handle: the version, a transfer id never used twice, and what the
receiver must expect (shapes and dtypes, checked). Arrays therefore never pair up by call
order: `jax.device_put` across processes pairs transfers by the order they are issued, so two
issued in different orders swap silently; here an id names each pull, and a second pull of an
id (which hangs in jax.experimental.transfer) cannot happen because each offer makes a new id.

jax.experimental.transfer has no way to withdraw an offer: arrays offered to an instance
that dies before pulling stay referenced by the sender's transfer server (one version per
such failure). Offers are made only when an instance asks, so nothing else accumulates.

Every pull runs under a watchdog (`pull_watched`): a sender that never sends leaves
jax.experimental.transfer's own timeout unheeded (measured: a 2 s timeout returned after 21 s,
when the sender exited), so the wait is bounded here and the error names version, id and
receiver. The thread left hanging dies with the process, which the driver then replaces.

The sender lays the weights out for the receiver's mesh before they leave (`layout`: the
instance's shardings rebuilt on the sender's devices): the receiver gets the shards it keeps.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from asyncrl.distributed import TRANSPORTS
from asyncrl.distributed.watchdog import TransportTimeout, watched  # noqa: F401 (re-exported)

PyTree = Any


@dataclasses.dataclass(frozen=True)
class WeightHandle:
    """One pull: which weights, under which id, and what arrives (shape, dtype per leaf)."""

    version: int
    transfer_id: str  # unique per offer: f"v{version}/{receiver}/#{n}"
    avals: tuple[tuple[tuple[int, ...], str], ...]
    payload: Any  # transport-specific: the arrays, an ObjectRef, (address, uuid)


class TransportMismatch(ValueError):
    """Weights that arrived (or would arrive) with other shapes or dtypes than expected."""


def _avals(leaves) -> tuple[tuple[tuple[int, ...], str], ...]:
    return tuple((tuple(int(d) for d in x.shape), str(x.dtype)) for x in leaves)


def check_avals(handle: WeightHandle, expected_leaves, receiver: str) -> None:
    """Refuses weights whose leaves differ from the receiver's own model, naming the first."""
    expected = _avals(expected_leaves)
    if len(expected) != len(handle.avals):
        raise TransportMismatch(f"{receiver}: weights {handle.transfer_id} have "
                                f"{len(handle.avals)} arrays, the model has {len(expected)}")
    for i, (got, want) in enumerate(zip(handle.avals, expected)):
        if got != want:
            raise TransportMismatch(f"{receiver}: weights {handle.transfer_id} array {i} is "
                                    f"{got}, the model expects {want}")


# ---------------------------------------------------------------------------- senders


class Sender:
    """The trainer's side: stage the newest weights, offer them once per pull."""

    def __init__(self, layout: PyTree | None = None):
        """`layout`: the instance mesh's shardings rebuilt on this process's devices (None:
        leave the weights where the trainer has them)."""
        self.layout = layout
        self._counter = itertools.count()
        self._lock = threading.Lock()
        self._staged: tuple[int, Any, tuple] | None = None  # version, payload, avals

    @property
    def version(self) -> int:
        with self._lock:
            return -1 if self._staged is None else self._staged[0]

    def stage(self, version: int, params: PyTree) -> None:
        if self.layout is not None:  # an intended transfer: the instance's layout, here
            params = jax.device_put(params, self.layout)
        payload, avals = self._pack(version, jax.tree.leaves(params))
        with self._lock:
            self._staged = (version, payload, avals)

    def offer(self, receiver: str) -> WeightHandle:
        """A handle to the staged weights, under an id of its own."""
        with self._lock:
            if self._staged is None:
                raise LookupError(f"{receiver} asked for weights before any were staged")
            version, payload, avals = self._staged
            transfer_id = f"v{version}/{receiver}/#{next(self._counter)}"
        return WeightHandle(version, transfer_id, avals, self._for_one_pull(payload, transfer_id))

    def _pack(self, version: int, leaves: list) -> tuple[Any, tuple]:
        raise NotImplementedError

    def pulled(self, transfer_id: str) -> None:
        """The receiver has the weights of `transfer_id` (ShardSender acknowledges them)."""

    def _for_one_pull(self, payload: Any, transfer_id: str) -> Any:
        return payload

    def close(self) -> None:
        pass


class ShardSender(Sender):
    """The trainer group's shard service (every process staged the version in its trainer
    step): `stage` records the version, `offer` asks every process for its buckets. Offers
    are acknowledged when the instance reports the pull (`pulled`); a newer request from the
    same receiver gives up the one before it (`abandon`), so nothing stays staged for a
    receiver that died mid-pull."""

    def __init__(self, layout=None, offer_timeout_s: float = 120.0):
        super().__init__(layout)
        self.offer_timeout_s = offer_timeout_s
        self._pending: dict[str, tuple[str, list]] = {}  # transfer id -> receiver, offers

    def stage(self, version: int, params: PyTree) -> None:
        with self._lock:
            self._staged = (version, None, ())

    def offer(self, receiver: str) -> WeightHandle:
        from asyncrl.distributed import shard_service, weight_shards

        service = shard_service.current()
        with self._lock:
            if self._staged is None:
                raise LookupError(f"{receiver} asked for weights before any were staged")
            version = self._staged[0]
            transfer_id = f"v{version}/{receiver}/#{next(self._counter)}"
            stale = [t for t, (r, _) in self._pending.items() if r == receiver]
        for t in stale:
            self.abandon(t)
        offers = weight_shards.wait_for_offers(
            lambda: service.offers(version, receiver), self.offer_timeout_s,
            f"weights version {version} for {receiver}")
        with self._lock:
            self._pending[transfer_id] = (receiver, offers)
        avals = tuple((shape, dtype) for shape, dtype in service.layout.leaves)
        return WeightHandle(version, transfer_id, avals, (service.layout, offers))

    def pulled(self, transfer_id: str) -> None:
        from asyncrl.distributed import shard_service

        with self._lock:
            pending = self._pending.pop(transfer_id, None)
        if pending is not None:
            shard_service.current().acknowledge(pending[1])

    def abandon(self, transfer_id: str) -> None:
        from asyncrl.distributed import shard_service

        with self._lock:
            pending = self._pending.pop(transfer_id, None)
        if pending is not None:
            shard_service.current().acknowledge(pending[1], "abandoned")


class DevicePutSender(Sender):
    """In-process: a copy on the trainer's devices (the train step donates its own)."""

    def __init__(self, layout=None):
        super().__init__(layout)
        self._copy = jax.jit(lambda leaves: [jnp.copy(x) for x in leaves])

    def _pack(self, version, leaves):
        return self._copy(leaves), _avals(leaves)


class ObjectStoreSender(Sender):
    """Host memory, once per version, in Ray's object store; pulls map it zero-copy."""

    def _pack(self, version, leaves):
        import ray

        host = [np.asarray(x) for x in jax.device_get(leaves)]
        return ray.put(host), _avals(host)


class JaxTransferSender(Sender):
    """Device buffers served by this process's jax.experimental.transfer server; each offer
    registers the staged arrays once under a fresh uuid, which exactly one pull consumes."""

    def __init__(self, layout=None, host: str = "127.0.0.1"):
        super().__init__(layout)
        from jax.experimental import transfer

        client = jax.devices()[0].client
        self.server = transfer.start_transfer_server(client, f"{host}:0", [f"{host}:0"])
        self.address = self.server.address()

    def _pack(self, version, leaves):
        # Copies: the train step donates the trainer's buffers, and a layout equal to the
        # trainer's own is no copy at all.
        leaves = jax.block_until_ready([jnp.copy(x) for x in leaves])
        return leaves, _avals(leaves)

    def _for_one_pull(self, payload, transfer_id):
        uuid = int(transfer_id.rsplit("#", 1)[1])
        self.server.await_pull(uuid, payload)
        return self.address, uuid


# ---------------------------------------------------------------------------- receivers


class Receiver:
    """The instance's side: the weights a handle names, on the instance's shardings."""

    address: str | None = None  # where a receiver that serves connections listens

    def receive(self, handle: WeightHandle, shardings: PyTree) -> PyTree:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _unflatten_like(shardings: PyTree, leaves: list) -> PyTree:
    return jax.tree.unflatten(jax.tree.structure(shardings), leaves)


class DevicePutReceiver(Receiver):
    def receive(self, handle, shardings):
        leaves = jax.device_put(handle.payload, jax.tree.leaves(shardings))
        return _unflatten_like(shardings, jax.block_until_ready(leaves))


class ObjectStoreReceiver(Receiver):
    def __init__(self, get_timeout_s: float = 120.0):
        self.get_timeout_s = get_timeout_s

    def receive(self, handle, shardings):
        import ray

        host = ray.get(handle.payload, timeout=self.get_timeout_s)
        leaves = jax.device_put(host, jax.tree.leaves(shardings))
        return _unflatten_like(shardings, jax.block_until_ready(leaves))


class JaxTransferReceiver(Receiver):
    def __init__(self, host: str = "127.0.0.1"):
        from jax.experimental import transfer

        self.server = transfer.start_transfer_server(jax.devices()[0].client, f"{host}:0",
                                                     [f"{host}:0"])
        self.address = self.server.address()
        self._connections: dict[str, Any] = {}

    def receive(self, handle, shardings):
        address, uuid = handle.payload
        if address not in self._connections:
            self._connections[address] = self.server.connect(address)
        flat = jax.tree.leaves(shardings)
        avals = [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=s)
                 for (shape, dtype), s in zip(handle.avals, flat)]
        leaves = self._connections[address].pull(uuid, avals)
        return _unflatten_like(shardings, jax.block_until_ready(leaves))


class ShardReceiver(Receiver):
    """Pulls every bucket a ShardSender's handle offers, checks each, assembles the weights
    on the instance's shardings."""

    def __init__(self, host: str = "127.0.0.1"):
        from asyncrl.distributed.weight_shards import ShardHolder

        self.holder = ShardHolder(host)  # its transfer server, to connect with
        self.address = self.holder.address

    def receive(self, handle, shardings):
        from asyncrl.distributed import weight_shards

        layout, offers = handle.payload
        flat = jax.tree.leaves(shardings)
        device = next(iter(flat[0].device_set))
        got = weight_shards.pull_buckets(self.holder, offers, layout, handle.version, device)
        leaves = weight_shards.assemble(layout, got, flat)
        return _unflatten_like(shardings, jax.block_until_ready(leaves))

    def close(self) -> None:
        self.holder.close()


_CLASSES = {"DevicePutTransport": (DevicePutSender, DevicePutReceiver),
            "ObjectStoreTransport": (ObjectStoreSender, ObjectStoreReceiver),
            "JaxTransferTransport": (JaxTransferSender, JaxTransferReceiver),
            "ShardTransport": (ShardSender, ShardReceiver)}


def make_sender(name: str, layout: PyTree | None = None, **kwargs) -> Sender:
    return _CLASSES[TRANSPORTS.get(name)["class"]][0](layout, **kwargs)


def make_receiver(name: str, **kwargs) -> Receiver:
    return _CLASSES[TRANSPORTS.get(name)["class"]][1](**kwargs)


# ---------------------------------------------------------------------------- the watchdog


def pull_watched(receiver: Receiver, handle: WeightHandle, shardings: PyTree, expected: PyTree,
                 timeout_s: float, receiver_name: str) -> tuple[PyTree, float]:
    """(params, seconds) of one pull under the watchdog. `expected`: the receiver's own model
    (ShapeDtypeStructs), which the handle's arrays must match before anything moves."""
    check_avals(handle, jax.tree.leaves(expected), receiver_name)
    start = time.perf_counter()
    what = (f"pull of weights version {handle.version} (transfer id {handle.transfer_id}) "
            f"by {receiver_name}")
    params = watched(lambda: receiver.receive(handle, shardings), timeout_s, what)
    return params, time.perf_counter() - start
