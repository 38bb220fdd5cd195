"""decode_bytes_vs_ideal: the bytes one decode step of the rollout engine moves on a TPU,
against the least any decode step could move.

Decode reads every weight and every live token's keys and values once per step and does
little arithmetic on them, so its speed is set by bytes. The least a step can read is the
parameters plus the KV of the tokens the sequences actually hold (`ideal`). A contiguous
cache reads each row's whole max_len. A paged cache with the TPU kernel
(asyncrl/model/paged_tpu.py) reads what its DMAs copy: each row's pages below its length,
once (asyncrl/plan/kernel_cost.py), so it rounds each row up to a page. Their ratio to the
ideal says how much of a step's memory traffic is waste.

The step is compiled for a TPU topology on this host (asyncrl/plan/tpu_compile.py) and measured
with XLA's cost analysis, corrected for what that analysis cannot see:
  - loops: the model scans its layers, and XLA counts a loop body once; `analysis` counts
    every iteration (asyncrl/plan/hlo_cost.py);
  - the paged attention kernel: XLA credits the Pallas custom call with nothing (the
    kernel declares no cost estimate), so what it is credited with, measured by
    `custom_call_bytes` (0 with libtpu 0.0.42.1), is taken off, and what it reads and writes
    is added, counted from its block plan (asyncrl/plan/kernel_cost.py), in every layer.
XLA's bytes also count data the compiler stages through VMEM, at each hop, and how much it
stages shifts with the program: the same paged step with a 4x larger pool read 66% more
by XLA's count (3.7 -> 6.1 GB at Qwen2.5-1.5B shape) though it touches the same pages. So a
second figure takes that traffic out (`vmem_bytes`, from `analysis`):
hbm_bytes = corrected_bytes - 2 * vmem_bytes.

    python -m asyncrl.plan.decode_cost     # the table for Qwen2.5-0.5B / 1.5B shapes on
                                           # v5e and v6e, then the worst ratios as one JSON line
"""

from __future__ import annotations

import functools
import json
import math
import time

import jax
import jax.numpy as jnp

from asyncrl.model import ModelConfig, PagedKVCache, abstract_params
from asyncrl.model.paged import _attend_kernel, live_kv_bytes
from asyncrl.rollout.engine import Engine, _generate
from asyncrl.model.sampling import SamplingParams
from asyncrl.plan.kernel_cost import paged_decode_attention
from asyncrl.plan.tpu_compile import analysis, compile_for, custom_call_bytes, topology_devices


def _nbytes(tree) -> int:
    return sum(math.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


_COMPILED: dict[tuple, dict] = {}


def _compiled_step(config: ModelConfig, num_seqs: int, max_len: int, page_size: int | None,
                   num_pages: int | None, topology: str, sampling: SamplingParams,
                   cache_dtype: str) -> dict:
    """What does not depend on the sequences' lengths: the compile and the kernel's credit.
    `decode_step_bytes` keeps it in _COMPILED, so a table over several mean lengths compiles
    each shape once."""
    devices = topology_devices(topology)
    graphdef, params = abstract_params(config)
    # The engine's own empty state, so the shapes cannot drift from what it runs; built for
    # the TPU, where its kernel compiles.
    with jax.default_device(devices[0]):
        engine = Engine(graphdef, config, num_slots=num_seqs, max_len=max_len,
                        prompt_buckets=(max_len,), sampling=sampling, cache_dtype=cache_dtype,
                        page_size=page_size, num_pages=num_pages, attention="tpu_ragged")
    state = jax.eval_shape(engine._empty_state)
    table = (None if page_size is None else
             jax.ShapeDtypeStruct((num_seqs, max_len // page_size), jnp.int32))
    # "tpu_ragged" named, not "auto": a shape the kernel cannot take must fail here, not be
    # measured through the gather instead.
    step = functools.partial(_generate, graphdef, steps=1, attention="tpu_ragged",
                             seed=engine.seed, sampling=sampling,
                             stop_tokens=engine.stop_tokens, max_len=max_len)
    args = (params, state, table)
    out = {"param_bytes": _nbytes(params), "state_bytes": _nbytes(state),
           "num_pages": None if page_size is None else int(state.cache.shape[1])}

    start = time.perf_counter()
    compiled = analysis(compile_for(step, args, devices, donate_argnums=(1,)))
    out["compile_s"] = time.perf_counter() - start
    out.update(xla_bytes=compiled["xla_bytes_accessed"], bytes=compiled["bytes_accessed"],
               vmem_bytes=compiled["vmem_bytes"], xla_flops=compiled["xla_flops"],
               flops=compiled["flops"], device_bytes=compiled.get("device_bytes"),
               temp_bytes=compiled.get("temp_bytes"))

    out.update(kernel_xla_bytes=0.0, kernel_compile_s=0.0)
    if page_size is not None:
        # One layer's call exactly as the model makes it; its output has q's shape, which
        # custom_call_bytes needs to chain two calls.
        def attend(q, pages, page_table, positions):
            cache = PagedKVCache(pages, page_table, layer=jnp.zeros((), jnp.int32),
                                 backend="tpu_ragged")
            return _attend_kernel("tpu_ragged", cache, q, positions, q.dtype)

        q = jax.ShapeDtypeStruct((num_seqs, 1, config.num_kv_heads, config.num_groups,
                                  config.head_dim), state.cache.dtype)
        positions = jax.ShapeDtypeStruct((num_seqs, 1), jnp.int32)
        start = time.perf_counter()
        per_call = custom_call_bytes(attend, (q, state.cache, table, positions), devices)
        out["kernel_compile_s"] = time.perf_counter() - start
        out["kernel_xla_bytes"] = per_call * config.num_layers
    return out


def decode_step_bytes(config: ModelConfig, *, num_seqs: int, max_len: int, mean_len: int,
                      page_size: int = 16, paged: bool, topology: str = "v5e:1x1",
                      num_pages: int | None = None,
                      sampling: SamplingParams = SamplingParams(),
                      cache_dtype=None) -> dict:
    """Bytes one decode step (`Engine.generate` with decode_steps=1) moves on one chip of a
    TPU topology, every row holding `mean_len` tokens, against the ideal.

    paged: the page pool and the TPU kernel (needs head_dim a multiple of 128), the pool
    sized like the engine's default, num_seqs * max_len / page_size pages (the contiguous
    cache's memory), unless num_pages says otherwise; the kernel copies each row's live
    pages (module docstring). Otherwise the contiguous cache
    [L, B, max_len, K, H]. Everything is replicated on every device of the topology, so a
    larger topology gives the same per-chip figures.

    Returns (bytes per step, per chip):
      xla_bytes        XLA's 'bytes accessed' of the program the engine runs (layers looped)
      bytes            the same with every loop iteration counted
      kernel_xla_bytes what XLA credits the paged kernel with in all layers (taken off)
      kernel_bytes     what the paged kernel's DMAs copy and it writes (added); of it
      kernel_kv_bytes  the KV pages copied
      corrected_bytes  bytes - kernel_xla_bytes + kernel_bytes
      vmem_bytes       what the program's top-level ops write into VMEM
      hbm_bytes        corrected_bytes - 2 * vmem_bytes: an estimate of HBM traffic
      param_bytes, live_kv_bytes (num_seqs * mean_len tokens' K and V, all layers),
      ideal_bytes = param_bytes + live_kv_bytes, bytes_vs_ideal = corrected / ideal,
      hbm_bytes_vs_ideal = hbm_bytes / ideal, and compile times in seconds (0 for shapes
      compiled by an earlier call).
    """
    if not 1 <= mean_len <= max_len:
        raise ValueError(f"mean_len must be in [1, max_len={max_len}], got {mean_len}")
    if paged and config.head_dim % 128:
        raise ValueError(f"the TPU paged attention kernel needs head_dim a multiple "
                         f"of 128, got {config.head_dim}")
    dtype = jnp.dtype(cache_dtype or config.param_dtype)
    key = (config, num_seqs, max_len, page_size if paged else None,
           num_pages if paged else None, topology, sampling, dtype.name)
    if key in _COMPILED:
        step = dict(_COMPILED[key], compile_s=0.0, kernel_compile_s=0.0)
    else:
        step = _COMPILED[key] = _compiled_step(*key)

    kernel = (paged_decode_attention(config, [mean_len] * num_seqs, page_size=page_size,
                                     pages_per_row=max_len // page_size, cache_dtype=dtype)
              if paged else None)
    kernel_bytes = kernel.bytes_accessed if kernel else 0.0
    corrected = step["bytes"] - step["kernel_xla_bytes"] + kernel_bytes
    live = live_kv_bytes(config, [mean_len] * num_seqs, 1, dtype)
    ideal = step["param_bytes"] + live
    hbm = corrected - 2 * step["vmem_bytes"]
    return {"topology": topology, "paged": paged, "num_seqs": num_seqs, "max_len": max_len,
            "mean_len": mean_len, "page_size": page_size if paged else None, **step,
            "kernel_bytes": kernel_bytes, "kernel_kv_bytes": kernel.kv_bytes if kernel else 0.0,
            "corrected_bytes": corrected, "hbm_bytes": hbm, "live_kv_bytes": live,
            "ideal_bytes": ideal, "bytes_vs_ideal": corrected / ideal,
            "hbm_bytes_vs_ideal": hbm / ideal}


def _qwen2_5(size: str) -> ModelConfig:
    """Qwen2.5-0.5B / 1.5B shapes in bfloat16."""
    config = ModelConfig.qwen2_5_0_5b(param_dtype="bfloat16")
    if size == "1.5B":
        config = config.replace(hidden_dim=1536, num_layers=28, num_heads=12, head_dim=128,
                                mlp_dim=8960)
    return config


# (model, paged, max_len, mean_len, topology, sequences): 64 rows of 4,096 and 16 of 16,384
# hold the same KV memory; each at mean lengths of an eighth and a quarter of max_len.
SETTINGS = ([("0.5B", False, max_len, max_len // d, "v5e:1x1", 64)
             for max_len in (1024, 4096) for d in (8, 4)]
            + [("1.5B", False, max_len, max_len // d, "v5e:1x1", 64)
               for max_len in (1024, 4096) for d in (8, 4)]
            + [("1.5B", True, max_len, max_len // d, topology, seqs)
               for topology in ("v5e:1x1", "v6e:1x1")
               for max_len, seqs in ((4096, 64), (16384, 16)) for d in (8, 4)])


def table(settings=SETTINGS) -> list[dict]:
    """decode_step_bytes for each setting, printed as it goes."""
    print(f"{'model':12} {'engine':10} {'chip':8} {'seqs':>4} {'max_len':>7} {'mean_len':>8} "
          f"{'xla GB':>7} {'corr GB':>7} {'hbm GB':>7} {'ideal GB':>8} {'ratio':>6} "
          f"{'hbm ratio':>9} {'compile s (step, kernel)':>24}")
    rows = []
    for size, paged, max_len, mean_len, topology, seqs in settings:
        r = decode_step_bytes(_qwen2_5(size), num_seqs=seqs, max_len=max_len,
                              mean_len=mean_len, page_size=16, paged=paged, topology=topology)
        rows.append(dict(r, model=f"Qwen2.5-{size}"))
        seconds = f"{r['compile_s']:.1f}, {r['kernel_compile_s']:.1f}"
        print(f"Qwen2.5-{size:5} {'paged' if paged else 'contiguous':10} {topology:8} "
              f"{seqs:4d} {max_len:7d} {mean_len:8d} {r['xla_bytes'] / 1e9:7.3f} "
              f"{r['corrected_bytes'] / 1e9:7.3f} {r['hbm_bytes'] / 1e9:7.3f} "
              f"{r['ideal_bytes'] / 1e9:8.3f} {r['bytes_vs_ideal']:6.2f} "
              f"{r['hbm_bytes_vs_ideal']:9.2f} {seconds:>24}", flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    """The worst (largest) ratio of each engine and model over the table's settings (both
    chips); the paged one also per max_len."""
    def worst(model, paged, key, max_len=None):
        return round(max(r[key] for r in rows if r["model"] == model and r["paged"] == paged
                         and max_len in (None, r["max_len"])), 2)

    return {"decode_bytes_vs_ideal": worst("Qwen2.5-1.5B", True, "bytes_vs_ideal"),
            "decode_bytes_vs_ideal_4k": worst("Qwen2.5-1.5B", True, "bytes_vs_ideal", 4096),
            "decode_bytes_vs_ideal_16k": worst("Qwen2.5-1.5B", True, "bytes_vs_ideal", 16384),
            "decode_hbm_bytes_vs_ideal": worst("Qwen2.5-1.5B", True, "hbm_bytes_vs_ideal"),
            "contiguous_decode_bytes_vs_ideal": worst("Qwen2.5-1.5B", False, "bytes_vs_ideal"),
            "contiguous_decode_bytes_vs_ideal_0_5b": worst("Qwen2.5-0.5B", False,
                                                           "bytes_vs_ideal")}


def main() -> None:
    print(json.dumps(summary(table())))


if __name__ == "__main__":
    main()
