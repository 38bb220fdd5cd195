"""What a Pallas kernel costs, from its block plan: XLA's cost analysis credits a custom call
with nothing (a kernel declares no cost estimate; measured with libtpu 0.0.42.1,
asyncrl/plan/tpu_compile.py `custom_call_bytes`), so the bytes and FLOPs it moves are
counted here, from what its DMAs copy and its blocks compute. The planner
(asyncrl/plan/predict.py), the decode byte table (asyncrl/plan/decode_cost.py) and
benchmarks/engine.py all count the kernel with this one module.

JAX's TPU ragged paged attention (`jax.experimental.pallas.ops.tpu.ragged_paged_attention`,
JAX 0.10.2), as the model calls it (`asyncrl.model.paged.ragged_blocks`: P = min(W, 128)
KV pages per block, Q = min(B, 32) queries per block):
  - its grid is (head blocks, query blocks); in each, every sequence whose queries fall in
    the query block is visited, its KV in blocks of P pages: ceil(kv_len / (P * page_size))
    blocks, each one DMA of P whole pages from HBM (`MultiPageAsyncCopyDescriptor` copies
    all P, repeating the row's first page past its last: the kernel's own TODO "only fetch
    dynamic shape in need"), double-buffered so each block is copied once;
  - so a row reads at least P pages in every layer, however short: with W <= 128 (max_len
    up to 2,048 positions at page size 16) that is the row's whole page table, what a
    contiguous cache reads;
  - the query block [Q, heads, H] comes in and the output block goes out once per grid
    step, and the scalar arguments (kv_lens, page_indices, cu_q_lens, two words of state,
    num_seqs) are prefetched once;
  - each visited block computes Q * G query rows (every query of the block, G query heads
    per KV head) against P * page_size keys and values, per KV head: 2 matmuls of
    2 * (Q * G) * (P * page_size) * H FLOPs.
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


def ragged_paged_attention(kv_lens: Sequence[int], *, num_q_heads: int, num_kv_heads: int,
                           head_dim: int, page_size: int, pages_per_seq: int, itemsize: int,
                           pages_per_block: int, queries_per_block: int,
                           q_lens: Sequence[int] | None = None) -> KernelCost:
    """One call of the kernel on sequences of `kv_lens` tokens (each with `q_lens` queries,
    default 1: decode), queries and pages of `itemsize` bytes, and its block plan."""
    kv_lens = np.asarray(kv_lens, np.int64)
    q_lens = np.ones_like(kv_lens) if q_lens is None else np.asarray(q_lens, np.int64)
    if kv_lens.shape != q_lens.shape or (q_lens < 1).any() or (kv_lens < q_lens).any():
        raise ValueError("every sequence needs 1 <= q_len <= kv_len")
    if not 0 < pages_per_block <= pages_per_seq:
        raise ValueError(f"pages_per_block must be in (0, {pages_per_seq}], got {pages_per_block}")
    ends = np.cumsum(q_lens)
    starts = ends - q_lens
    # A sequence is visited once in every query block its queries fall in.
    visits = (ends - 1) // queries_per_block - starts // queries_per_block + 1
    blocks = -(-kv_lens // (pages_per_block * page_size))
    copied_blocks = float((visits * blocks).sum())
    page_bytes = page_size * 2 * num_kv_heads * head_dim * itemsize
    kv_bytes = copied_blocks * pages_per_block * page_bytes
    query_blocks = math.ceil(int(ends[-1]) / queries_per_block)
    queries = 2 * query_blocks * queries_per_block * num_q_heads * head_dim * itemsize
    seqs = len(kv_lens)
    scalars = 4 * (seqs + seqs * pages_per_seq + seqs + 1 + 2 + 1)
    groups = num_q_heads // num_kv_heads
    flops = (copied_blocks * num_kv_heads * 2 * 2 * queries_per_block * groups
             * pages_per_block * page_size * head_dim)
    return KernelCost(flops, kv_bytes + queries + scalars, kv_bytes)


def paged_decode_attention(model, kv_lens: Sequence[int], *, page_size: int,
                           pages_per_row: int, cache_dtype=None) -> KernelCost:
    """The kernel calls of one decode step of `model` (a ModelConfig), every layer: one
    query per row, each row of the engine's B slots holding its kv_len tokens (an idle slot
    too: it still computes, and still copies its first block)."""
    import jax.numpy as jnp

    from asyncrl.model.paged import ragged_blocks

    pages_per_block, queries_per_block = ragged_blocks(len(kv_lens), pages_per_row)
    one = ragged_paged_attention(
        kv_lens, num_q_heads=model.num_heads, num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim, page_size=page_size, pages_per_seq=pages_per_row,
        itemsize=jnp.dtype(cache_dtype or model.param_dtype).itemsize,
        pages_per_block=pages_per_block, queries_per_block=queries_per_block)
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
