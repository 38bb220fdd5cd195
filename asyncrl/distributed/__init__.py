"""Many processes and hosts: the Ray driver, the weight transports, the trainer group.

    rollouts.py         RayInstances: the rollouts backend whose instances are Ray actors
    code_version.py     the source fingerprint every actor checks against the driver's
    remote_instance.py  the driver's stand-in for one actor (what the threaded driver drives)
    actor.py            the actor: its own JAX runtime, an Engine and a RolloutInstance
    transport.py        one weight transport interface: device_put, Ray's object store,
                        jax.experimental.transfer; every pull named by version and id
    cluster.py          joining or starting a Ray cluster (loopback-only on one machine)
    gpus.py             each actor's own GPUs; on one GPU VM the job's trainer keeps its own
    trainer_group.py    jax.distributed for a trainer spread over processes and hosts
    trainer_ops.py      the run's trainer collectives: process 0 leads, the others follow
    group_watch.py      the trainer group's heartbeats: process 0 ends a job whose follower
                        went silent, naming it, rather than wait in a collective forever

Import-light on purpose: the config check reads the names below without loading Ray or JAX.
"""

from asyncrl.registry import Registry

BACKENDS = ("local", "ray")  # config.distributed.backend

# A TPU process alone on its host of a multi-host slice, by the chips it owns (its first ones):
# the chip bounds its TPU runtime is told, so that it forms a slice of its own
# (`cluster.tpu_isolation`) rather than wait for the slice's other hosts to join it.
TPU_HOST_CHIP_BOUNDS = {1: "1,1,1", 2: "1,2,1", 4: "2,2,1", 8: "2,4,1"}

# config.distributed.transport -> the backends it serves and where it lives (loaded on use).
TRANSPORTS = Registry("weight transport")
TRANSPORTS.add("device_put", {"backends": ("local",), "class": "DevicePutTransport"})
TRANSPORTS.add("object_store", {"backends": ("ray",), "class": "ObjectStoreTransport"})
TRANSPORTS.add("jax_transfer", {"backends": ("ray",), "class": "JaxTransferTransport"})
TRANSPORTS.add("shards", {"backends": ("ray",), "class": "ShardTransport"})
AUTO_TRANSPORT = {"local": "device_put", "ray": "object_store"}


def transport_name(distributed) -> str:
    """The transport a config's `distributed` section asks for, 'auto' resolved."""
    name = distributed.transport
    return AUTO_TRANSPORT[distributed.backend] if name == "auto" else name
