"""Train-step throughput and the cost of pushing weights from the trainer mesh to a rollout mesh.

    python benchmarks/train_step.py                 # ~3 min on a 2-core CPU
    python benchmarks/train_step.py --devices 8 --smollm2_batch 8

Measures, side by side in one run:
- trained tokens/s of `Trainer.step` (B·T tokens through forward, backward and AdamW) for
  the tiny config and SmolLM2-135M (random init), FSDP over the trainer half of the devices;
- one weight push: `jax.device_put` of SmolLM2's params from the trainer mesh (FSDP over D)
  to a rollout mesh on the other, disjoint devices (tensor-parallel layout), blocked until
  ready, against a plain copy of the same number of bytes between the same two device sets
  with no change of layout. push_vs_copy is the price of the re-layout; the goal is ≤ 1.2.

The last line printed is JSON: tiny_tok_s, smollm2_tok_s, push_s, copy_s, push_vs_copy.
"""

from __future__ import annotations

import argparse
import os
import sys

# The device count must be set before JAX is imported, so the arguments are parsed first.
_parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
_parser.add_argument("--devices", type=int, default=4, help="CPU devices: half train, half rollout")
_parser.add_argument("--tiny_batch", type=int, default=16)
_parser.add_argument("--smollm2_batch", type=int, default=4)
_parser.add_argument("--seq_len", type=int, default=128)
_parser.add_argument("--repeats", type=int, default=3)
ARGS = _parser.parse_args()
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={ARGS.devices}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asyncrl.cli import exit_on_user_error  # noqa: E402
from asyncrl.model import ModelConfig, ShardingRules, shardings_for  # noqa: E402
from asyncrl.train.losses import LossConfig  # noqa: E402
from asyncrl.train.trainer import TrainBatch, TrainConfig, Trainer, trainer_mesh  # noqa: E402

GROUP = 4


def batch_for(model: ModelConfig, b: int, t: int, seed: int = 0) -> TrainBatch:
    rng = np.random.default_rng(seed)
    mask = np.zeros((b, t), np.float32)
    mask[:, t // 4 :] = 1.0  # a quarter prompt, the rest response
    return TrainBatch(
        tokens=rng.integers(3, model.vocab_size, (b, t)).astype(np.int32),
        positions=np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(),
        loss_mask=mask,
        behaviour_logp=(-np.log(model.vocab_size) + rng.normal(0, 0.1, (b, t))).astype(np.float32),
        token_versions=np.full((b, t), 4, np.int32),
        rewards=rng.integers(0, 2, b).astype(np.float32),
        v_traj=np.full(b, 3, np.int32),
        buffer_version=np.int32(5),
        group_size=GROUP,
    )


def step_tokens_per_s(trainer: Trainer, batch: TrainBatch, repeats: int) -> tuple[float, object]:
    state = trainer.init_state()
    device_batch = trainer.put_batch(batch)
    t0 = time.perf_counter()
    state, metrics = trainer.step(state, device_batch)  # compile + first step
    jax.block_until_ready(metrics)
    print(f"  compile + first step {time.perf_counter() - t0:.1f}s", flush=True)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        state, metrics = trainer.step(state, device_batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    loss = float(metrics["loss"])
    print(f"  step {step_s:.3f}s (median of {repeats}), loss {loss:.4f}", flush=True)
    return batch.tokens.size / step_s, state


def timed_pair(push, copy, repeats: int) -> tuple[float, float]:
    """Median seconds of each, measured alternately (and in alternating order) so that noise
    from a shared machine lands on both alike."""
    times: dict[object, list[float]] = {push: [], copy: []}
    for fn in (push, copy):  # warm-up: the first transfer sets up the copy plan
        jax.tree.map(lambda x: x.delete(), jax.block_until_ready(fn()))
    for i in range(repeats):
        for fn in (push, copy) if i % 2 == 0 else (copy, push):
            t0 = time.perf_counter()
            out = jax.block_until_ready(fn())
            times[fn].append(time.perf_counter() - t0)
            jax.tree.map(lambda x: x.delete(), out)
    return statistics.median(times[push]), statistics.median(times[copy])


def main() -> None:
    devices = jax.devices()
    half = len(devices) // 2
    mesh = trainer_mesh(devices[:half])
    rollout = Mesh(np.asarray(devices[half:]), ("tp",))
    print(f"{len(devices)} devices: trainer fsdp={half}, rollout tp={len(devices) - half}")
    config = TrainConfig(loss=LossConfig(), learning_rate=1e-5, num_microbatches=1)

    print("tiny", flush=True)
    tiny = ModelConfig.tiny()
    tiny_batch = batch_for(tiny, ARGS.tiny_batch, ARGS.seq_len)
    tiny_trainer = Trainer.create(config, tiny, mesh, GROUP)
    tiny_tok_s, _ = step_tokens_per_s(tiny_trainer, tiny_batch, ARGS.repeats)

    print("smollm2-135m", flush=True)
    smol = ModelConfig.smollm2_135m()
    trainer = Trainer.create(config, smol, mesh, GROUP)
    smol_batch = batch_for(smol, ARGS.smollm2_batch, ARGS.seq_len)
    smol_tok_s, state = step_tokens_per_s(trainer, smol_batch, ARGS.repeats)

    print("weight push", flush=True)
    params = trainer.policy_params(state.params)
    targets = shardings_for(params, rollout, ShardingRules.tensor_parallel("tp"))
    nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
    # The same bytes as one flat buffer, split over the trainer devices the same way on both
    # sides: a pure device-to-device copy, no re-layout.
    flat = jax.device_put(jnp.zeros(nbytes // 4, jnp.float32), NamedSharding(mesh, P("fsdp")))
    flat_target = NamedSharding(rollout, P("tp"))
    push_s, copy_s = timed_pair(
        lambda: jax.device_put(params, targets),
        lambda: jax.device_put(flat, flat_target),
        3 * ARGS.repeats,
    )
    print(f"  {nbytes / 2**20:.0f} MiB: push {push_s * 1e3:.1f} ms, copy {copy_s * 1e3:.1f} ms")

    print(json.dumps({
        "tiny_tok_s": round(tiny_tok_s, 1),
        "smollm2_tok_s": round(smol_tok_s, 1),
        "push_s": round(push_s, 5),
        "copy_s": round(copy_s, 5),
        "push_vs_copy": round(push_s / copy_s, 3),
    }))


if __name__ == "__main__":
    exit_on_user_error(main)
