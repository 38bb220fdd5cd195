r"""Measures the rollout engine on this machine and fits the coordinator's step-latency model.

  python benchmarks/profile_engine.py --model=tiny \
      --out=asyncrl/profiles/cpu_tiny.json                       # ~1 min on 2 CPU cores
  python benchmarks/profile_engine.py --checkpoint=embedded \
      --out=asyncrl/profiles/cpu_smollm2_135m.json               # ~3 min on 2 CPU cores

Prints the fitted `t = a + b·kv_tokens + max(c, d + e·running)`, its leave-one-out relative
error, and writes a `LatencyModel` JSON (loadable with `LatencyModel.load`) whose `source`
says what was measured: model, device, date, slots and grid.

What a grid point is. The engine has fixed shapes: every step computes all `num_slots` rows
and attends over all `max_len` cache slots of each, whatever is running. So a step's cost is
set by the engine's shape, not by its occupancy, and the grid varies the shape: the point
(r, S) is a real `Engine(num_slots=r, max_len=S)` with all r slots running (one prefilled
prompt inserted as a group of r), timed over a few `generate` + `pop_finished` steps after
warm-up (compile excluded). It is recorded as running = r and kv_tokens = r·S, the cache
tokens that step reads; that is the cost a ragged engine would pay at r sequences of S
tokens. Only a + c is identifiable from step times, so the fit takes a = 0 and c holds both.

Prefill is timed per prompt length P (bucket = P, so no padding) on a one-slot engine of
length --max_len, and `prefill_s_per_token` is the least-squares slope through the origin
(the model has no prefill intercept).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import time

import jax
import numpy as np
from absl import app, flags

from asyncrl.cli import run_main
from asyncrl.config_args import ConfigError
from asyncrl.coordinator.latency import LatencyModel
from asyncrl.model import (
    ModelConfig,
    default_policy_path,
    graphdef_for,
    init_params,
    load_gguf,
    load_hf,
)
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.messages import Trajectory
from asyncrl.rollout.slots import Slots

# Presets are ModelConfig's classmethods; reading them off the class keeps this list in sync.
PRESETS = tuple(sorted(name for name, attr in vars(ModelConfig).items()
                       if isinstance(attr, classmethod) and not name.startswith("from_")))
WARMUP_STEPS = 2  # the first call compiles; the second settles allocator and caches

_MODEL = flags.DEFINE_enum("model", None, PRESETS, "A ModelConfig preset with random weights.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "An HF folder or a .gguf file; 'embedded' is the SmolLM2 GGUF that "
    "asyncrl.model.default_policy_path() finds.")
_NUM_SLOTS = flags.DEFINE_integer("num_slots", 16, "Largest decode batch of the default grid.")
_MAX_LEN = flags.DEFINE_integer("max_len", None, "Longest cache per slot of the default grid, "
                                "and the prefill engine's (default min(256, max_seq_len)).")
_RUNNING = flags.DEFINE_list("running", None, "Decode batch sizes of the grid "
                             "(default 1, num_slots/2, num_slots).")
_LENGTHS = flags.DEFINE_list("lengths", None, "Cache lengths of the grid "
                             "(default max_len/4, max_len/2, max_len).")
_PROMPT_LENGTHS = flags.DEFINE_list("prompt_lengths", None, "Prefill lengths timed "
                                    "(default 16, 32, 64, 128, those below max_len).")
_STEPS = flags.DEFINE_integer("steps", 20, "Timed decode steps per grid point; the median "
                               "counts.")
_OUT = flags.DEFINE_string("out", None, "Where the JSON goes.")
_SEED = flags.DEFINE_integer("seed", 0, "Random weights (presets) and prompts.")


def load_model(model: str | None, checkpoint: str | None, seed: int):
    """(name, config, graphdef, params) of a preset or a checkpoint."""
    if (model is None) == (checkpoint is None):
        raise ConfigError(f"give exactly one of --model (one of {', '.join(PRESETS)}) or "
                          f"--checkpoint; got model={model!r}, checkpoint={checkpoint!r}")
    if model is not None:
        config = getattr(ModelConfig, model)()
        graphdef, params = init_params(config, seed)
        return model, config, graphdef, params
    path = default_policy_path() if checkpoint == "embedded" else checkpoint
    if str(path).endswith(".gguf"):
        config, params, _ = load_gguf(path)
    else:
        config, params, _ = load_hf(path)
    name = os.path.basename(os.path.normpath(str(path))).removesuffix(".gguf")
    return name, config, graphdef_for(config), jax.device_put(params)


class DecodePoint:
    """One grid point: an Engine(num_slots=running, max_len) kept full of running slots."""

    def __init__(self, graphdef, config, params, running: int, max_len: int, seed: int):
        self.params, self.running = params, running
        # A short prompt leaves most of the cache for timed steps before the slots fill up.
        self.prompt_len = max(1, min(8, max_len // 4))
        self.capacity = max_len - self.prompt_len - 1  # decode steps before a slot is full
        if self.capacity <= WARMUP_STEPS:
            raise ConfigError(f"max_len={max_len} leaves {self.capacity} decode steps after a "
                              f"{self.prompt_len}-token prompt; need > {WARMUP_STEPS}")
        self.engine = Engine(graphdef, config, num_slots=running, max_len=max_len,
                             prompt_buckets=(self.prompt_len,), stop_tokens=(),
                             max_new_tokens=max_len, seed=seed)
        self.prompt = np.random.default_rng(seed).integers(3, config.vocab_size, self.prompt_len)
        self._refill()
        self.time_steps(WARMUP_STEPS)  # the first compiles; the second settles the allocator

    def _refill(self) -> None:
        """Fresh state with every slot running one prompt (a group of `running`); untimed."""
        slots = list(range(self.running))
        self.slots, self.state = Slots(self.engine), self.engine.init_decode_state()
        group = [Trajectory(i, self.prompt, self.engine.max_new_tokens) for i in slots]
        self.state = self.slots.start(self.params, self.state, group, slots, version=0)
        jax.block_until_ready(self.state)
        self.left = self.capacity

    def time_steps(self, n: int) -> list[float]:
        """Seconds of each of n decode steps, each with its host half (`pop_finished`)."""
        times = []
        for _ in range(n):
            if self.left == 0:
                self._refill()
            start = time.perf_counter()
            self.state = self.slots.step(self.params, self.state, version=0)
            self.slots.pop_finished()  # the step's host half: one device_get of its tokens
            jax.block_until_ready(self.state)
            times.append(time.perf_counter() - start)
            self.left -= 1
        if len(self.slots.running()) != self.running:
            raise RuntimeError(f"{len(self.slots.running())} of {self.running} slots running")
        return times


def time_decode(points: list[DecodePoint], steps: int, per_round: int = 2) -> list[float]:
    """Median step seconds per point. Points take turns, `per_round` steps at a time, so
    background load on a shared machine falls on all of them alike."""
    times: list[list[float]] = [[] for _ in points]
    while len(times[0]) < steps:
        for point, record in zip(points, times):
            record.extend(point.time_steps(min(per_round, steps - len(record))))
    return [float(np.median(t)) for t in times]


def time_prefill(graphdef, config, params, lengths, max_len: int, seed: int,
                 reps: int = 5) -> list[tuple[int, float]]:
    """(prompt tokens, median seconds of `Engine.prefill`) per length, lengths interleaved."""
    engine = Engine(graphdef, config, num_slots=1, max_len=max_len, prompt_buckets=lengths,
                    stop_tokens=(), seed=seed)
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, config.vocab_size, length) for length in lengths]
    times: list[list[float]] = [[] for _ in lengths]
    for rep in range(1 + reps):  # round 0 compiles each bucket and is not counted
        for prompt, record in zip(prompts, times):
            start = time.perf_counter()
            prefix = engine.prefill(params, prompt, trajectory_ids=[rep])
            jax.block_until_ready((prefix.cache, prefix.tokens))
            if rep:
                record.append(time.perf_counter() - start)
    return [(length, float(np.median(t))) for length, t in zip(lengths, times)]


def leave_one_out(samples: np.ndarray) -> np.ndarray:
    """|predicted / measured - 1| of each point under a fit to all the others."""
    errors = []
    for i in range(len(samples)):
        rest = np.delete(samples, i, axis=0)
        model = LatencyModel.fit(rest)
        running, kv, seconds = samples[i]
        errors.append(abs(model.step_time(running, kv) / seconds - 1))
    return np.asarray(errors)


def _ints(values, default) -> list[int]:
    return sorted({int(v) for v in values}) if values else sorted(set(default))


def profile(model: str | None, checkpoint: str | None, *, num_slots: int, max_len: int | None,
            running=None, lengths=None, prompt_lengths=None, steps: int = 20,
            seed: int = 0, log=print) -> tuple[dict, np.ndarray]:
    """Measures and fits. Returns the JSON dict (LatencyModel.to_dict() plus the profile
    fields `model` and `hardware`) and the leave-one-out relative error of each point."""
    t0 = time.perf_counter()
    name, config, graphdef, params = load_model(model, checkpoint, seed)
    max_len = min(256, config.max_seq_len) if max_len is None else max_len
    running = _ints(running, [1, max(1, num_slots // 2), num_slots])
    lengths = _ints(lengths, [max(16, max_len // 4), max(16, max_len // 2), max_len])
    prompt_lengths = _ints(prompt_lengths, [p for p in (16, 32, 64, 128) if p < max_len])
    if len(running) * len(lengths) < 4:
        raise ConfigError(f"the grid --running={running} x --lengths={lengths} has fewer than "
                          "4 points: too few to fit and hold one out")
    if not prompt_lengths or max(prompt_lengths) >= max_len:
        raise ConfigError(f"--prompt_lengths={prompt_lengths} must be non-empty and below "
                          f"max_len={max_len}")
    log(f"{name}: loaded in {time.perf_counter() - t0:.1f}s; decode grid running={running} x "
        f"max_len={lengths}, prefill lengths {prompt_lengths}")

    grid = [(r, s) for r in running for s in lengths]
    points = [DecodePoint(graphdef, config, params, r, s, seed) for r, s in grid]
    log(f"  {len(points)} engines compiled and warm after {time.perf_counter() - t0:.1f}s")
    samples = []
    for (r, s), seconds in zip(grid, time_decode(points, steps)):
        samples.append((r, r * s, seconds))
        log(f"  decode running={r:4d} max_len={s:5d} kv_tokens={r * s:7d}: "
            f"{seconds * 1e3:8.2f} ms")
    del points  # their decode states
    prefill = time_prefill(graphdef, config, params, prompt_lengths, max_len, seed)
    for length, seconds in prefill:
        log(f"  prefill {length:5d} tokens: {seconds * 1e3:8.2f} ms")

    data = np.asarray(samples, float)
    held_out = leave_one_out(data)
    p_len, p_sec = np.asarray(prefill, float).T
    per_token = float(np.sum(p_len * p_sec) / np.sum(p_len * p_len))
    hardware = _hardware()
    source = (
        f"Measured by python benchmarks/profile_engine.py on {datetime.date.today()} with "
        f"jax {jax.__version__}, {hardware}. Model {name} ({config.param_dtype} weights). "
        f"Decode: a real rollout Engine per grid point (num_slots r in {running}, max_len S "
        f"in {lengths}), all r slots running, the median of {steps} generate+pop_finished "
        f"steps after {WARMUP_STEPS} warm-up steps (compile excluded), points interleaved; "
        f"recorded as running = r, kv_tokens = r*S, the cache the fixed-shape step reads. "
        f"LatencyModel.fit with a = 0 (only a + c is identifiable); leave-one-out relative "
        f"error mean {held_out.mean():.1%}, max {held_out.max():.1%} over {len(data)} points. "
        f"Prefill: Engine.prefill of P-token prompts (bucket = P, max_len {max_len}), P in "
        f"{prompt_lengths}, median of 5, slope through the origin. Per point (running, "
        f"kv_tokens, seconds): {[(int(r), int(k), round(t, 6)) for r, k, t in samples]}.")
    fitted = LatencyModel.fit(data, prefill_s_per_token=per_token,
                              name=f"{name}_{jax.devices()[0].platform}", source=source)
    # `model` and `hardware` are simulator-profile fields (see asyncrl/sim/profile.py), which
    # LatencyModel.load leaves alone.
    out = fitted.to_dict()
    out["model"] = (f"{name}: {config.num_layers} layers, D={config.hidden_dim}, "
                    f"{config.num_heads} query / {config.num_kv_heads} kv heads x "
                    f"{config.head_dim}, vocab {config.vocab_size}")
    out["hardware"] = hardware
    log(f"total {time.perf_counter() - t0:.1f}s")
    return out, held_out


def _hardware() -> str:
    device = jax.devices()[0]
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    return (f"{device.platform} device {device.device_kind!r} (x{jax.device_count()}), host "
            f"{cpu}, {os.cpu_count()} CPU cores visible")


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    if not _OUT.value:
        raise app.UsageError("--out is required")
    result, held_out = profile(
        _MODEL.value, _CHECKPOINT.value, num_slots=_NUM_SLOTS.value, max_len=_MAX_LEN.value,
        running=_RUNNING.value, lengths=_LENGTHS.value, prompt_lengths=_PROMPT_LENGTHS.value,
        steps=_STEPS.value, seed=_SEED.value)
    c = result["step_latency"]
    print(f"fitted: a={c['a']:.4g} s  b={c['b']:.4g} s/kv-token  c={c['c']:.4g} s  "
          f"d={c['d']:.4g} s  e={c['e']:.4g} s/sequence  "
          f"prefill={result['prefill_s_per_token']:.4g} s/token")
    print(f"leave-one-out relative error: mean {held_out.mean():.1%}, "
          f"max {held_out.max():.1%}")
    os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
    with open(_OUT.value, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {_OUT.value}")


if __name__ == "__main__":
    run_main(main)
