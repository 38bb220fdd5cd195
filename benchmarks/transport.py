"""The weight transports side by side: bytes/s for one pytree, against an in-process copy.

    python benchmarks/transport.py                  # 512 MiB, ~1 min on a 2-core CPU
    python benchmarks/transport.py --mib=1024 --repeats=5
    python benchmarks/transport.py --receivers=4 --dtype=bfloat16 --transports=object_store,jax_transfer

One pytree of arrays (`--mib` in all, float32 or `--dtype=bfloat16`, what a bf16 run pushes)
goes, per transport, from this process (the trainer's side) to `--receivers` rollout instances
at once (one version staged once, every receiver pulling it, as after a publish), and arrives
on each instance's device:
  device_put    in-process, from device 0 to device 1 (the local backend's pull);
  object_store  host copy + `ray.put` here, `ray.get` (zero-copy) + device_put in a Ray actor;
  jax_transfer  a copy laid out here, pulled by a Ray actor through jax.experimental.transfer.
Each is timed as staging (here) plus the pull (on the receiving side, its own clock; with
several receivers the slowest one's), best of `--repeats`, and compared with a plain
in-process copy of the same bytes (host memcpy, `np.copyto`, best of the repeats). `bytes_per_s`
is one copy of the weights over that time (every receiver got one). Ray runs on a
loopback-only head (one machine). device_put is one receiver whatever `--receivers` says (this
process has one other device to put to).

Where it ran is part of every figure: the JSON names the JAX platform and device kind, and on
a CPU the printed lines say the figures are CPU figures (host memory on both sides, no
interconnect: they say nothing of a GPU's NVLink or a TPU's ICI/DCN).

`--shards=1,2,4` (0: skip) also measures weights served where they live
(asyncrl/distributed/weight_shards.py) against today's gather path, with plain processes on
loopback (benchmarks/shard_node.py): a trainer group of two processes holding a float32 model
of `--shard_rows` x 4096 x 4 values sharded over both, pulled in bfloat16 by that many
receiving processes at once. Shards: each receiver pulls every bucket from the process that
owns it; gather: the group gathers the model to process 0 (a host copy there, on the
trainer's path) and process 0 serves all of it. Per receiver count: seconds until every
receiver holds the version, GB/s per receiver (its own pull) and in aggregate, the seconds
the trainer's thread is blocked per push (shards: staging dispatched, then offered on
request; gather: the gather and the host copy). `uploads_per_version`: how many times a
trainer process offered each of its buckets when three receivers pull down the relay tree
(fanout 2); every offer is pulled (each receiver answers ok only with every bucket checked),
so offers are uploads. CPU figures: loopback sockets, no network between hosts.

The last line is JSON: {"bytes": …, "dtype": …, "receivers": …, "platform": …, "device_kind": …,
"copy_bytes_per_s": …, "transports": {name: {"bytes_per_s": …, "ratio_to_copy": …, "stage_s": …,
"pull_s": …, "receivers": …}}, "shards": {"bytes": …, "receivers": {n: {"shards": {…},
"gather": {…}, "shards_vs_gather": …}}, "uploads_per_version": …, "trainer_blocked_s_per_push":
{"shards": …, "gather": …}}}.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncrl.host_devices import split_cpu_host  # noqa: E402

split_cpu_host(2)  # before JAX: the in-process pull needs a second device
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import ray  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

from asyncrl.cli import exit_on_user_error  # noqa: E402
from asyncrl.distributed.cluster import actor_environment, start_local  # noqa: E402
from asyncrl.distributed.transport import make_receiver, make_sender, pull_watched  # noqa: E402

LEAVES = 8


class Puller:
    """A Ray actor on its own JAX runtime: pulls what a handle names onto its device."""

    def __init__(self, name: str):
        import jax

        self.device = jax.devices()[0]
        self.receiver = make_receiver(name, **({"host": "127.0.0.1"} if name == "jax_transfer" else {}))

    def pull(self, handle) -> float:
        import jax

        shapes = [jax.ShapeDtypeStruct(s, np.dtype(d)) for s, d in handle.avals]
        shardings = [SingleDeviceSharding(self.device)] * len(shapes)
        params, seconds = pull_watched(self.receiver, handle, shardings, shapes, 600.0, "puller")
        del params
        return seconds


def weights(mib: int, dtype: str = "float32") -> list[np.ndarray]:
    kind = np.dtype(dtype)  # bfloat16: registered with NumPy by JAX (ml_dtypes)
    per_leaf = mib * (1 << 20) // LEAVES // kind.itemsize
    rng = np.random.default_rng(0)
    return [rng.standard_normal(per_leaf, dtype=np.float32).astype(kind) for _ in range(LEAVES)]


def copy_seconds(host: list[np.ndarray], repeats: int) -> float:
    out = [np.empty_like(x) for x in host]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for dst, src in zip(out, host):
            np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return best


def in_process(host: list[np.ndarray], repeats: int) -> tuple[float, float]:
    src, dst = jax.devices()[:2]
    params = jax.block_until_ready(jax.device_put(host, SingleDeviceSharding(src)))
    sender, receiver = make_sender("device_put"), make_receiver("device_put")
    shapes = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in host]
    best = (float("inf"), 0.0)
    for version in range(repeats):
        start = time.perf_counter()
        sender.stage(version, params)
        stage_s = time.perf_counter() - start
        got, pull_s = pull_watched(receiver, sender.offer("local"), [SingleDeviceSharding(dst)] * len(host),
                                   shapes, 600.0, "local")
        del got
        best = min(best, (stage_s + pull_s, stage_s), key=lambda x: x[0])
    return best[1], best[0] - best[1]


def remote(name: str, host: list[np.ndarray], repeats: int, receivers: int) -> tuple[float, float]:
    params = jax.block_until_ready(jax.device_put(host, SingleDeviceSharding(jax.devices()[0])))
    sender = make_sender(name, **({"host": "127.0.0.1"} if name == "jax_transfer" else {}))
    actors = [ray.remote(Puller).options(num_cpus=0, runtime_env={
        "env_vars": actor_environment(1, "cpu")}).remote(name) for _ in range(receivers)]
    best = (float("inf"), 0.0)
    try:
        for version in range(repeats):
            start = time.perf_counter()
            sender.stage(version, params)
            stage_s = time.perf_counter() - start
            handles = [sender.offer(f"puller{i}") for i in range(receivers)]
            # Every receiver pulls at once; the version is there when the last one has it.
            pull_s = max(ray.get([a.pull.remote(h) for a, h in zip(actors, handles)], timeout=600))
            best = min(best, (stage_s + pull_s, stage_s), key=lambda x: x[0])
            del handles
    finally:
        for actor in actors:
            ray.kill(actor)
        sender.close()
    return best[1], best[0] - best[1]


def shard_figures(rows: int, counts: list[int], repeats: int) -> dict:
    """The `--shards` figures (module docstring)."""
    import subprocess

    from benchmarks import shard_cluster as sc

    def popen(argv, env, **kwargs):
        return subprocess.Popen(argv, env={**os.environ, **env}, **kwargs)

    loop = "127.0.0.1"
    trainers = sc.start_trainers([popen, popen], ["trainer0", "trainer1"], [loop, loop],
                                 f"{loop}:{sc.free_port()}", f"--rows={rows}")
    receivers = [sc.Node(popen, f"receiver{i}", loop, "rollout")
                 for i in range(max(*counts, 3))]
    nodes = [*trainers, *receivers]
    try:
        layout, version = sc.layout_of(trainers), 0
        figures, blocked = {}, {"shards": float("inf"), "gather": float("inf")}
        for n in counts:
            best = {"shards": None, "gather": None}
            for _ in range(repeats):
                version += 1
                staged = sc.stage(trainers, version)
                blocked["shards"] = min(blocked["shards"], max(s["blocked_s"] for s in staged))
                start = time.perf_counter()
                answers = sc.pull_version(trainers, receivers[:n], layout, version, n,
                                          skip_check=True)
                shards = (time.perf_counter() - start, answers)
                version += 1
                for node in trainers:
                    node.send(cmd="gather", version=version)
                gathered = [node.next() for node in trainers]
                blocked["gather"] = min(blocked["gather"], max(g["blocked_s"] for g in gathered))
                start = time.perf_counter()
                answers = sc.pull_version(trainers, receivers[:n], sc.pickle.loads(
                    sc.base64.b64decode(gathered[0]["layout"])), version, n,
                    gathered[0]["layout"], skip_check=True)
                gather = (time.perf_counter() - start + gathered[0]["blocked_s"], answers)
                for name, result in (("shards", shards), ("gather", gather)):
                    if best[name] is None or result[0] < best[name][0]:
                        best[name] = result
            row = {}
            for name, (seconds, answers) in best.items():
                row[name] = {"seconds": round(seconds, 4),
                             "gb_per_s_per_receiver": round(
                                 layout.nbytes / max(a["seconds"] for a in answers) / 1e9, 3),
                             "gb_per_s_aggregate": round(n * layout.nbytes / seconds / 1e9, 3)}
            row["shards_vs_gather"] = round(best["gather"][0] / best["shards"][0], 3)
            figures[n] = row
        version += 1
        sc.stage(trainers, version)
        sc.pull_version(trainers, receivers[:3], layout, version, 2, skip_check=True)
        uploads = max(trainers[p].ask(cmd="stats")["served"][str(version)]
                      / len(layout.bucket_ids(p)) for p in layout.processes)
    finally:
        for node in nodes:
            node.close()
    return {"bytes": layout.nbytes, "model_bytes": trainers[0].ready["model_bytes"],
            "receivers": figures, "uploads_per_version": uploads,
            "trainer_blocked_s_per_push": {k: round(v, 4) for k, v in blocked.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transports", default="device_put,object_store,jax_transfer")
    parser.add_argument("--receivers", type=int, default=1,
                        help="rollout instances pulling each version at once (Ray transports)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--shards", default="1,2,4",
                        help="receiver counts for the shard figures (0: skip them)")
    parser.add_argument("--shard_rows", type=int, default=4096)
    args = parser.parse_args()
    if args.receivers < 1:
        parser.error(f"--receivers: at least 1, got {args.receivers}")
    host = weights(args.mib, args.dtype)
    nbytes = sum(x.nbytes for x in host)
    copy_s = copy_seconds(host, args.repeats)
    results = {}
    names = args.transports.split(",")
    if "device_put" in names:
        results["device_put"] = in_process(host, args.repeats)
    remote_names = [n for n in names if n != "device_put"]
    if remote_names:
        # Room for one version in flight and the one before it.
        cluster = start_local(num_cpus=2, object_store_mb=max(2 * args.mib + 256, 1024))
        try:
            for name in remote_names:
                results[name] = remote(name, host, args.repeats, args.receivers)
        finally:
            cluster.close()
    device = jax.devices()[0]
    summary = {"bytes": nbytes, "dtype": args.dtype, "receivers": args.receivers,
               "platform": device.platform, "device_kind": device.device_kind,
               "copy_bytes_per_s": round(nbytes / copy_s), "transports": {}}
    where = " (CPU figures: host memory both sides)" if device.platform == "cpu" else ""
    for name, (stage_s, pull_s) in results.items():
        rate = nbytes / (stage_s + pull_s)
        receivers = 1 if name == "device_put" else args.receivers
        summary["transports"][name] = {"bytes_per_s": round(rate), "ratio_to_copy": round(rate * copy_s / nbytes, 4),
                                       "stage_s": round(stage_s, 4), "pull_s": round(pull_s, 4),
                                       "receivers": receivers}
        print(f"{name:13s} {rate / 1e9:6.2f} GB/s to {receivers} receiver(s){where}  ({stage_s:.3f} s "
              f"staging + {pull_s:.3f} s pull; copy {nbytes / copy_s / 1e9:.2f} GB/s)")
    counts = [int(n) for n in args.shards.split(",") if int(n) > 0]
    if counts:
        shards = summary["shards"] = shard_figures(args.shard_rows, counts, args.repeats)
        print(f"served where they live, {shards['bytes'] / 1e6:.0f} MB in bfloat16 from two "
              f"trainer processes{where}:")
        for n, row in shards["receivers"].items():
            print(f"  {n} receiver(s): shards {row['shards']['seconds']:.3f} s "
                  f"({row['shards']['gb_per_s_per_receiver']:.2f} GB/s each, "
                  f"{row['shards']['gb_per_s_aggregate']:.2f} in all), gather "
                  f"{row['gather']['seconds']:.3f} s: {row['shards_vs_gather']:.2f}x")
        blocked = shards["trainer_blocked_s_per_push"]
        print(f"  the trainer's thread blocked per push: shards {blocked['shards']:.4f} s, "
              f"gather {blocked['gather']:.4f} s; uploads per version with 3 receivers down "
              f"the relay tree: {shards['uploads_per_version']:.0f}")
    print(json.dumps(summary))


if __name__ == "__main__":
    exit_on_user_error(main)
