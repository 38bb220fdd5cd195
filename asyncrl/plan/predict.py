"""Predicted times, from what the compiled programs compute and move (asyncrl/plan/parts.py):

    time = max(flops / (peak FLOP/s x flop efficiency), bytes / (HBM bandwidth x bandwidth
           efficiency)) + overhead

per chip, on the datasheet's peaks (asyncrl/plan/accelerators.py), with every efficiency and
overhead a stated assumption (EFFICIENCY, OVERHEADS, NETWORK: value, low, high and where each
comes from). Each time is a `Band`: the value, and the low and high ends that the
assumptions' ends and the byte count's own uncertainty give. `calibrated` is true only where
a measurement on that chip, in the same regime, backs it (MEASUREMENTS): the time is then the
measured efficiency applied to the same measure of work the measurement used.

What is counted:
  train step    the compiled step's FLOPs and bytes per chip (every loop counted), at the
                compiled chip count (another count scales both as 1 / chips);
  decode step   one step of the compiled dispatch, plus the paged decode kernel's own cost
                (TPU or GPU: asyncrl/plan/kernel_cost.py) at the planned rows: every slot
                computes, an empty one reads no page;
  prefill       the compiled prompt-bucket chunk, per token;
  weight sync   the policy's bytes over the network between trainer and rollout.
Bytes: on TPU XLA's count includes the buffers staged through VMEM at each hop; the value
takes them out (bytes - 2 x VMEM writes, an estimate of HBM traffic), the high end keeps
them. GPU programs are compiled for this host's CPU (no XLA:GPU here), which computes bf16
in float32, converting around every op: a bf16 model's GPU bytes are counted on its
float32 program, at the model's width (the value and low end) or at float32 (the high end).
"""

from __future__ import annotations

import dataclasses

from asyncrl.plan.kernel_cost import paged_decode_attention


@dataclasses.dataclass(frozen=True)
class Assumption:
    value: float
    low: float
    high: float
    source: str


@dataclasses.dataclass(frozen=True)
class Band:
    """A predicted time in seconds: its value and the range the assumptions allow."""

    value: float
    low: float
    high: float
    calibrated: bool

    def as_json(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high,
                "calibrated": self.calibrated}

    def text(self, unit: float = 1.0, suffix: str = " s", digits: int = 2) -> str:
        """'1.23 s [0.80-2.10] uncalibrated', in `unit` (1e-3 and ' ms' for milliseconds)."""
        v, lo, hi = (x / unit for x in (self.value, self.low, self.high))
        return (f"{v:.{digits}f}{suffix} [{lo:.{digits}f}-{hi:.{digits}f}] "
                f"{'calibrated' if self.calibrated else 'uncalibrated'}")


_MAXTEXT = ("published: MaxText's MFU on TPU v4 / v5e / v5p, 46-71% for 16B-1T models on "
            "128-7,680 chips (AI-Hypercomputer/maxtext, MaxText/configs/v5e/README.md and "
            "'Runtime Performance Results'; Llama2-70B 57% v4-128, 65% v5p-128, 57% "
            "v5e-256), the high end; a 1.5-8B model on 8-16 chips with full remat, untuned: "
            "the value and low end are guesses")
_H200 = "measured on one H200 (docs/results.md, 'One NVIDIA H200', 2026-12-04)"
# Fractions of the datasheet's dense bf16 FLOP/s and HBM bandwidth a whole step reaches, by
# chip kind and program.
EFFICIENCY: dict[tuple[str, str], dict[str, Assumption]] = {
    **{("tpu", program): {
        "flops": Assumption(0.5, 0.25, 0.7, _MAXTEXT),
        "bandwidth": Assumption(0.6, 0.2, 0.85, "guess: no TPU measured; HBM streaming "
                                                "reaches 0.8-0.9 of the datasheet at best")}
       for program in ("train", "prefill", "decode")},
    **{("gpu", program): {
        "flops": Assumption(0.4, 0.057, 0.81, f"high: the bf16 matmul {_H200}, 0.81; low: "
                                              f"the 135M float32 train step {_H200}, MFU "
                                              f"0.057; value: a guess"),
        "bandwidth": Assumption(0.4, 0.036, 0.57, f"high: a memory copy {_H200}, 0.57; low: "
                                                  f"the 135M decode step {_H200}, 0.036 of "
                                                  f"its roofline; value: a guess")}
       for program in ("train", "prefill", "decode")},
}
OVERHEADS = {
    "train_step": Assumption(0.5, 0.1, 1.0, "guess: the host's batch building, dispatch and "
                                            "logging per train step (the H200 default run: "
                                            "0.86 s per step, 0.061 s of it on device)"),
    "decode_dispatch": Assumption(1e-3, 2e-4, 3e-3, "guess: host dispatch and the read-back "
                                                    "per decode dispatch"),
    "weight_sync": Assumption(1.0, 0.2, 3.0, "guess: pause, swap and resume per weight sync"),
}
NETWORK = {
    "hosts": Assumption(12.5e9, 6e9, 25e9, "guess: a 100 Gb/s NIC per host, trainer to "
                                           "rollout (50-200 Gb/s)"),
    "gpu_peers": Assumption(50e9, 25e9, 300e9, "guess: GPU to GPU inside one machine, PCIe 5 "
                                               "(conservative) to NVLink"),
}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """A step timed on a chip: it backs predictions for that chip, at that dtype and cache
    layout, whose work (the same measure) is within a factor REGIME of what was measured."""

    program: str  # "train" | "decode"
    chip: str  # an accelerators.CHIPS key
    chips: int  # how many of them the measured step ran on (FSDP's collectives are in it)
    param_dtype: str
    paged: bool
    work: tuple[float, ...]  # decode: weight + live KV bytes a step; train: model FLOPs
    seconds: tuple[float, ...]
    source: str

    def efficiencies(self, peak: float) -> list[float]:
        return [w / (peak * s) for w, s in zip(self.work, self.seconds)]


REGIME = 2.0  # how far from the measured work a measurement still backs a prediction
# A calibrated band: the measured points' spread, widened by this constant factor each way,
# the same at any distance (up to REGIME) from the measured work.
CALIBRATED_SPREAD = 1.25
MEASUREMENTS = (
    # SmolLM2-135M, float32, contiguous cache: 16 slots, 581 MB a step, 2.95 ms; 128 slots,
    # 883 MB, 5.09 ms (benchmarks/device_kernels.py; the host sync of every step included).
    Measurement("decode", "H200", 1, "float32", False, (581e6, 883e6), (2.95e-3, 5.09e-3),
                f"decode steps {_H200}"),
    # The default train step: 8 x 4 x 128 tokens, full remat, 2 micro-batches; model FLOPs
    # 6 N tokens + 12 L H Q T tokens = 3.42 TFLOP in 0.0607 s on device.
    Measurement("train", "H200", 1, "float32", False, (3.42e12,), (0.0607,),
                f"the default train step {_H200}"),
)


def backing_measurement(program: str, accelerator, model, *, paged: bool, work: float,
                        chips: int):
    """The measurement that backs a prediction of `program` on `chips` chips of
    `accelerator`'s kind for `model` with this much work (Measurement.work's measure), or
    None."""
    for m in MEASUREMENTS:
        if (m.program == program and m.chip == accelerator.generation and m.chips == chips
                and m.param_dtype == model.param_dtype and m.paged == paged
                and min(m.work) / REGIME <= work <= max(m.work) * REGIME):
            return m
    return None


def _calibrated(m: Measurement, peak: float, work: float, overhead: Assumption) -> Band:
    effs = m.efficiencies(peak)
    value = work / (peak * sum(effs) / len(effs))
    low = work / (peak * max(effs) * CALIBRATED_SPREAD)
    high = work / (peak * min(effs) / CALIBRATED_SPREAD)
    return Band(value + overhead.value, low + overhead.low, high + overhead.high, True)


def roofline(kind: str, program: str, chip, flops: float, bytes_band: tuple[float, float, float],
             overhead: Assumption) -> Band:
    """max(flops / (peak x flop eff), bytes / (bandwidth x bandwidth eff)) + overhead, at the
    assumptions' values and at their ends; bytes_band is (low, value, high)."""
    eff = EFFICIENCY[(kind, program)]
    f, b = eff["flops"], eff["bandwidth"]
    low_b, value_b, high_b = bytes_band

    def time(f_eff, b_eff, moved):
        return max(flops / (chip.bf16_flops_per_s * f_eff), moved / (chip.hbm_bytes_per_s * b_eff))

    return Band(time(f.value, b.value, value_b) + overhead.value,
                time(f.high, b.high, low_b) + overhead.low,
                time(f.low, b.low, high_b) + overhead.high, False)


def bytes_band(cost: dict, kind: str) -> tuple[float, float, float]:
    """(low, value, high) bytes a program moves per chip per call (module docstring)."""
    moved = cost["bytes_accessed"]
    if kind == "tpu":
        hbm = max(moved - 2 * cost["vmem_bytes"], 0.0)
        return hbm, hbm, moved
    return cost["bytes_low"], cost["bytes_low"], moved


@dataclasses.dataclass(frozen=True)
class Predictions:
    train_step: Band
    decode_step: Band
    prefill_per_token: Band
    weight_sync: Band
    sync_bandwidth: float
    # The simulator's step-latency model (asyncrl/coordinator/latency.py) at the values.
    latency: dict[str, float]

    def as_json(self) -> dict:
        return {"train_step_s": self.train_step.as_json(),
                "decode_step_s": self.decode_step.as_json(),
                "prefill_per_token_s": self.prefill_per_token.as_json(),
                "weight_sync_s": self.weight_sync.as_json()}


def model_flops(spec, model, count: float) -> float:
    """The train step's model FLOPs as the H200 measurement counted them: 6 per parameter per
    token plus attention's 12 L H Q T per token (PaLM, appendix B), no remat recompute."""
    length = spec.rollout.prompt_bucket + spec.rollout.max_new_tokens
    tokens = spec.train.batch_size * spec.rollout.group_size * length
    return tokens * (6 * count + 12 * model.num_layers * model.num_heads * model.head_dim
                     * length)


def train_step(spec, model, trainer, count: float) -> Band:
    """The train step on `trainer` (a Part at its chip count)."""
    accelerator, chip = trainer.accelerator, trainer.accelerator.chip
    overhead = OVERHEADS["train_step"]
    work = model_flops(spec, model, count) / accelerator.chips
    measured = backing_measurement("train", accelerator, model, paged=False,
                                   work=work * accelerator.chips, chips=accelerator.chips)
    # The measured step: full remat, dense attention (before issue 45), unpacked rows. Another
    # attention or packing is another program: the measurement does not speak for it.
    same_program = (trainer.layout.remat == "full" and spec.train.attention == "dense"
                    and not spec.train.tokens_per_row)
    if measured is not None and same_program:  # the measured step's remat
        return _calibrated(measured, chip.bf16_flops_per_s, work, overhead)
    cost = trainer.costs["train_step"]
    return roofline(accelerator.kind, "train", chip, cost["flops"],
                    bytes_band(cost, accelerator.kind), overhead)


def decode_step(spec, model, rollout, kernel: str | None, engine, kv_lens: list[int],
                weights: float) -> tuple[Band, dict]:
    """One decode step of an instance with rows of `kv_lens` tokens (every slot), and the
    simulator's latency model at the values. `kernel`: the paged decode kernel the step
    calls (its cost from its block plan), or None."""
    from asyncrl.model.paged import kv_bytes_per_token

    accelerator, chip = rollout.accelerator, rollout.accelerator.chip
    dispatch = OVERHEADS["decode_dispatch"]
    per_step = Assumption(*(getattr(dispatch, k) / engine.decode_steps
                            for k in ("value", "low", "high")), dispatch.source)
    live = weights + sum(kv_lens) * kv_bytes_per_token(model, engine.cache_dtype)
    paged = engine.page_size is not None
    measured = backing_measurement("decode", accelerator, model, paged=paged, work=live,
                                   chips=spec.mesh.devices_per_instance)
    if measured is not None:
        band = _calibrated(measured, chip.hbm_bytes_per_s, live,
                           Assumption(0.0, 0.0, 0.0, "in the measurement"))
        return band, {"a": 0.0, "b": 0.0, "c": band.value, "d": 0.0, "e": 0.0}
    cost = dict(rollout.costs["decode_step"])

    def with_kernel(lens):
        if not kernel:
            return cost
        attention = paged_decode_attention(model, lens, page_size=engine.page_size,
                                           pages_per_row=engine.pages_per_row,
                                           cache_dtype=engine.cache_dtype, backend=kernel)
        return {**cost, "flops": cost["flops"] + attention.flops,
                "bytes_accessed": cost["bytes_accessed"] + attention.bytes_accessed}

    here = with_kernel(kv_lens)
    band = roofline(accelerator.kind, "decode", chip, here["flops"],
                    bytes_band(here, accelerator.kind), per_step)
    # The simulator's model: its b from the kernel's bytes between one token and max_len
    # a row (0 where nothing read depends on the rows' lengths), its compute floor d.
    eff = EFFICIENCY[(accelerator.kind, "decode")]
    bandwidth = chip.hbm_bytes_per_s * eff["bandwidth"].value
    slots = len(kv_lens)
    full = with_kernel([engine.max_len] * slots)
    empty = with_kernel([1] * slots)
    b = (bytes_band(full, accelerator.kind)[1] - bytes_band(empty, accelerator.kind)[1]) \
        / bandwidth / (slots * (engine.max_len - 1))
    d = here["flops"] / (chip.bf16_flops_per_s * eff["flops"].value)
    c = max(band.value - per_step.value - b * sum(kv_lens), 0.0)
    return band, {"a": per_step.value, "b": b, "c": c, "d": d, "e": 0.0}


def prefill_per_token(spec, rollout) -> Band:
    accelerator = rollout.accelerator
    cost = rollout.costs["prefill_chunk"]
    chunk = roofline(accelerator.kind, "prefill", accelerator.chip, cost["flops"],
                     bytes_band(cost, accelerator.kind),
                     Assumption(0.0, 0.0, 0.0, "in the decode dispatch's"))
    tokens = spec.rollout.prompt_bucket
    return Band(chunk.value / tokens, chunk.low / tokens, chunk.high / tokens, False)


def weight_sync(policy_bytes: float, trainer_kind: str, rollout_kind: str) -> tuple[Band, float]:
    """A weight sync between trainer and rollout, and the bandwidth's value."""
    net = NETWORK["gpu_peers" if trainer_kind == rollout_kind == "gpu" else "hosts"]
    over = OVERHEADS["weight_sync"]
    return (Band(policy_bytes / net.value + over.value, policy_bytes / net.high + over.low,
                 policy_bytes / net.low + over.high, False), net.value)


def assumptions_text(kinds: set[str]) -> list[str]:
    """The assumptions behind a plan's predictions, one line each, to print with them."""
    lines = []
    for (kind, program), effs in EFFICIENCY.items():
        if kind in kinds and program == "train":  # the same for every program of a kind
            for name, a in effs.items():
                lines.append(f"{kind} {name} efficiency {a.value:g} [{a.low:g}-{a.high:g}]: "
                             f"{a.source}")
    for name, a in OVERHEADS.items():
        lines.append(f"overhead per {name.replace('_', ' ')} {a.value:g} s "
                     f"[{a.low:g}-{a.high:g}]: {a.source}")
    for name, a in NETWORK.items():
        lines.append(f"network ({name.replace('_', ' ')}) {a.value / 1e9:g} GB/s "
                     f"[{a.low / 1e9:g}-{a.high / 1e9:g}]: {a.source}")
    for m in MEASUREMENTS if "gpu" in kinds else ():
        lines.append(f"calibration: {m.program} on {m.chip}, {m.param_dtype}, "
                     f"{'paged' if m.paged else 'contiguous'} cache, work within "
                     f"{REGIME:g}x of {', '.join(f'{w:.3g}' for w in m.work)}: {m.source}")
    return lines
