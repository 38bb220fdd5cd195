"""A rollout instance in a Ray actor: its own process, JAX runtime, Engine and RolloutInstance.

The RolloutInstance is today's, unchanged; what differs is what it is handed. Its sink and
reporter are one `Outbox`: every token report and every event, in the order they happened,
waits there until the driver's next `poll` takes them all. Its `pull` asks the driver for
weights through the same outbox ("want"), waits for the driver's offer (a `WeightHandle`),
and pulls under the watchdog.

Commands from the driver (`command(seq, name, args)`) may run on any of the actor's threads,
so they carry a sequence number and are applied strictly in its order: a submit is never
overtaken by the drop that follows it. `poll` returns the highest number applied, so the
driver knows which of its commands the snapshot already shows.

The sink cannot ask the TrajectoryServer whether a trajectory may start (the server is in the
driver), so it says yes and reports the start; the driver applies starts and reports to the
server in order and drops here what the server refused.

The process's environment (its device count, the platform, this asyncrl on the path) is set
by the driver before the process starts (`cluster.actor_environment`), so JAX loads as usual.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import threading
import time
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from asyncrl.distributed.code_version import CodeVersionError, check_code_version, code_version
from asyncrl.distributed.transport import make_receiver, pull_watched
from asyncrl.model import ShardingRules, abstract_params, shardings_for
from asyncrl.rollout.engine import Engine, KVOptions
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.rollout.messages import InstanceFailed

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class InstanceSpec:
    """What an actor builds its engine from (plain data: it crosses to the actor)."""

    model_config: Any  # asyncrl.model.ModelConfig
    num_slots: int
    max_len: int
    prompt_bucket: int
    sampling: Any  # asyncrl.rollout.sampling.SamplingParams
    seed: int
    partial_rollout: bool
    devices: int  # devices of the instance's mesh, the first of this process's
    transport: str
    transfer_host: str  # the driver's jax_transfer address; loopback keeps the actor's there too
    pull_timeout_s: float
    kv: Any = None  # asyncrl.rollout.engine.KVOptions; None: contiguous, one step per dispatch
    # The driver's asyncrl fingerprint, taken where the spec is made (in the driver); the
    # actor refuses to start on other code ('': not checked).
    code_version: str = dataclasses.field(default_factory=code_version)


class Outbox:
    """The instance's sink and reporter: each call becomes one item, in order."""

    def __init__(self):
        self._items: list[tuple] = []
        self._ready = threading.Condition()

    def put(self, item: tuple) -> None:
        with self._ready:
            self._items.append(item)
            self._ready.notify_all()

    def take(self, wait_s: float) -> list[tuple]:
        """Everything waiting, once something is (or after wait_s, maybe nothing)."""
        with self._ready:
            if not self._items:
                self._ready.wait(wait_s)
            items, self._items = self._items, []
            return items

    # the sink (asyncrl.rollout.instance.TrajectorySink)
    def try_start(self, trajectory_id, at_step):
        self.put(("start", trajectory_id, at_step))
        return True

    def report(self, trajectory_id, tokens, logprobs, policy_logprobs, versions, finish_reason):
        self.put(("report", trajectory_id, list(tokens), list(logprobs), list(policy_logprobs),
                  list(versions), finish_reason))
        return True

    # the event sink (asyncrl.records.EventSink)
    def finished(self, instance, trajectory_ids):
        self.put(("finished", tuple(trajectory_ids)))

    def extracted(self, instance, trajectory_ids):
        self.put(("extracted", tuple(trajectory_ids)))

    def failed(self, instance, error, rejoining=False):
        # Whether a fresh actor takes over is the driver's stand-in's call, not the actor's.
        self.put(("failed", f"{type(error).__name__}: {error}"))

    def synced(self, instance, version):
        self.put(("synced", version))


def node_address() -> str:
    """This process's node address as Ray knows it (`ray start --node-ip-address`): the one
    the other hosts reach it by."""
    import ray

    return ray.util.get_node_ip_address()


def receiver_host(driver_host: str, node: str) -> str:
    """Where this actor's jax_transfer server listens: on loopback when the driver's is (one
    machine), else on this node's own cluster-facing address. Never the driver's address
    (on another host it cannot be bound: "Cannot assign requested address") and never every
    interface (the transfer servers have no authentication: launch/README.md)."""
    from asyncrl.distributed.cluster import is_loopback

    return driver_host if is_loopback(driver_host) else node


class OfferTimeout(TimeoutError):
    """The driver sent no weights offer in time."""


class InstanceActor:
    """Wrapped with `ray.remote` by the driver (resources and environment are its choice)."""

    def __init__(self, instance_id: int, spec: InstanceSpec):
        self.id, self.spec, self.name = instance_id, spec, f"rollout instance {instance_id}"
        # Other code than the driver's: build nothing; `start` (the driver's first call, whose
        # error reaches it whole, unlike one raised here) raises it.
        self._code_error: CodeVersionError | None = None
        try:
            check_code_version(spec.code_version, self.name, node_address())
        except CodeVersionError as error:
            self._code_error = error
            return
        devices = jax.devices()[:spec.devices]
        if len(devices) < spec.devices:
            raise RuntimeError(f"{self.name}: needs {spec.devices} devices, its process has "
                               f"{len(jax.devices())}: {jax.devices()}")
        mesh = Mesh(np.asarray(devices), ("tp",))
        rules = ShardingRules.replicated()
        graphdef, self.abstract = abstract_params(spec.model_config)
        kv = spec.kv or KVOptions()
        self.shardings = shardings_for(self.abstract, mesh, rules)
        engine = Engine(graphdef, spec.model_config, num_slots=spec.num_slots,
                        max_len=spec.max_len, prompt_buckets=(spec.prompt_bucket,),
                        sampling=spec.sampling, seed=spec.seed, mesh=mesh, rules=rules,
                        **kv.engine_kwargs())
        self.node = node_address()
        receiver_kwargs = {"jax_transfer": {"host": receiver_host(spec.transfer_host, self.node)},
                           "shards": {"host": receiver_host(spec.transfer_host, self.node)},
                           "object_store": {"get_timeout_s": spec.pull_timeout_s}}.get(spec.transport, {})
        self.receiver = make_receiver(spec.transport, **receiver_kwargs)
        self.outbox = Outbox()
        self.instance = RolloutInstance(instance_id, engine, self._pull, self.outbox, self.outbox,
                                        partial_rollout=spec.partial_rollout,
                                        preemption=kv.preemption)
        self._lock = threading.Condition()
        self._applied = 0  # commands are numbered from 1
        self._waiting: dict[int, tuple[str, Any]] = {}  # arrived ahead of their turn
        self._offers: dict[int, Any] = {}  # request -> WeightHandle | None
        self._requests = itertools.count()
        self.devices = [str(d) for d in devices]

    # ---------------------------------------------------------------- the driver's calls

    def start(self) -> dict[str, Any]:
        """Pulls the first weights, then starts the instance's thread."""
        if self._code_error is not None:
            raise self._code_error
        self.instance.start()
        import ray

        return {"pid": os.getpid(), "node": self.node,
                "node_id": ray.get_runtime_context().get_node_id(), "devices": self.devices,
                "version": self.instance.version,
                "transfer_server": self.receiver.address}

    def command(self, seq: int, name: str, args: Any) -> None:
        with self._lock:
            self._waiting[seq] = (name, args)
            while self._applied + 1 in self._waiting:
                name, args = self._waiting.pop(self._applied + 1)
                self._applied += 1  # a command that fails must not hold back the next
                try:
                    self._apply(name, args)
                except InstanceFailed:
                    pass  # the instance already reported its failure through the outbox
                except Exception as error:
                    log.exception("%s: command %d (%s) failed", self.name, self._applied, name)
                    self.outbox.failed(self.id, error)
            self._lock.notify_all()

    def poll(self, wait_s: float) -> tuple[list[tuple], Any, int]:
        """(what happened since the last poll, the snapshot after it, commands applied)."""
        if self._code_error is not None:  # after `start`'s answer, which names the cause
            time.sleep(wait_s)
            raise self._code_error
        items = self.outbox.take(wait_s)
        with self._lock:
            applied = self._applied
        return items, self.instance.snapshot(), applied

    def stop(self) -> None:
        if self._code_error is not None:
            return  # nothing was built
        self.instance.stop()
        self.receiver.close()

    # ---------------------------------------------------------------- inside

    def _apply(self, name: str, args: Any) -> None:
        if name == "submit":
            self.instance.submit(args)
        elif name == "sync":
            self.instance.request_sync()
        elif name == "extract":
            self.instance.request_extract(args)
        elif name == "drop":
            self.instance.request_drop(args)
        elif name == "offer":
            request, handle = args
            self._offers[request] = handle
        else:
            raise ValueError(f"{self.name}: unknown command {name!r}")

    def _pull(self, newer_than: int):
        request = next(self._requests)
        self.outbox.put(("want", request, newer_than))
        timeout = self.spec.pull_timeout_s
        with self._lock:
            if not self._lock.wait_for(lambda: request in self._offers, timeout):
                raise OfferTimeout(f"{self.name}: no weights offer for request {request} "
                                   f"(newer than version {newer_than}) after {timeout:.0f} s")
            handle = self._offers.pop(request)
        if handle is None:
            return None
        params, seconds = pull_watched(self.receiver, handle, self.shardings, self.abstract,
                                       timeout, self.name)
        self.outbox.put(("pulled", handle.version, handle.transfer_id, seconds))
        return handle.version, params
