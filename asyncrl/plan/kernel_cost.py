"""What a Pallas kernel costs, from its block plan: XLA's cost analysis credits a custom call
with nothing (a kernel declares no cost estimate; measured with libtpu 0.0.42.1,
asyncrl/plan/tpu_compile.py `custom_call_bytes`), so the bytes and FLOPs it moves are
counted here, from what its DMAs copy and its blocks compute. The planner
(asyncrl/plan/predict.py), the decode byte table (asyncrl/plan/decode_cost.py) and
benchmarks/engine.py all count the kernel with this one module.

The paged decode kernel (asyncrl/model/paged_tpu.py), one query per row, all heads of a row
in one grid step:
  - its DMAs copy each row's pages below its length, each page once, and nothing for a row
    of length 0 (`block_plan`): the bytes follow the live tokens, rounded up to a page;
  - every row's query block [N, H] comes in and its output goes out once; the scalar
    arguments (row order, lengths, first blocks, the flat page table, the layer) once;
  - each of a row's blocks computes, per kv head, 2 matmuls of 2 * G * (pages per block *
    page size) * H FLOPs, masked positions of its last block included.
The GPU paged decode (asyncrl/model/paged_gpu.py) is counted the same way from its plan
(`gpu_paged_decode_kernel`): on a GPU the planner compiles a CPU stand-in whose gather reads
one page-table column, and adds this.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class KernelCost:
    flops: float
    bytes_accessed: float
    kv_bytes: float  # of bytes_accessed: the KV pages its DMAs copy

    def __mul__(self, times: float) -> "KernelCost":
        return KernelCost(self.flops * times, self.bytes_accessed * times, self.kv_bytes * times)


def paged_decode_kernel(kv_lens: Sequence[int], *, num_q_heads: int, num_kv_heads: int,
                        head_dim: int, page_size: int, pages_per_seq: int,
                        itemsize: int) -> KernelCost:
    """One call of the paged decode kernel on rows of `kv_lens` tokens (0: an empty or
    finished slot), queries and pages of `itemsize` bytes, a page table `pages_per_seq`
    wide."""
    from asyncrl.model.paged_tpu import block_plan

    kv_lens = np.asarray(kv_lens, np.int64)
    if (kv_lens < 0).any():
        raise ValueError("kv_lens must be >= 0")
    plan = block_plan(kv_lens, page_size=page_size, width=pages_per_seq)
    page_bytes = page_size * 2 * num_kv_heads * head_dim * itemsize
    kv_bytes = float(plan["pages_copied"] * page_bytes)
    rows = len(kv_lens)
    queries = 2 * rows * num_q_heads * head_dim * itemsize
    scalars = 4 * (3 * rows + rows * pages_per_seq + 1)
    groups = num_q_heads // num_kv_heads
    block_len = plan["pages_per_block"] * page_size
    flops = plan["blocks"] * num_kv_heads * 2 * 2 * groups * block_len * head_dim
    return KernelCost(float(flops), kv_bytes + queries + scalars, kv_bytes)


def gpu_paged_decode_kernel(kv_lens: Sequence[int], *, num_q_heads: int, num_kv_heads: int,
                            head_dim: int, page_size: int, pages_per_seq: int,
                            itemsize: int) -> KernelCost:
    """One call of the GPU paged decode (asyncrl/model/paged_gpu.py): per row and kv head,
    each partition's pages below the row's length in whole compute blocks, keys and values;
    the padded query block in, each partition's output block and its softmax sums and maxima
    (float32) out."""
    from asyncrl.model.paged_gpu import HEADS_PER_BLOCK, block_plan

    kv_lens = np.asarray(kv_lens, np.int64)
    if (kv_lens < 0).any():
        raise ValueError("kv_lens must be >= 0")
    plan = block_plan(kv_lens, page_size=page_size, width=pages_per_seq)
    head_bytes = page_size * head_dim * itemsize  # one kv head's keys of one page
    kv_bytes = float(plan["pages_loaded"] * num_kv_heads * 2 * head_bytes)
    rows = len(kv_lens)
    groups = num_q_heads // num_kv_heads
    padded = -(-groups // HEADS_PER_BLOCK) * HEADS_PER_BLOCK
    queries = rows * num_kv_heads * padded * head_dim * itemsize
    partials = rows * plan["splits"] * num_kv_heads * padded * (head_dim * itemsize + 2 * 4)
    tables = 4 * rows * (pages_per_seq + 1)
    block_len = plan["pages_per_block"] * page_size
    flops = plan["blocks"] * num_kv_heads * 2 * 2 * padded * block_len * head_dim
    return KernelCost(float(flops), kv_bytes + queries + partials + tables, kv_bytes)


def paged_decode_attention(model, kv_lens: Sequence[int], *, page_size: int,
                           pages_per_row: int, cache_dtype=None,
                           backend: str = "tpu_ragged") -> KernelCost:
    """The kernel calls of one decode step of `model` (a ModelConfig), every layer: one
    query per row, each row of the engine's B slots holding its kv_len tokens (0 for a slot
    that is not running: it reads no page). `backend`: "tpu_ragged" or "gpu_paged"."""
    import jax.numpy as jnp

    count = {"tpu_ragged": paged_decode_kernel, "gpu_paged": gpu_paged_decode_kernel}[backend]
    one = count(
        kv_lens, num_q_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim, page_size=page_size, pages_per_seq=pages_per_row,
        itemsize=jnp.dtype(cache_dtype or model.param_dtype).itemsize)
    return one * model.num_layers


def splash_attention(*, rows: int, length: int, num_q_heads: int, num_kv_heads: int,
                     head_dim: int, itemsize: int, forward_passes: int = 1,
                     backward: bool = True) -> KernelCost:
    """Splash attention as asyncrl/model/attention.py calls it in a train step: every row
    padded to a multiple of 128 and cut in square tiles t of 512, 256 or 128 (the largest
    that divides it); a causal mask, so of the n x n tile pairs the kernel visits the
    n (n + 1) / 2 on or below the diagonal (segment ids are data: they skip no tile). Per
    query head and visited pair:
      forward   QK^T and PV: 4 t^2 H FLOPs; the K and V tiles copied in (2 t H words), the
                query tile in and the output out once per query tile;
      backward  the dK/dV kernel recomputes QK^T and takes dP, dV, dK (8 t^2 H), copying the
                Q and dO tiles per pair; the dQ kernel recomputes QK^T and takes dP, dQ
                (6 t^2 H), copying the K and V tiles per pair; each writes its gradients
                once per tile.
    `forward_passes`: 2 under any remat (a Pallas call's output is never saved, so the
    backward pass runs the forward again).
    Not counted, so the bytes are a lower bound: the mask's q_sequence and the segment-id
    tiles each kernel loads, the logsumexp the forward writes and the backward reads (with
    di), all int32 / float32 lane-padded to 128; a review's recount from the kernels' block
    mappings put the whole at 1.16-1.36x this count at head_dim 128 (7B, 4k-32k) and 2.2x at
    head_dim 64. In the dK/dV kernel grouped-query heads move K, V, dK, dV once per kv head,
    which this counts per query head (an overcount of those terms). The FLOPs match the
    kernels'."""
    from asyncrl.model.attention import splash_tiles

    padded, tile = splash_tiles(length)
    n = padded // tile
    pairs = n * (n + 1) // 2
    words = tile * head_dim * itemsize  # one [t, H] tile
    per_head_fwd_flops = pairs * 4 * tile * tile * head_dim
    per_head_fwd_bytes = pairs * 2 * words + n * 2 * words
    flops = per_head_fwd_flops * forward_passes
    moved = per_head_fwd_bytes * forward_passes
    if backward:
        flops += pairs * 14 * tile * tile * head_dim
        moved += pairs * 2 * words * 2 + n * 3 * words * 2
    heads = rows * num_q_heads
    return KernelCost(flops * heads, moved * heads, 0.0)
