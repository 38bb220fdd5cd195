"""A Pallas TPU kernel for paged decode attention that reads only each row's live pages.

One query per row (a decode step), every query head of the row in one grid step:

    q           [B, N, H]            N = K * G query heads, G per kv head
    pages       [L, P, ps, 2K, H]    the engine's pool (asyncrl/model/paged.py); kv head i's
                                     key at 2i, its value at 2i + 1
    page_table  [B, W] int32         the pages of each row, from column 0
    kv_lens     [B] int32            positions each row attends to; 0: the row reads nothing

Why not JAX's `ragged_paged_attention` (JAX 0.10.2): its DMAs copy whole blocks of
min(W, 128) pages, padding a row's last block with copies of its first page, so every row
reads at least a block however short, and finished slots are visited at their stale length;
at page size 64 its blocks no longer fit VMEM at 16k. Here:

  - rows run in the order `order` (rows that read something first); the grid walks it, and
    while one block computes, the next block's pages are being copied (the same row's next
    block, else the next row's first): two VMEM buffers of `pages_per_block` pages;
  - a block copies only the pages below its row's length: one DMA per live page, none for
    the rest of the block, none for a row of length 0;
  - the block's keys and values are read per kv head by a strided load (bfloat16 pairs k and
    v in one 32-bit word), online softmax in float32 across the row's blocks.

So a step's KV traffic is each live row's ceil(len / ps) pages once (`block_plan`), whatever
W and the block size: that is the count asyncrl/plan/kernel_cost.py adds for it.
Pallas' TPU interpreter runs it on a CPU (`interpret=True`): tests compare it with the
gather backend there, and compile it for TPU topologies.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

# Where it runs compiled; elsewhere interpreted.
PLATFORMS = ("tpu",)
# Positions one block covers: a block's pages are copied as separate DMAs anyway (pages are
# scattered over the pool), so the block size sets only VMEM (two buffers) and how much of a
# row's last block computes on masked positions, never the bytes copied.
BLOCK_POSITIONS = 512
_MASKED = -0.7 * float(np.finfo(np.float32).max)


def pages_per_block(page_size: int, width: int) -> int:
    """Pages one block copies at most: BLOCK_POSITIONS worth, at most the table's width."""
    return max(1, min(width, BLOCK_POSITIONS // page_size))


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The static shape of one call: what the kernel's loops and copies are built from."""
    page_size: int
    width: int  # page-table columns
    per_block: int  # pages a block copies at most
    kv_heads: int
    groups: int  # query heads per kv head
    head_dim: int

    @property
    def block_len(self) -> int:
        return self.per_block * self.page_size

    @property
    def page_rows(self) -> int:  # a page as [ps * 2K, H] rows
        return self.page_size * 2 * self.kv_heads


def paged_decode(q: jax.Array, pages: jax.Array, page_table: jax.Array, kv_lens: jax.Array,
                 layer: jax.Array, *, sm_scale: float, interpret: bool = False) -> jax.Array:
    """Attention of one query per row over its first kv_lens positions, through its pages
    in layer `layer` of the pool. Returns [B, N, H] in q's dtype (rows of length 0: zeros)."""
    batch, num_heads, head_dim = q.shape
    _, num_pages, page_size, combined, _ = pages.shape
    width = page_table.shape[1]
    plan = _Plan(page_size, width, pages_per_block(page_size, width), combined // 2,
                 num_heads // (combined // 2), head_dim)

    kv_lens = kv_lens.astype(jnp.int32)
    blocks = -(-(-(-kv_lens // page_size)) // plan.per_block)
    order = jnp.argsort(kv_lens == 0, stable=True).astype(jnp.int32)
    # The global index of each row's first block: its parity picks the buffer, so a row's
    # first block lands in the buffer the previous row's last block did not use.
    first_block = (jnp.cumsum(blocks[order]) - blocks[order]).astype(jnp.int32)
    # Flat: SMEM pads a 2-D array's rows.
    table = jnp.minimum(page_table, num_pages - 1).astype(jnp.int32).reshape(-1)
    layer = jnp.reshape(layer, (1,)).astype(jnp.int32)

    def row_block(i, order_ref, *_):
        return (order_ref[i], 0, 0)

    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=5, grid=(batch,),
        in_specs=[pl.BlockSpec((1, num_heads, head_dim), row_block),
                  pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec((1, num_heads, head_dim), row_block),
        scratch_shapes=[pltpu.VMEM((2, plan.per_block * plan.page_rows, head_dim), pages.dtype),
                        pltpu.SemaphoreType.DMA((2,))])
    call = pl.pallas_call(
        functools.partial(_kernel, plan=plan, sm_scale=sm_scale, interpret=interpret),
        grid_spec=grid_spec, out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        # The grid is walked in order: each step starts the copies of the next one's block.
        compiler_params=pltpu.CompilerParams(dimension_semantics=("arbitrary",)),
        interpret=pltpu.InterpretParams() if interpret else False)
    # Each page as [ps * 2K, H] rows (free: the pool is contiguous), so a page's DMA lands in
    # a flat block buffer whose rows a strided load splits per kv head.
    pool = pages.reshape(*pages.shape[:2], plan.page_rows, head_dim)
    return call(order, kv_lens, first_block, table, layer, q, pool)


def _kernel(order_ref, lens_ref, first_ref, table_ref, layer_ref, q_ref, pool_ref, o_ref, buf,
            sems, *, plan: _Plan, sm_scale: float, interpret: bool):
    """Grid step i: row order[i], its blocks in turn (module docstring)."""
    step = pl.program_id(0)

    def row_pages(i):
        return (lens_ref[order_ref[i]] + plan.page_size - 1) // plan.page_size

    def copies(i, j):
        """(copy needed, DMA) for each page of row order[i]'s block j."""
        row, held = order_ref[i], row_pages(i)
        slot = (first_ref[i] + j) % 2
        out = []
        for p in range(plan.per_block):
            column = j * plan.per_block + p
            page = table_ref[row * plan.width + jnp.minimum(column, plan.width - 1)]
            rows = pl.ds(p * plan.page_rows, plan.page_rows)
            out.append((column < held, pltpu.make_async_copy(
                pool_ref.at[layer_ref[0], page], buf.at[slot, rows], sems.at[slot])))
        return out

    def start(i, j):
        for needed, copy in copies(i, j):
            pl.when(needed)(copy.start)

    def wait(i, j):
        for needed, copy in copies(i, j):
            pl.when(needed)(copy.wait)

    @pl.when(step == 0)
    def _first():
        # Positions past a row's length in its last block hold whatever an earlier block
        # left (finite) or, before any copy, uninitialised VMEM: zero it once, since a
        # masked score times a NaN value is still NaN.
        buf[...] = jnp.zeros(buf.shape, buf.dtype)
        start(0, 0)

    length = lens_ref[order_ref[step]]
    num_blocks = (row_pages(step) + plan.per_block - 1) // plan.per_block

    def block(j, carry):
        @pl.when(j + 1 < num_blocks)
        def _next_block():
            start(step, j + 1)

        @pl.when((j + 1 == num_blocks) & (step + 1 < pl.num_programs(0)))
        def _next_row():
            start(jnp.minimum(step + 1, pl.num_programs(0) - 1), 0)

        wait(step, j)
        slot = (first_ref[step] + j) % 2
        keys, values = _split_heads(buf.at[slot], plan.block_len, plan.kv_heads, interpret)
        positions = j * plan.block_len + jax.lax.broadcasted_iota(
            jnp.int32, (1, plan.block_len), 1)
        live = positions < length
        g = plan.groups
        return tuple(_online_softmax(state, q_ref[0, h * g:(h + 1) * g, :], keys[h], values[h],
                                     live, sm_scale) for h, state in enumerate(carry))

    init = tuple((jnp.full((plan.groups, 1), _MASKED, jnp.float32),
                  jnp.zeros((plan.groups, 1), jnp.float32),
                  jnp.zeros((plan.groups, plan.head_dim), jnp.float32))
                 for _ in range(plan.kv_heads))
    final = jax.lax.fori_loop(0, num_blocks, block, init)
    for h, (_, l, acc) in enumerate(final):
        o_ref[0, h * plan.groups:(h + 1) * plan.groups, :] = (
            acc / jnp.where(l > 0, l, 1.0)).astype(o_ref.dtype)


def _online_softmax(state, q, keys, values, live, sm_scale):
    """One kv head's running (max, sum, output) after one more block of its keys and values."""
    m, l, acc = state
    s = jax.lax.dot_general(q, keys, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.float32) * sm_scale
    s = jnp.where(live, s, _MASKED)
    m_new = jnp.maximum(m, s.max(axis=1, keepdims=True))
    p = jnp.exp(s - m_new)
    alpha = jnp.exp(m - m_new)
    pv = jax.lax.dot_general(p.astype(values.dtype), values, (((1,), (0,)), ((), ())),
                             preferred_element_type=jnp.float32)
    return m_new, alpha * l + p.sum(axis=1, keepdims=True), alpha * acc + pv


def _split_heads(block_ref, positions: int, kv_heads: int, interpret: bool):
    """A block's rows [positions * 2K, H] as K keys and K values of [positions, H] each,
    by strided loads. Mosaic loads strided rows of 32-bit data only; bfloat16 packs two rows
    of the second-minor axis in a 32-bit word, so a word holds kv head h's key (row 2h, low
    half) and its value (row 2h + 1, high half) at one position (the packing JAX's own ragged
    kernel reads the same way). Pallas' interpreter cannot bitcast a ref and has no packing:
    interpreted, bfloat16 rows are loaded strided as they are, so that path is checked by
    compiling for TPU topologies, not numerically."""
    if jnp.dtype(block_ref.dtype).itemsize == 4 or interpret:
        step = 2 * kv_heads
        return ([block_ref[pl.ds(2 * h, positions, stride=step), :] for h in range(kv_heads)],
                [block_ref[pl.ds(2 * h + 1, positions, stride=step), :]
                 for h in range(kv_heads)])
    if block_ref.dtype != jnp.bfloat16:
        raise ValueError(f"the TPU paged decode kernel reads float32 or bfloat16 pages, "
                         f"got {block_ref.dtype}")
    words = block_ref.bitcast(jnp.uint32)  # [positions * K, H]
    keys, values = [], []
    for h in range(kv_heads):
        pair = words[pl.ds(h, positions, stride=kv_heads), :]
        keys.append(pltpu.bitcast(pair << 16, jnp.float32).astype(jnp.bfloat16))
        values.append(pltpu.bitcast(pair & jnp.uint32(0xFFFF0000), jnp.float32)
                      .astype(jnp.bfloat16))
    return keys, values


def block_plan(kv_lens, *, page_size: int, width: int) -> dict:
    """What one call copies, from the kernel's own plan: the pages each row's DMAs move (its
    live pages, each once) and the blocks it computes."""
    kv_lens = np.asarray(kv_lens, np.int64)
    held = -(-kv_lens // page_size)
    per_block = pages_per_block(page_size, width)
    return {"pages_copied": int(held.sum()), "blocks": int((-(-held // per_block)).sum()),
            "pages_per_block": per_block}
