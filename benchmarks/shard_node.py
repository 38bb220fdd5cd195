"""One process of the weight-shard tests and benchmark (tests/distributed/test_weight_shards.py,
benchmarks/transport.py): a trainer process of a two-process jax.distributed group holding its
shards of a float32 model, or a rollout host that pulls it in bfloat16, checks and relays it.
The driver sends one JSON command per line on stdin; each answer is one line on stdout
starting with `@@ `.

    python benchmarks/shard_node.py trainer --host=IP --coordinator=IP:PORT --process-id=0
    python benchmarks/shard_node.py rollout --host=IP

`gather` (a trainer command) is today's path for comparison: the group gathers the model to
process 0 (asyncrl.distributed.trainer_group.gather_to_lead, a host copy there), which then
serves all of it from one device.

The model is a function of (leaf, flat index, version) that either side computes for any
block of a leaf, so the trainer builds only its own shards (never the whole model) and a
rollout host checks every value it assembled without being sent the answer.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import sys
import threading
import time


def _parse():
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=("trainer", "rollout"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--coordinator", default="")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--rows", type=int, default=4096)  # 4 leaves of rows x 4096 float32
    parser.add_argument("--bucket-mb", type=float, default=16)
    parser.add_argument("--pause-s", type=float, default=0.0)  # between buckets pulled
    parser.add_argument("--timeout-s", type=float, default=30.0)
    # A trainer: serve through asyncrl.distributed.shard_service (process 0 answers for the
    # group, asking the other process through jax.distributed's key-value store).
    parser.add_argument("--service", action="store_true")
    return parser.parse_args()


ARGS = _parse()
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={ARGS.devices}"

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from asyncrl.distributed import weight_shards as ws  # noqa: E402

COLUMNS = 4096
ROLLOUT_DTYPE = "bfloat16"


def shapes(rows: int) -> list[tuple[int, ...]]:
    return [(rows, COLUMNS)] * 4 + [(COLUMNS,)]  # the last one replicated on every device


def values(leaf: int, box, shape, version: int) -> np.ndarray:
    """The float32 master's block `box` of `leaf` at `version`: multiples of 1/16 in
    [-8, 8), exact in bfloat16, so a cast on either side gives the same bits."""
    flat = np.zeros((), np.uint32)  # the models here have fewer than 2^32 values a leaf
    for d, ((start, stop), dim) in enumerate(zip(box, shape)):
        along = np.arange(start, stop, dtype=np.uint32).reshape(
            [-1 if k == d else 1 for k in range(len(shape))])
        flat = flat * np.uint32(dim) + along
    mixed = flat * np.uint32(2654435761) + np.uint32(leaf * 97 + version * 13)  # wraps
    mixed ^= mixed >> np.uint32(15)
    return ((mixed >> np.uint32(8)) & np.uint32(255)).astype(np.float32) / 16 - 8


def say(**answer) -> None:
    sys.stdout.write("@@ " + json.dumps(answer) + "\n")
    sys.stdout.flush()


def local_bytes() -> int:
    """This process's device memory: the buffers of every live array's shards here, each
    counted once (a shard's `data` is another array object on the same buffer)."""
    buffers = {}
    for x in jax.live_arrays():
        for s in x.addressable_shards:
            buffers[(s.device.id, s.data.unsafe_buffer_pointer())] = s.data.nbytes
    return sum(buffers.values())


class Peak:
    """The most `local_bytes` seen, sampled every 5 ms on a thread."""

    def __init__(self):
        self.value = 0
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            self.value = max(self.value, local_bytes())
            time.sleep(0.005)


def trainer() -> None:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(ARGS.coordinator, ARGS.processes, ARGS.process_id,
                               initialization_timeout=120)
    mesh = Mesh(np.asarray(jax.devices()), ("fsdp",))
    specs = [P("fsdp")] * 4 + [P()]
    master = []

    def build(version):
        out = []
        for i, (shape, spec) in enumerate(zip(shapes(ARGS.rows), specs)):
            sharding = NamedSharding(mesh, spec)
            out.append(jax.make_array_from_callback(
                shape, sharding,
                lambda index, i=i, shape=shape: values(i, ws._box(index, shape), shape, version)))
        return out

    master = build(0)
    bucket_bytes = int(ARGS.bucket_mb * 2**20)
    layout = ws.plan_layout(master, bucket_bytes, ROLLOUT_DTYPE)
    service = None
    if ARGS.service:
        from asyncrl.distributed.shard_service import ShardService

        service = ShardService(layout, ARGS.host)
        holder = service.holder
    else:
        holder = ws.ShardHolder(ARGS.host)
    to_policy = jax.jit(lambda leaves: [x.astype(ROLLOUT_DTYPE) for x in leaves])
    peak = Peak()
    shard_bytes = sum(s.data.nbytes for x in master for s in x.addressable_shards)
    say(ready=True, address=holder.address, shard_bytes=shard_bytes,
        layout=base64.b64encode(pickle.dumps(layout)).decode(),
        model_bytes=sum(x.nbytes for x in master))
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] == "stage":
            master = None  # the trainer's step: new weights in place of the old
            master = jax.block_until_ready(build(command["version"]))
            start = time.perf_counter()  # what the trainer's thread waits for
            if service is not None:
                buckets = service.stage(command["version"], master)
            else:
                holder.retire()
                buckets = ws.stage_buckets(layout, command["version"], master)
                holder.stage(command["version"], buckets)
            blocked = time.perf_counter() - start
            jax.block_until_ready(list(buckets.values()))
            say(staged=command["version"], staged_bytes=holder.staged_bytes(), blocked_s=blocked)
        elif command["cmd"] == "gather":
            from asyncrl.distributed.trainer_group import gather_to_lead

            start = time.perf_counter()
            full = gather_to_lead(to_policy(master), mesh)
            blocked = time.perf_counter() - start
            answer = {"blocked_s": blocked}
            if full is not None:  # process 0 serves the whole model from one device
                leaves = jax.device_put(full, jax.local_devices()[0])
                whole = ws.plan_layout(leaves, bucket_bytes)
                holder.retire()
                holder.stage(command["version"],
                             ws.stage_buckets(whole, command["version"], leaves))
                answer["layout"] = base64.b64encode(pickle.dumps(whole)).decode()
            say(**answer)
        elif command["cmd"] == "group_offer":  # process 0, with --service
            offers = service.offers(command["version"], command["requester"])
            say(offers=None if offers is None else [[a, ids] for a, ids in offers])
        elif command["cmd"] == "group_ack":
            service.acknowledge([(a, {int(b): u for b, u in ids.items()})
                                 for a, ids in command["offers"]], command["kind"])
            say(done=True)
        else:
            serve(holder, command, peak)


def serve(holder, command, peak) -> None:
    """The commands every holder answers."""
    if command["cmd"] == "offer":
        say(offers=holder.offer(command["version"], command["buckets"], command["requester"]))
    elif command["cmd"] == "pulled":
        holder.pulled(command["uuids"])
        say(done=True)
    elif command["cmd"] == "abandoned":
        holder.abandoned(command["uuids"])
        say(done=True)
    elif command["cmd"] == "stats":
        say(served={str(k): v for k, v in holder.served.items()}, peak_bytes=peak.value,
            live_bytes=local_bytes(), staged_bytes=holder.staged_bytes())
    else:
        say(error=f"unknown command {command['cmd']!r}")


def check(layout, leaves, version: int) -> None:
    """Every value of every leaf against the model's own function."""
    for i, leaf in enumerate(leaves):
        shape = layout.leaves[i][0]
        want = values(i, tuple((0, d) for d in shape), shape, version).astype(
            ml_dtypes.bfloat16)
        got = np.asarray(leaf)
        if got.dtype != want.dtype or not np.array_equal(got.view(np.uint16),
                                                         want.view(np.uint16)):
            raise AssertionError(f"leaf {i} of version {version} differs from the trainer's")


def rollout() -> None:
    holder = ws.ShardHolder(ARGS.host)
    peak = Peak()
    have: dict[int, dict] = {}  # version -> buckets arrived so far
    layout = None
    say(ready=True, address=holder.address)
    for line in sys.stdin:
        command = json.loads(line)
        if command["cmd"] != "pull":
            serve(holder, command, peak)
            continue
        if command.get("layout"):
            layout = pickle.loads(base64.b64decode(command["layout"]))
        version = command["version"]
        got = have.setdefault(version, {})
        offers = [(address, {int(b): u for b, u in ids.items()})
                  for address, ids in command["offers"]]

        def arrived(bucket_id):
            say(got=bucket_id)
            time.sleep(ARGS.pause_s)

        start = time.perf_counter()
        try:
            ws.pull_buckets(holder, offers, layout, version, jax.devices()[0], got,
                            ARGS.timeout_s, arrived)
        except Exception as error:  # the test reads it and resumes from another holder
            say(ok=False, error=f"{type(error).__name__}: {error}",
                missing=sorted(set(layout.bucket_ids()) - set(got)))
            continue
        seconds = time.perf_counter() - start
        leaves = ws.assemble(layout, got)
        if not command.get("skip_check"):
            check(layout, leaves, version)
        holder.stage(version, got)  # a relay from now on
        del leaves
        have.pop(version)
        say(ok=True, seconds=seconds, nbytes=layout.nbytes)


if __name__ == "__main__":
    trainer() if ARGS.role == "trainer" else rollout()
