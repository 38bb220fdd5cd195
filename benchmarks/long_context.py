"""Long responses at 7B: today's train step against the packed splash one, and packing on CPU.

    python benchmarks/long_context.py                    # 15-30 min on a 2-core CPU: 8 compiles
    python benchmarks/long_context.py --caps 4096 --cpu_groups 4   # one cap, a smaller CPU batch
    python benchmarks/long_context.py --model tiny --caps 64 --cpu_groups 2 --cpu_cap 64 --repeats 1
        # the smoke test's (tests/test_benchmarks.py): every path, a tiny model, ~25 s

1. Compiles (libtpu, no TPU): Qwen2.5-7B as experiments/gsm8k.py:qwen2.5-7b trains it (bf16,
   float32 master weights and Adam, full remat, 32 entries x 8 responses, 8 micro-batches),
   on TPU v5p-16 (8 chips, FSDP), compiled on this CPU host by the planner's helpers
   (asyncrl/plan/parts.py), at each response cap (prompt bucket 512):
     before  train.attention = 'dense', train.tokens_per_row = 0: a trajectory per row
             padded to prompt + cap, every layer's [T, T] scores in float32;
     after   train.attention = 'auto' (splash on a TPU), tokens_per_row = prompt + cap: the
             batch packed first-fit decreasing, its row count bucketed to the chips, one
             row per chip per micro-batch.
   HBM per chip is XLA's memory analysis plus the policy copy (as the planner counts it); a
   step the TPU compiler refuses for want of HBM reports the bytes it asked for, `refused`.
   FLOPs are the compiled step's with every loop counted (layers, micro-batches) and splash
   from its block plan (asyncrl/plan/kernel_cost.py; XLA credits a Pallas call with none),
   per useful token (a trajectory's prompt or response token) against 6 N. Compile seconds
   are compiles, not runs: nothing runs on a TPU here.
2. Padding: the share of the step's tokens that are no trajectory's, for one batch drawn
   from the planner's length model (asyncrl/plan/parts.py `trajectory_lengths`: responses
   lognormal about cap / 8, sigma 1; prompts about 256), packed rows counting the empty rows
   bucketing adds (`padding_fraction`, goal <= 5%; `packing_only` without them), and padded
   (`padding_fraction_before`).
3. On this CPU: a tiny model's train step on a long-tailed batch, packed against padded,
   tokens/s of useful tokens after a warm-up, both in this run (goal: packed >= 1.5x today's).

   Also over 20 draws (seeds 0-19), host only (`--padding_only` prints just these):
   `padding_over_draws` {cap: mean, low, high, packing_only_mean, rows_seen}.

The last line is JSON: padding_fraction, padding_fraction_before (at the 16k cap, or the
largest asked for), padding_by_cap, padding_over_draws, hbm_per_chip_gib ({cap: {"before": GiB, "after": GiB}}),
refused, flops_per_useful_token_vs_6n, compile_s, cpu_tok_s, cpu_packed_vs_padded.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from asyncrl.host_devices import split_cpu_host  # noqa: E402

# Before JAX is imported: the step compiles for the TPU's chips, and the CPU part runs on one
# of this host's devices.
split_cpu_host(8)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import json  # noqa: E402
import statistics  # noqa: E402

import numpy as np  # noqa: E402

from asyncrl.cli import exit_on_user_error  # noqa: E402

GIB = 2 ** 30
PREFERRED_CAP = 16384  # the qwen2.5-7b-16k preset's: the headline padding figures


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--caps", type=int, nargs="+", default=[4096, 8192, 16384, 32768],
                        help="response caps (rollout.max_new_tokens) to compile the step at")
    parser.add_argument("--model", choices=("qwen2.5-7b", "tiny"), default="qwen2.5-7b",
                        help="tiny: experiments/grpo.py:tiny's model, for a quick check")
    parser.add_argument("--trainer", default="v5p-16", help="the TPU slice compiled for")
    parser.add_argument("--cpu_groups", type=int, default=8,
                        help="CPU part: groups of 8 trajectories in the batch")
    parser.add_argument("--cpu_cap", type=int, default=512,
                        help="CPU part: response cap (the median is cap / 8, sigma 1)")
    parser.add_argument("--repeats", type=int, default=3, help="CPU part: timed steps")
    parser.add_argument("--padding_only", action="store_true",
                        help="only the padding over 20 draws of the length model (seconds)")
    return parser.parse_args()


def spec_at(args, cap: int, packed: bool, trainer):
    """The run's spec at response cap `cap`: today's step or the packed, splash one."""
    from asyncrl.config import validate, with_overrides
    from experiments import grpo, gsm8k

    c = gsm8k.get_config("qwen2.5-7b") if args.model != "tiny" else grpo.get_config("tiny")
    max_len = c.rollout.prompt_bucket + cap
    overrides = {"rollout.max_new_tokens": cap, "eval.max_new_tokens": cap,
                 "train.attention": "auto" if packed else "dense",
                 "train.tokens_per_row": max_len if packed else 0,
                 # Packed rows run one row per chip per micro-batch, as many as the rows.
                 "train.num_microbatches": 1 if packed else c.train.num_microbatches,
                 "mesh.colocate": False, "mesh.trainer_devices": trainer.chips,
                 "mesh.rollout_instances": 1, "mesh.devices_per_instance": 1}
    if c.rollout.page_size:  # the engine must hold one whole sequence (not compiled here)
        overrides["rollout.num_pages"] = max(c.rollout.num_pages, max_len // c.rollout.page_size)
    return validate(with_overrides(c, overrides), device_count=trainer.chips + 1,
                    local_files=False)


def compiled_steps(args) -> dict:
    """Each cap's step, before and after, compiled for the trainer's chips."""
    from asyncrl.plan import accelerators
    from asyncrl.plan.hbm import model_of, param_count
    from asyncrl.plan.parts import step_layout, train_step_part, trajectory_lengths
    from asyncrl.train.packing import first_fit_decreasing

    trainer = accelerators.parse(args.trainer)
    out = {k: {} for k in ("hbm_per_chip_gib", "refused", "padding_by_cap", "compile_s",
                           "flops_per_useful_token_vs_6n")}
    for cap in args.caps:
        for name, packed in (("before", False), ("after", True)):
            spec = spec_at(args, cap, packed, trainer)
            model = model_of(spec)[0]
            layout = step_layout(spec, trainer.chips, spec.train.num_microbatches)
            start = time.perf_counter()
            part, step = train_step_part(spec, model, trainer, layout)
            seconds = time.perf_counter() - start
            key = str(cap)
            out["hbm_per_chip_gib"].setdefault(key, {})[name] = round(
                part.hbm_bytes_per_device / GIB, 2)
            out["refused"].setdefault(key, {})[name] = step is None
            out["compile_s"].setdefault(key, {})[name] = round(seconds, 1)
            padding = out["padding_by_cap"].setdefault(key, {})
            padding[name] = round(layout.padding_fraction, 4)
            if packed:  # the packer's own share, before bucketing adds rows
                rows = len(first_fit_decreasing(trajectory_lengths(spec), layout.width))
                padding["packing_only"] = round(1 - layout.useful / (rows * layout.width), 4)
            if step is not None:
                flops = part.costs["train_step"]["flops"] * trainer.chips / layout.useful
                out["flops_per_useful_token_vs_6n"].setdefault(key, {})[name] = round(
                    flops / (6 * param_count(model)), 2)
            print(f"cap {cap:>6} {name:<7}{layout.text(trainer.chips)}; "
                  f"{part.hbm_bytes_per_device / GIB:7.2f} GiB per chip of "
                  f"{part.capacity / GIB:.0f}" + (" (refused by the TPU compiler)"
                                                   if step is None else "")
                  + f"; compiled in {seconds:.0f} s", flush=True)
    return out


def _batch(rng, groups: int, group: int, cap: int):
    """Trajectory records of a long-tailed batch: prompts about 16 tokens, responses
    lognormal about cap / 8 (sigma 1, capped), as the planner's length model."""
    from asyncrl.servers.trajectory import TrajectoryRecord

    vocab = 256  # the tiny model's
    records = []
    for g in range(groups):
        prompt = rng.integers(3, vocab, int(np.clip(rng.lognormal(np.log(16), 0.3), 4, 32)))
        for k in range(group):
            n = int(np.clip(np.rint(rng.lognormal(np.log(cap / 8), 1.0)), 1, cap))
            records.append(TrajectoryRecord(
                trajectory_id=g * group + k, prompt=prompt.astype(np.int32), max_new_tokens=cap,
                tokens=rng.integers(3, vocab, n).tolist(),
                logprobs=(-rng.uniform(4.5, 6.5, n)).tolist(), versions=[3] * n,
                entry_id=g, prompt_id=g, reward=float(k % 2)))
    return [records[i:i + group] for i in range(0, len(records), group)]


def cpu_steps(args) -> dict:
    """The tiny model's step, today's (dense, padded), padded with blockwise attention, and
    packed (blockwise, what 'auto' runs on a CPU): useful tokens/s, the median of repeats."""
    import jax

    from asyncrl.model import ModelConfig
    from asyncrl.train.trainer import TrainConfig, Trainer, trainer_mesh

    group, max_len = 8, 32 + args.cpu_cap
    groups = _batch(np.random.default_rng(0), args.cpu_groups, group, args.cpu_cap)
    useful = sum(len(r.prompt) + len(r.tokens) for g in groups for r in g)
    model = ModelConfig.tiny(max_seq_len=max_len)
    mesh = trainer_mesh(jax.devices("cpu")[:1])
    rates, shapes = {}, {}
    for name, attention, row in (("padded_dense", "dense", 0), ("padded", "auto", 0),
                                 ("packed", "auto", max_len)):
        config = TrainConfig(remat="full", attention=attention, tokens_per_row=row)
        trainer = Trainer.create(config, model, mesh, group)
        batch = trainer.put_batch(trainer.host_batch(groups, [1] * len(groups), 3, max_len))
        state = trainer.init_state()
        state, metrics = trainer.step(state, batch)  # the warm-up: compiles
        jax.block_until_ready(metrics)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            state, metrics = trainer.step(state, batch)
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - start)
        rates[name] = useful / statistics.median(times)
        shapes[name] = list(batch.tokens.shape)
        print(f"cpu {name:<13}{shapes[name][0]:>4} rows of {shapes[name][1]} tokens: "
              f"{rates[name]:,.0f} useful tok/s", flush=True)
    return {"cpu_tok_s": {k: round(v) for k, v in rates.items()}, "cpu_rows": shapes,
            "cpu_useful_tokens": useful,
            "cpu_packed_vs_padded": round(rates["packed"] / rates["padded_dense"], 2),
            "cpu_packed_vs_padded_same_attention": round(rates["packed"] / rates["padded"], 2)}


def padding_over_draws(args, draws: int = 20) -> dict:
    """Packed padding at each cap over `draws` batches of the length model (seeds 0 to
    draws - 1), packed and bucketed as the trainer does for the trainer's chips: mean, low,
    high, the packer's own share, and the row counts (compiled shapes) seen. Host only."""
    from asyncrl.plan import accelerators
    from asyncrl.plan.parts import trajectory_lengths
    from asyncrl.train.packing import bucket_rows, first_fit_decreasing

    trainer = accelerators.parse(args.trainer)
    out = {}
    for cap in args.caps:
        spec = spec_at(args, cap, True, trainer)
        width, padding, packing, rows_seen = spec.train.tokens_per_row, [], [], set()
        for seed in range(draws):
            lengths = trajectory_lengths(spec, seed=seed)
            packed = len(first_fit_decreasing(lengths, width))
            rows = bucket_rows(packed, trainer.chips, len(lengths))
            padding.append(1 - lengths.sum() / (rows * width))
            packing.append(1 - lengths.sum() / (packed * width))
            rows_seen.add(rows)
        out[str(cap)] = {"mean": round(float(np.mean(padding)), 4),
                         "low": round(float(min(padding)), 4),
                         "high": round(float(max(padding)), 4),
                         "packing_only_mean": round(float(np.mean(packing)), 4),
                         "rows_seen": sorted(rows_seen)}
        print(f"cap {cap:>6} padding over {draws} draws: mean {np.mean(padding):.1%} "
              f"({min(padding):.1%}-{max(padding):.1%}), packing alone "
              f"{np.mean(packing):.1%}, rows {sorted(rows_seen)}", flush=True)
    return out


def main():
    args = parse_args()
    over_draws = padding_over_draws(args)
    if args.padding_only:
        print(json.dumps({"padding_over_draws": over_draws}))
        return
    figures = compiled_steps(args)
    figures["padding_over_draws"] = over_draws
    headline = str(PREFERRED_CAP if PREFERRED_CAP in args.caps else max(args.caps))
    figures["padding_fraction"] = figures["padding_by_cap"][headline]["after"]
    figures["padding_fraction_before"] = figures["padding_by_cap"][headline]["before"]
    figures.update(cpu_steps(args))
    print(json.dumps(figures))


if __name__ == "__main__":
    exit_on_user_error(main)
