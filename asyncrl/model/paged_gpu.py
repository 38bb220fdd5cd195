"""Paged decode attention on GPU: JAX's Pallas GPU paged attention kernel body
(`jax.experimental.pallas.ops.gpu.paged_attention.paged_attention_kernel`, Triton), called
on the engine's own pool.

    q           [B, N, H]            N = K * G query heads
    pages       [L, P, ps, 2K, H]    the engine's pool (asyncrl/model/paged.py)
    page_table  [B, W] int32         the pages of each row, from column 0
    kv_lens     [B] int32            positions each row attends to; 0: the row reads nothing

JAX's wrapper takes separate key and value pools [K, pages, ps, H]; the kernel body reads
one kv head's pages as a [pages, ps, H] block, so its block specs here pick that head's
keys (row 2h) and values (row 2h + 1) out of the interleaved pool by stride: no copy of
the pool into another layout, ever. The layers' pools sit side by side ([L * P, ...], a
free reshape) and each row's table is offset to this layer's.

Per (row, kv head) the kernel splits the table's W columns into `k_splits` partitions, run
in parallel, each loading `pages_per_compute_block` pages at a time from its first page
up to the row's length: a partition past the length loads nothing, the last block of a
live one loads whole (positions past the length masked). So a row reads its live pages
rounded up to a compute block, once per kv head (`block_plan`); the partitions' partial
softmaxes are combined after the call. Pallas' interpreter runs it on a CPU
(`interpret=True`): tests compare it with the gather there, and lower it for CUDA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

# Where it runs compiled; elsewhere interpreted.
PLATFORMS = ("gpu", "cuda")
# Positions one compute block loads (a power of two of pages at most this many), and the
# most partitions a row's pages are split into.
BLOCK_POSITIONS = 64
MAX_SPLITS = 16
# The kernel handles query heads in blocks of 16 (Triton's smallest dot).
HEADS_PER_BLOCK = 16


def block_shape(page_size: int, width: int) -> tuple[int, int, int]:
    """(pages per compute block, partitions, table width padded to fill them)."""
    per_block = 1 << max(0, (max(1, BLOCK_POSITIONS // page_size)).bit_length() - 1)
    per_block = min(per_block, 1 << (max(width, 1) - 1).bit_length())
    splits = min(MAX_SPLITS, -(-width // per_block))
    padded = -(-width // (per_block * splits)) * per_block * splits
    return per_block, splits, padded


def paged_decode(q: jax.Array, pages: jax.Array, page_table: jax.Array, kv_lens: jax.Array,
                 layer: jax.Array, *, sm_scale: float, interpret: bool = False) -> jax.Array:
    """Attention of one query per row over its first kv_lens positions, through its pages
    in layer `layer` of the pool. Returns [B, N, H] in q's dtype (rows of length 0: zeros)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as plgpu
    from jax.experimental.pallas.ops.gpu.paged_attention import (
        DEFAULT_MASK_VALUE, paged_attention_kernel)

    batch, num_heads, head_dim = q.shape
    layers, num_pages, page_size, combined, _ = pages.shape
    kv_heads = combined // 2
    groups = num_heads // kv_heads
    per_block, splits, width = block_shape(page_size, page_table.shape[1])
    per_split = width // splits
    pool = pages.reshape(layers * num_pages, page_size, combined, head_dim)
    # Columns past a row's pages point at a real page of this layer: the kernel's last
    # block loads whole, and masks what lies past the length.
    table = jnp.minimum(page_table, num_pages - 1) + layer * num_pages
    table = jnp.pad(table, ((0, 0), (0, width - table.shape[1])), constant_values=0)
    table = table.astype(jnp.int32).reshape(batch, splits, per_split)
    padded_groups = -(-groups // HEADS_PER_BLOCK) * HEADS_PER_BLOCK
    # The kernel takes no softmax scale: the queries carry it.
    queries = (q.astype(jnp.float32) * sm_scale).astype(pages.dtype)
    queries = queries.reshape(batch, kv_heads, groups, head_dim)
    queries = jnp.pad(queries, ((0, 0), (0, 0), (0, padded_groups - groups), (0, 0)))

    kernel = functools.partial(paged_attention_kernel, num_heads=groups,
                               pages_per_compute_block=per_block,
                               mask_value=DEFAULT_MASK_VALUE, attn_logits_soft_cap=None)
    head_blocks = padded_groups // HEADS_PER_BLOCK
    pool_spec = functools.partial(pl.BlockSpec, (pool.shape[0], page_size, None, head_dim))
    call = pl.pallas_call(
        kernel, grid=(kv_heads, head_blocks, splits),
        in_specs=[pl.BlockSpec((None, HEADS_PER_BLOCK, head_dim), lambda h, i, k: (h, i, 0)),
                  pool_spec(lambda h, i, k: (0, 0, 2 * h, 0)),  # kv head h's keys
                  None,
                  pool_spec(lambda h, i, k: (0, 0, 2 * h + 1, 0)),  # and its values
                  None,
                  pl.BlockSpec((None, per_split), lambda h, i, k: (k, 0)),
                  pl.BlockSpec((1,), lambda h, i, k: (0,))],
        out_specs=[pl.BlockSpec((None, None, HEADS_PER_BLOCK, head_dim),
                                lambda h, i, k: (k, h, i, 0)),
                   pl.BlockSpec((None, None, HEADS_PER_BLOCK), lambda h, i, k: (k, h, i)),
                   pl.BlockSpec((None, None, HEADS_PER_BLOCK), lambda h, i, k: (k, h, i))],
        out_shape=[jax.ShapeDtypeStruct((splits, kv_heads, padded_groups, head_dim),
                                        pages.dtype),
                   jax.ShapeDtypeStruct((splits, kv_heads, padded_groups), jnp.float32),
                   jax.ShapeDtypeStruct((splits, kv_heads, padded_groups), jnp.float32)],
        interpret=interpret, compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        name="asyncrl_paged_decode")

    def one_row(queries, table, length):
        return call(queries, pool, None, pool, None, table, length)

    out, sums, maxima = jax.vmap(one_row)(queries, table,
                                          kv_lens.astype(jnp.int32)[:, None])
    out, sums, maxima = out[..., :groups, :], sums[..., :groups], maxima[..., :groups]
    # The partitions' partial softmaxes into one; a partition that loaded nothing has sum 0.
    top = maxima.max(axis=1, keepdims=True)
    weight = jnp.exp(maxima - top)
    total = (sums * weight).sum(axis=1)
    combined_out = (out.astype(jnp.float32) * weight[..., None]).sum(axis=1)
    combined_out = combined_out / jnp.where(total > 0, total, 1.0)[..., None]
    return combined_out.reshape(batch, num_heads, head_dim).astype(q.dtype)


def block_plan(kv_lens, *, page_size: int, width: int) -> dict:
    """What one call loads per kv head, from the kernel's plan: each row's pages in its
    partitions below its length, rounded up to whole compute blocks."""
    per_block, splits, padded = block_shape(page_size, width)
    per_split = padded // splits
    held = -(-np.asarray(kv_lens, np.int64) // page_size)
    starts = np.arange(splits) * per_split
    live = np.clip(held[:, None] - starts[None, :], 0, per_split)  # [rows, splits]
    blocks = -(-live // per_block)
    return {"pages_loaded": int(blocks.sum() * per_block), "blocks": int(blocks.sum()),
            "pages_per_block": per_block, "splits": splits}
