"""The JAX half of benchmarks/device_check.py: raw figures of one device, laid out colocated.

    python benchmarks/device_kernels.py                # what device_check.py runs first
    python benchmarks/device_kernels.py --scale=tiny   # the tiny config's shapes anywhere

Everything runs on the first device, on the meshes asyncrl.placement gives a colocated run
(trainer and two instances on one device), with the default experiment's model and shapes
(SmolLM2-135M, random weights: speed does not depend on their values) or, `--scale=tiny`
(the default on a CPU), the tiny config's. It measures raw figures only; device_check.py
holds the datasheet peaks and turns these into fractions of them:

- memory: a jitted copy of --copy_mib MiB (bytes read + written per second);
- matmul: chained square matmuls (bf16 on an accelerator, the model's dtype on a CPU);
- decode: the slot engine with every slot running, one host sync per step as a rollout
  instance does, and the bytes each step must read (weights + the live KV cache);
- train: one `Trainer.step` on a batch of the experiment's shape and its model FLOPs;
- push: a ParameterServer push then an instance's pull (weights usable on the instance)
  against a jitted copy of the same bytes, and whether the pull was a reference.

Progress goes to stderr; the last line of stdout is JSON.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from asyncrl.model import ModelConfig, ShardingRules, graphdef_for, shardings_for  # noqa: E402
from asyncrl.placement import place  # noqa: E402
from asyncrl.rollout.engine import Engine  # noqa: E402
from asyncrl.rollout.messages import Trajectory  # noqa: E402
from asyncrl.rollout.slots import Slots  # noqa: E402
from asyncrl.config import resolve  # noqa: E402
from asyncrl.servers.parameters import ParameterServer  # noqa: E402
from asyncrl.train.trainer import TrainBatch, Trainer, cast_floats  # noqa: E402
from experiments.grpo import get_config  # noqa: E402

START = time.perf_counter()


def log(message: str) -> None:
    print(f"[device_kernels {time.perf_counter() - START:6.1f}s] {message}", file=sys.stderr,
          flush=True)


def median_seconds(fn, repeats: int) -> float:
    """Median wall time of `fn()` blocked until ready, after one untimed call (compiles)."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def buffer_pointer(x) -> int:
    return x.addressable_shards[0].data.unsafe_buffer_pointer()


_copy = jax.jit(lambda tree: jax.tree.map(jnp.copy, tree))


def measure_memory(device, mib: int, repeats: int) -> dict:
    flat = jax.device_put(jnp.zeros(mib * 2**20 // 4, jnp.float32), device)
    seconds = median_seconds(lambda: _copy(flat), repeats)
    return {"copy_bytes": flat.nbytes, "copy_s": seconds,
            "copy_gbps": 2 * flat.nbytes / seconds / 1e9}  # read + written


def measure_matmul(device, n: int, dtype, chain: int, repeats: int) -> dict:
    x = jax.device_put(jnp.ones((n, n), dtype), device)
    w = jax.device_put(jnp.full((n, n), 1.0 / n, dtype), device)
    chained = jax.jit(lambda x, w: jax.lax.fori_loop(0, chain, lambda _, y: y @ w, x))
    seconds = median_seconds(lambda: chained(x, w), repeats)
    return {"n": n, "dtype": jnp.dtype(dtype).name, "tflops": 2 * n**3 * chain / seconds / 1e12}


def measure_decode(graphdef, model: ModelConfig, params, mesh, c, slots: int, steps: int) -> dict:
    """Every slot busy for `steps` timed decode steps; none finishes (no stop tokens)."""
    bucket = c.rollout.prompt_bucket
    prompt_len = bucket // 2
    max_len = bucket + max(c.rollout.max_new_tokens, steps + 4)
    engine = Engine(graphdef, model, num_slots=slots, max_len=max_len, prompt_buckets=(bucket,),
                    sampling=c.rollout.sampling(), stop_tokens=(), seed=0,
                    mesh=mesh, rules=ShardingRules.replicated())
    prompt = np.arange(3, 3 + prompt_len, dtype=np.int32) % model.vocab_size
    records, state = Slots(engine), engine.init_decode_state()
    group = [Trajectory(i, prompt, max_len - prompt_len - 1) for i in range(slots)]
    state = records.start(params, state, group, list(range(slots)), version=0)
    warm = 2  # compiles generate and the host sync
    for _ in range(warm):
        state = records.step(params, state, version=0)
        records.pop_finished()
    start = time.perf_counter()
    for _ in range(steps):
        state = records.step(params, state, version=0)
        records.pop_finished()  # the host sync a rollout instance makes every step
    seconds = time.perf_counter() - start
    assert len(records.running()) == slots, "a slot finished during the timed steps"
    # Before step i the cache holds the prompt, the first token and warm + i generated tokens.
    live_tokens = slots * (prompt_len + 1 + warm + (steps - 1) / 2)
    kv_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * \
        jnp.dtype(engine.cache_dtype).itemsize
    return {"slots": slots, "steps": steps, "tok_s": slots * steps / seconds,
            "step_s": seconds / steps, "weight_bytes": nbytes(params),
            "kv_bytes_live": kv_per_token * live_tokens,
            # The engine's attention reads each slot's whole max_len cache, masked.
            "kv_bytes_allocated": kv_per_token * slots * max_len}


def synthetic_batch(model: ModelConfig, rows: int, length: int, group: int) -> TrainBatch:
    rng = np.random.default_rng(0)
    mask = np.zeros((rows, length), np.float32)
    mask[:, length // 2:] = 1.0  # the experiment's prompt bucket is half of max_len
    return TrainBatch(
        tokens=rng.integers(3, model.vocab_size, (rows, length)).astype(np.int32),
        positions=np.broadcast_to(np.arange(length, dtype=np.int32), (rows, length)).copy(),
        loss_mask=mask,
        behaviour_logp=np.full((rows, length), -np.log(model.vocab_size), np.float32),
        token_versions=np.zeros((rows, length), np.int32),
        rewards=rng.integers(0, 2, rows).astype(np.float32),
        v_traj=np.zeros(rows, np.int32), buffer_version=np.int32(0), group_size=group)


def measure_train(model: ModelConfig, mesh, c, repeats: int):
    rows = c.train.batch_size * c.rollout.group_size
    length = c.rollout.max_len
    trainer = Trainer.create(c.train_config(), model, mesh, c.rollout.group_size)
    state = trainer.init_state()
    batch = trainer.put_batch(synthetic_batch(model, rows, length, c.rollout.group_size))
    start = time.perf_counter()
    state, metrics = trainer.step(state, batch)
    jax.block_until_ready(metrics)
    log(f"train step compiled and ran in {time.perf_counter() - start:.1f}s")
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, metrics = trainer.step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    params = sum(x.size for x in jax.tree.leaves(state.params))
    tokens = rows * length  # every position is computed, padding included
    # 6·N per token (forward 2N, backward 4N; the tied table counted once, as the unembedding
    # matmul) plus attention's 12·L·H·Q·T per token (PaLM, appendix B; no causal halving).
    # Remat's recomputed forward is not counted: this is model FLOPs, not hardware FLOPs.
    flops = 6 * params * tokens + 12 * model.num_layers * model.num_heads * model.head_dim * \
        length * tokens
    return state, {"params": params, "rows": rows, "seq_len": length, "tokens": tokens,
                   "step_s": step_s, "tok_s": tokens / step_s, "flops_per_step": flops,
                   "tflops": flops / step_s / 1e12, "remat": c.train.remat,
                   "microbatches": c.train.num_microbatches}


def measure_push(params, trainer_mesh, rollout_meshes, repeats: int) -> dict:
    """Push + pull (the weights usable by an instance) against a copy of the same bytes, and
    a pull alone (another instance pulling what is already published)."""
    server = ParameterServer()
    targets = [shardings_for(params, m, ShardingRules.replicated()) for m in rollout_meshes]
    version = 0

    def publish():
        nonlocal version
        version += 1
        server.push(version, params)
        return server.pull(0, targets[0], newer_than=version - 1)[1]

    flat = jax.device_put(jnp.zeros(nbytes(params) // 4, jnp.float32),
                          jax.sharding.NamedSharding(trainer_mesh, jax.sharding.PartitionSpec()))
    times: dict[str, list[float]] = {"push": [], "copy": [], "pull": []}

    def pull_again():
        # Another instance pulling the version just published: the pull alone.
        start = time.perf_counter()
        jax.block_until_ready(server.pull(f"other{version}", targets[-1])[1])
        times["pull"].append(time.perf_counter() - start)

    fns = {"push": publish, "copy": lambda: _copy(flat)}
    for fn in fns.values():
        jax.block_until_ready(fn())
    for i in range(repeats):
        # Alternating, so load from a shared host lands on both alike.
        for name in ("push", "copy") if i % 2 == 0 else ("copy", "push"):
            start = time.perf_counter()
            jax.block_until_ready(fns[name]())
            times[name].append(time.perf_counter() - start)
        pull_again()
    mine = server.pull("a", targets[0])[1]
    other = server.pull("b", targets[-1])[1]
    leaf = lambda tree: jax.tree.leaves(tree)[0]  # noqa: E731
    reference = buffer_pointer(leaf(mine)) == buffer_pointer(leaf(other)) != \
        buffer_pointer(leaf(params))
    push_s, copy_s = statistics.median(times["push"]), statistics.median(times["copy"])
    return {"bytes": nbytes(params), "push_s": push_s, "copy_s": copy_s,
            "push_vs_copy": push_s / copy_s, "pull_s": statistics.median(times["pull"]),
            "pull_is_reference": bool(reference)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=("auto", "tiny", "default"), default="auto",
                        help="auto: tiny on a CPU, the default experiment on an accelerator")
    parser.add_argument("--slots", default="", help="decode slot counts, e.g. 16,128 "
                        "(default: the config's num_slots, and 8 times it on an accelerator)")
    parser.add_argument("--decode_steps", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--param_dtype", default="", help="default: the config's")
    parser.add_argument("--quick", action="store_true",
                        help="2 repeats, 16 decode steps, only the config's slot count")
    parser.add_argument("--copy_mib", type=int, default=0,
                        help="bytes of the memory-speed copy (default 1024 accelerator, 64 CPU)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.decode_steps = 2, 16

    device = jax.devices()[0]
    accelerator = device.platform != "cpu"
    scale = args.scale if args.scale != "auto" else ("default" if accelerator else "tiny")
    config = get_config("tiny" if scale == "tiny" else None)
    config.model.param_dtype = args.param_dtype or config.model.param_dtype
    c = resolve(config, local_files=False)
    mesh_cfg = ml_collections.ConfigDict({"trainer_devices": 1, "rollout_instances": 2,
                                          "devices_per_instance": 1, "colocate": True})
    trainer_mesh, rollout_meshes = place(mesh_cfg, [device])
    log(f"{device.platform} {device.device_kind!r}, scale {scale}, colocated on device {device.id}")
    out = {"device": {"platform": device.platform, "kind": device.device_kind,
                      "count": jax.device_count(), "scale": scale,
                      "param_dtype": c.model.param_dtype}}

    log("memory copy speed")
    out["memory"] = measure_memory(device, args.copy_mib or (1024 if accelerator else 64),
                                   args.repeats)
    log(f"  {out['memory']['copy_gbps']:.1f} GB/s")
    log("matmul peak")
    out["matmul"] = measure_matmul(device, 8192 if accelerator else 1024,
                                   jnp.bfloat16 if accelerator else c.model.param_dtype,
                                   chain=8 if accelerator else 2, repeats=args.repeats)
    log(f"  {out['matmul']['tflops']:.3f} TFLOP/s ({out['matmul']['dtype']})")

    preset = getattr(ModelConfig, c.model.preset)
    model = preset(param_dtype=c.model.param_dtype)
    log(f"train step: {c.model.preset}, batch {c.train.batch_size}×{c.rollout.group_size}")
    state, out["train"] = measure_train(model, trainer_mesh, c, args.repeats)
    log(f"  {out['train']['step_s']:.3f}s a step, {out['train']['tflops']:.3f} TFLOP/s")

    log("weight push vs copy")
    # What a run pushes: the float32 master weights in the model's dtype.
    policy = cast_floats(state.params, jnp.dtype(model.param_dtype))
    out["push"] = measure_push(policy, trainer_mesh, rollout_meshes, 2 * args.repeats + 1)
    log(f"  push {out['push']['push_s'] * 1e3:.2f} ms, copy {out['push']['copy_s'] * 1e3:.2f} ms")

    # The instances decode with the pulled reference to the server's copy, as in a run.
    server = ParameterServer()
    server.push(0, policy)
    params = server.pull("decode", shardings_for(policy, rollout_meshes[0],
                                                 ShardingRules.replicated()))[1]
    del state, policy  # the optimiser state: the decode check needs only the weights
    slots = [int(s) for s in args.slots.split(",")] if args.slots else \
        [c.rollout.num_slots] + ([8 * c.rollout.num_slots] if accelerator and not args.quick else [])
    out["decode"] = []
    for n in slots:
        log(f"decode: {n} slots, {args.decode_steps} steps")
        out["decode"].append(measure_decode(graphdef_for(model), model, params,
                                            rollout_meshes[0], c, n, args.decode_steps))
        log(f"  {out['decode'][-1]['tok_s']:.1f} tok/s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
