"""Attention for training and scoring: each query of a row against that row's own keys (no
cache, S == T, keys in the queries' order), without holding the [T, S] score matrix.

    out = attend(q, k, v, positions=positions, segment_ids=segment_ids, impl="auto",
                 dtype=jnp.bfloat16, mesh=trainer_mesh)  # [B, T, K, G, H]

A row may hold several trajectories (packing): `segment_ids` [B, T] tells them apart, and a
query attends the keys of its own segment whose positions are at most its own. Segment 0 may
be padding: its queries' outputs are finite and meaningless (the loss gives them no weight).
`segment_ids=None` is a row of one trajectory with a padding tail. Within a segment the tokens
are contiguous and their positions rise along the row (packing and right-padding both lay rows
out so), so causal by position is causal by index: the kernels apply the latter, `dense` and
`blockwise` the former; with None the positions rise along the whole row.

The implementations (names in asyncrl/model/attention_names.py, `config.train.attention`):
  dense      scores [B, K, G, T, S] in float32: the reference, and what a cache's `mask` takes
             (`attend_masked`).
  blockwise  XLA, any platform: an online softmax over key blocks of `block` tokens, a
             custom VJP that recomputes each block's scores in the backward pass, and blocks
             that no query of the query block may see are skipped. Holds O(block^2) scores.
  splash     jax's Pallas splash attention (TPU): causal mask + segment ids, grouped-query
             heads natively (query head k*G + g reads kv head k); T padded to a multiple of
             128, tiles of 512, 256 or 128 tokens (the largest that divides it).
  flash_gpu  jax's Pallas flash attention for GPU (Triton): segment ids, kv heads repeated to
             the query heads; T padded to a power-of-2 tile of 32-128 tokens.
  cudnn      jax.nn.dot_product_attention(implementation='cudnn'): grouped-query heads
             natively, but no segment ids, so rows of one trajectory only.
  auto       splash on TPU, flash_gpu on GPU, blockwise elsewhere, chosen at trace time.

A Pallas or cuDNN call is opaque to XLA's sharding propagation, so under a trainer `mesh`
(rows split over its axis) it runs per shard inside `jax.shard_map`. `interpret=True` runs the
Pallas kernels in Pallas' interpreter on any platform (tests, on CPU).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from asyncrl.model.attention_names import ATTENTION_IMPLS
from asyncrl.sections import fail

# Tokens per query / key block of `blockwise`. On this 2-core CPU a gradient at SmolLM2's heads
# (B=2, T=2048, K=3, G=3, H=64, float32) took 0.76 s / 41 MiB of temporaries at 128, 0.63 s /
# 58 MiB at 256 and 1.16 s / 119 MiB at 512 (dense at B=4, T=1024: 1.0 s, 450 MiB).
BLOCKWISE_BLOCK = 256
_FIELD = "train.attention"
# The floor of the scores where a key is hidden, as the dense softmax has always used: finite,
# so a query that sees nothing in a block never computes inf - inf.
_HIDDEN = float(np.finfo(np.float32).min)
_FAR = int(np.iinfo(np.int32).max)  # the position of a block's padding: no real query sees it
_AUTO = {"tpu": "splash", "gpu": "flash_gpu"}  # any other platform: blockwise
_RUNS_ON = {"splash": "tpu", "flash_gpu": "gpu", "cudnn": "gpu"}


def attend(q, k, v, *, positions, segment_ids, impl: str, dtype, mesh=None,
           interpret: bool = False, block: int | None = None):
    """q [B, T, K, G, H], k / v [B, T, K, H], positions [B, T] int, segment_ids [B, T] int or
    None -> [B, T, K, G, H] in `dtype`.

    impl: a name of ATTENTION_IMPLS; one this trace's platform cannot run (or cudnn given
    segment ids) is a ConfigError naming config.train.attention. mesh: the trainer's mesh,
    rows split over its axes; the kernels then run per shard. interpret: the Pallas kernels in
    Pallas' interpreter (any platform). block: blockwise's block size in tokens.
    """
    name = _resolve(impl, segment_ids, interpret)
    if name == "dense":
        visible = _visible(positions, positions, segment_ids, segment_ids)
        return attend_masked(q, k, v, visible, dtype)
    if name == "blockwise":
        segments = jnp.zeros_like(positions) if segment_ids is None else segment_ids
        block = block or BLOCKWISE_BLOCK
        return _blockwise(q, k, v, positions, segments, min(block, q.shape[1]), dtype)
    kernel = functools.partial(_KERNELS[name], interpret=interpret)
    if mesh is not None:
        rows = PartitionSpec(mesh.axis_names)
        # Pallas calls carry no varying-manual-axes rule, hence check_vma=False.
        kernel = jax.shard_map(kernel, mesh=mesh, in_specs=(rows, rows, rows, rows),
                               out_specs=rows, check_vma=False)
    return kernel(q, k, v, segment_ids).astype(dtype)


def target_platform() -> str:
    """What this trace compiles for. A deviceless TPU compile on a CPU host
    (asyncrl/plan/tpu_compile.py) makes a TPU device the default one, so that comes first; the
    default backend otherwise."""
    device = jax.config.jax_default_device
    if device is None:
        return jax.default_backend()
    return device if isinstance(device, str) else device.platform


def check_runs_here(impl: str, packed: bool) -> str:
    """What `impl` resolves to on this process's platform, or the ConfigError a trace would
    raise: asked before anything loads, not at the first train step."""
    return _resolve(impl, True if packed else None, interpret=False)


def _resolve(impl: str, segment_ids, interpret: bool) -> str:
    """The implementation `impl` names on this trace's platform, or a ConfigError."""
    if impl not in ATTENTION_IMPLS:
        fail(_FIELD, impl, f"one of {', '.join(ATTENTION_IMPLS)}")
    platform = target_platform()
    name = _AUTO.get(platform, "blockwise") if impl == "auto" else impl
    if name == "cudnn" and segment_ids is not None:
        fail(_FIELD, impl, "cudnn takes no segment ids, so it cannot run packed rows; use "
             "'flash_gpu' or 'auto'")
    needs = _RUNS_ON.get(name)
    if needs not in (None, platform) and (name == "cudnn" or not interpret):
        fail(_FIELD, impl, f"{name} runs on {needs.upper()} only and this step is compiled "
             f"for {platform.upper()}; use 'auto' (here {_AUTO.get(platform, 'blockwise')}) "
             f"or 'blockwise'")
    return name


def _visible(pos_q, pos_k, seg_q, seg_k):
    """[B, Tq, Tk]: which keys each query sees (causal by position, within its segment)."""
    causal = pos_k[:, None, :] <= pos_q[:, :, None]
    if seg_q is None:
        return causal
    return causal & (seg_k[:, None, :] == seg_q[:, :, None])


def _scores(q, keys):
    """q [B, T, K, G, H], keys [B, S, K, H] -> float32 [B, K, G, T, S], scaled."""
    return jnp.einsum("BTKGH,BSKH->BKGTS", q, keys,
                      preferred_element_type=jnp.float32) * q.shape[-1] ** -0.5


def attend_masked(q, keys, values, mask, dtype):
    """Dense: q [B, T, K, G, H], keys / values [B, S, K, H], mask [B, T, S] -> [B, T, K, G, H]."""
    scores = jnp.where(mask[:, None, None], _scores(q, keys), _HIDDEN)
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    return jnp.einsum("BKGTS,BSKH->BTKGH", probs, values.astype(dtype))


# ---------------------------------------------------------------------------------------------
# blockwise: online softmax (FlashAttention-2's recurrences) in XLA loops

def _split(x, block: int, fill):
    """[B, T, ...] -> [T/block, B, block, ...], the tail padded with `fill`."""
    blocks = -(-x.shape[1] // block)
    pad = [(0, 0), (0, blocks * block - x.shape[1])] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, pad, constant_values=fill)
    return jnp.moveaxis(x.reshape(x.shape[0], blocks, block, *x.shape[2:]), 1, 0)


def _join(x, length: int):
    """`_split`'s inverse: [T/block, B, block, ...] -> [B, length, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]


def _blocks(q, k, v, positions, segment_ids, block: int):
    """The operands cut into blocks; padding keys sit at a position no real query reaches, in
    a segment of their own, so padding queries see (only) them and stay finite."""
    return (_split(q, block, 0), _split(k, block, 0), _split(v, block, 0),
            _split(positions, block, _FAR), _split(segment_ids, block, -1))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _blockwise(q, k, v, positions, segment_ids, block: int, dtype):
    return _blockwise_fwd(q, k, v, positions, segment_ids, block, dtype)[0]


def _blockwise_fwd(q, k, v, positions, segment_ids, block: int, dtype):
    qb, kb, vb, pb, sb = _blocks(q, k, v, positions, segment_ids, block)
    batch, _, kv_heads, groups, head_dim = q.shape
    rows = (batch, kv_heads, groups, block)

    def query_block(xs):
        qi, pi, si = xs

        def key_block(carry, ys):
            kj, vj, pj, sj = ys
            visible = _visible(pi, pj, si, sj)[:, None, None]  # [B, 1, 1, Tq, Tk]

            def update(carry):
                acc, top, total = carry
                scores = jnp.where(visible, _scores(qi, kj), _HIDDEN)
                new_top = jnp.maximum(top, scores.max(-1))
                probs = jnp.exp(scores - new_top[..., None])
                fade = jnp.exp(top - new_top)  # rescales what earlier blocks summed
                acc = acc * fade[..., None] + jnp.einsum(
                    "BKGTS,BSKH->BKGTH", probs.astype(dtype), vj.astype(dtype),
                    preferred_element_type=jnp.float32)
                return acc, new_top, total * fade + probs.sum(-1)

            return jax.lax.cond(jnp.any(visible), update, lambda c: c, carry), None

        init = (jnp.zeros((*rows, head_dim), jnp.float32), jnp.full(rows, _HIDDEN),
                jnp.zeros(rows, jnp.float32))
        (acc, top, total), _ = jax.lax.scan(key_block, init, (kb, vb, pb, sb))
        out = (acc / total[..., None]).transpose(0, 3, 1, 2, 4)  # [B, Tq, K, G, H]
        return out.astype(dtype), top + jnp.log(total)

    out, lse = jax.lax.map(query_block, (qb, pb, sb))  # lse [T/block, B, K, G, block]
    out = _join(out, q.shape[1])
    return out, (q, k, v, positions, segment_ids, out, lse)


def _blockwise_bwd(block: int, dtype, residuals, d_out):
    q, k, v, positions, segment_ids, out, lse = residuals
    delta = jnp.sum(d_out.astype(jnp.float32) * out.astype(jnp.float32), -1)  # [B, T, K, G]
    qb, kb, vb, pb, sb = _blocks(q, k, v, positions, segment_ids, block)
    dob, deltab = _split(d_out.astype(dtype), block, 0), _split(delta, block, 0)
    scale = q.shape[-1] ** -0.5

    def key_block(dq, ys):
        kj, vj, pj, sj = ys

        def query_block(carry, xs):
            qi, doi, di, lsei, pi, si = xs
            visible = _visible(pi, pj, si, sj)[:, None, None]

            def grads(_):
                scores = jnp.where(visible, _scores(qi, kj), _HIDDEN)
                probs = jnp.exp(scores - lsei[..., None])  # [B, K, G, Tq, Tk]
                d_v = jnp.einsum("BKGTS,BTKGH->BSKH", probs.astype(dtype), doi,
                                 preferred_element_type=jnp.float32)
                d_probs = jnp.einsum("BTKGH,BSKH->BKGTS", doi, vj.astype(dtype),
                                     preferred_element_type=jnp.float32)
                d_scores = probs * (d_probs - di.transpose(0, 2, 3, 1)[..., None]) * scale
                d_scores = d_scores.astype(q.dtype)
                d_k = jnp.einsum("BKGTS,BTKGH->BSKH", d_scores, qi,
                                 preferred_element_type=jnp.float32)
                d_q = jnp.einsum("BKGTS,BSKH->BTKGH", d_scores, kj,
                                 preferred_element_type=jnp.float32)
                return d_k, d_v, d_q

            def nothing(_):
                return (jnp.zeros(kj.shape, jnp.float32), jnp.zeros(vj.shape, jnp.float32),
                        jnp.zeros(qi.shape, jnp.float32))

            d_k, d_v, d_q = jax.lax.cond(jnp.any(visible), grads, nothing, None)
            return (carry[0] + d_k, carry[1] + d_v), d_q

        zeros = jnp.zeros(kj.shape, jnp.float32)
        (d_k, d_v), d_q = jax.lax.scan(query_block, (zeros, zeros),
                                       (qb, dob, deltab, lse, pb, sb))
        return dq + d_q, (d_k, d_v)

    dq, (dk, dv) = jax.lax.scan(key_block, jnp.zeros(qb.shape, jnp.float32), (kb, vb, pb, sb))
    length = q.shape[1]
    return (_join(dq, length).astype(q.dtype), _join(dk, length).astype(k.dtype),
            _join(dv, length).astype(v.dtype), None, None)


_blockwise.defvjp(_blockwise_fwd, _blockwise_bwd)


# ---------------------------------------------------------------------------------------------
# kernels: (q, k, v, segment_ids, *, interpret) -> [B, T, K, G, H]

def _pad_rows(x, length: int, fill=0):
    """[B, T, ...] -> [B, length, ...]: the kernels' tiles need T a multiple of the tile."""
    return jnp.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2),
                   constant_values=fill)


def _splash(q, k, v, segment_ids, *, interpret: bool):
    from jax.experimental.pallas.ops.tpu import splash_attention as splash
    batch, length, kv_heads, groups, head_dim = q.shape
    heads = kv_heads * groups
    padded, tile = splash_tiles(length)
    # Splash takes no scale: the queries come scaled. [B, N, T, H] and [B, K, T, H]; query
    # head k * G + g meets kv head (k * G + g) // G = k, the model's grouping.
    q = (q.astype(jnp.float32) * head_dim ** -0.5).astype(q.dtype).reshape(
        batch, length, heads, head_dim)
    q, k, v = (_pad_rows(x, padded).transpose(0, 2, 1, 3) for x in (q, k, v))
    sizes = splash.BlockSizes(
        block_q=tile, block_kv=tile, block_kv_compute=tile, block_q_dkv=tile,
        block_kv_dkv=tile, block_kv_dkv_compute=tile, block_q_dq=tile, block_kv_dq=tile)
    mask = splash.MultiHeadMask([splash.CausalMask((padded, padded))] * heads)
    kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                    interpret=interpret)
    if segment_ids is None:
        out = jax.vmap(kernel)(q, k, v)
    else:
        segments = _pad_rows(segment_ids, padded, -1)
        out = jax.vmap(kernel)(q, k, v, splash.SegmentIds(segments, segments))
    out = out.transpose(0, 2, 1, 3)[:, :length]
    return out.reshape(batch, length, kv_heads, groups, head_dim)


def splash_tiles(length: int) -> tuple[int, int]:
    """(padded length, tile) of splash's block plan for rows of `length` tokens: rows padded
    to a multiple of 128, square tiles of 512, 256 or 128 (the largest that divides it).
    The planner counts the kernel's cost from the same plan (asyncrl/plan/kernel_cost.py)."""
    padded = -(-length // 128) * 128
    return padded, next(t for t in (512, 256, 128) if padded % t == 0)


def _flash_gpu(q, k, v, segment_ids, *, interpret: bool):
    from jax.experimental.pallas.ops.gpu import attention as flash
    batch, length, kv_heads, groups, head_dim = q.shape
    # Triton tiles are powers of 2; the kernel's backward tiles are 32 and its forward ones
    # min(128, T), and it needs T a multiple of each.
    tile = min(128, 1 << max(length - 1, 31).bit_length())
    padded = -(-length // tile) * tile
    q = _pad_rows(q.reshape(batch, length, kv_heads * groups, head_dim), padded)
    # kv head k repeated for query heads k * G ... k * G + G - 1 (the kernel has no groups)
    k, v = (_pad_rows(jnp.repeat(x, groups, axis=2), padded) for x in (k, v))
    segments = None if segment_ids is None else _pad_rows(segment_ids, padded, -1)
    out = flash.mha(q, k, v, segments, sm_scale=head_dim ** -0.5, causal=True,
                    interpret=interpret)
    return out[:, :length].reshape(batch, length, kv_heads, groups, head_dim)


def _cudnn(q, k, v, segment_ids, *, interpret: bool):
    del segment_ids, interpret  # None (refused otherwise by _resolve); cuDNN has no interpreter
    batch, length, kv_heads, groups, head_dim = q.shape
    out = jax.nn.dot_product_attention(
        q.reshape(batch, length, kv_heads * groups, head_dim), k, v, is_causal=True,
        scale=head_dim ** -0.5, implementation="cudnn")
    return out.reshape(q.shape)


_KERNELS = {"splash": _splash, "flash_gpu": _flash_gpu, "cudnn": _cudnn}
