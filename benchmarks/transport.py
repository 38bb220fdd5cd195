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

The last line is JSON: {"bytes": …, "dtype": …, "receivers": …, "platform": …, "device_kind": …,
"copy_bytes_per_s": …, "transports": {name: {"bytes_per_s": …, "ratio_to_copy": …, "stage_s": …,
"pull_s": …, "receivers": …}}}.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--transports", default="device_put,object_store,jax_transfer")
    parser.add_argument("--receivers", type=int, default=1,
                        help="rollout instances pulling each version at once (Ray transports)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
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
    print(json.dumps(summary))


if __name__ == "__main__":
    exit_on_user_error(main)
