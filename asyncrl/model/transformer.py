"""One Flax NNX decoder for the Llama family (Llama / SmolLM2, Qwen2, Qwen3).

Shape letters, used in every einsum and `# [...]` comment of the model package:
  B batch   T query length   S key / cache length   L layers
  N query heads   K kv heads   G = N / K query heads per kv head   H head dim
  D model dim     F mlp dim    V vocab

Parameters carry logical axis names (`logical_axes` metadata: 'layers', 'vocab', 'embed',
'heads', 'kv_heads', 'head_dim', 'mlp'); `sharding.shardings_for` maps them onto a mesh, so
the same module runs FSDP on the trainer mesh and replicated / tensor-parallel on a rollout
mesh. The layers are stored stacked (leading L axis) and run under `jax.lax.scan`, so compile
time does not grow with depth: SmolLM2's 30 layers compile as fast as 2.

Engines and trainers use the pure functions at the bottom: `init_params`, `apply`, `KVCache`.
Params are a pytree argument, so weights can be swapped between two decode steps and pushed
between meshes with `jax.device_put`.
"""

from __future__ import annotations

import contextlib
import contextvars

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from asyncrl.model.attention import attend, attend_masked, target_platform
from asyncrl.model.config import ModelConfig
from asyncrl.model.remat import REMAT_POLICIES

_INIT_STDDEV = 0.02  # HF's initializer_range for every family we support


def _param(rngs: nnx.Rngs | None, shape, axes, dtype, init: str = "normal") -> nnx.Param:
    if init == "normal":
        value = _INIT_STDDEV * jax.random.normal(rngs.params(), shape, jnp.float32)
    elif init == "ones":
        value = jnp.ones(shape, jnp.float32)
    else:
        value = jnp.zeros(shape, jnp.float32)
    return nnx.Param(value.astype(dtype), logical_axes=tuple(axes))


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, normalised in float32 like HF's LlamaRMSNorm."""

    def __init__(self, dim: int, eps: float, dtype, *, stack=(), stack_axes=(), axis="embed"):
        self.eps = eps
        self.scale = _param(None, (*stack, dim), (*stack_axes, axis), dtype, "ones")

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        scale = self.scale[...].reshape((1,) * (x.ndim - 1) + (-1,))  # explicit, no rank promotion
        return scale * normed.astype(x.dtype)


def rope_frequencies(config: ModelConfig) -> np.ndarray:
    """inv_freq [H/2] as HF computes it, with Llama 3's low-frequency slow-down if set."""
    h = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, h, 2, dtype=np.float32) / h))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq.astype(np.float32)
    # transformers' _compute_llama3_parameters: wavelengths above original_max_len /
    # low_freq_factor are divided by `factor`, below original_max_len / high_freq_factor kept,
    # and the band between interpolated smoothly.
    wavelen = 2 * np.pi / inv_freq
    low_wavelen = scaling.original_max_len / scaling.low_freq_factor
    high_wavelen = scaling.original_max_len / scaling.high_freq_factor
    scaled = np.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((scaling.original_max_len / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_angles(positions, inv_freq):
    """sin, cos of shape [B, T, H/2] for integer positions [B, T]."""
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None]
    return jnp.sin(angles), jnp.cos(angles)


def apply_rope(x, sin, cos):
    """HF's rotate-half layout: the pairs are (x[i], x[i + H/2]), not interleaved."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)  # [B, T, N, H/2] each
    sin, cos = sin[:, :, None, :], cos[:, :, None, :]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(x.dtype)


class Attention(nnx.Module):
    """Grouped-query attention with optional q/k/v bias (Qwen2) and q/k RMSNorm (Qwen3)."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs, *, stack=(), stack_axes=()):
        c, dt = config, config.param_dtype
        d, n, k, h = c.hidden_dim, c.num_heads, c.num_kv_heads, c.head_dim
        nh, kh = (*stack_axes, "heads", "head_dim"), (*stack_axes, "kv_heads", "head_dim")
        self.config = config
        self.q = _param(rngs, (*stack, d, n, h), (*stack_axes, "embed", *nh[-2:]), dt)
        self.k = _param(rngs, (*stack, d, k, h), (*stack_axes, "embed", *kh[-2:]), dt)
        self.v = _param(rngs, (*stack, d, k, h), (*stack_axes, "embed", *kh[-2:]), dt)
        self.o = _param(rngs, (*stack, n, h, d), (*nh, "embed"), dt)
        if c.qkv_bias:
            self.q_bias = _param(None, (*stack, n, h), nh, dt, "zeros")
            self.k_bias = _param(None, (*stack, k, h), kh, dt, "zeros")
            self.v_bias = _param(None, (*stack, k, h), kh, dt, "zeros")
        if c.qk_norm:
            norm = dict(stack=stack, stack_axes=stack_axes, axis="head_dim")
            self.q_norm = RMSNorm(h, c.norm_eps, dt, **norm)
            self.k_norm = RMSNorm(h, c.norm_eps, dt, **norm)

    def __call__(self, x, positions, sin, cos, cache, segment_ids=None, attention="dense",
                 mesh=None):
        """x [B, T, D], positions [B, T]; cache None or a KVCache / PagedKVCache holding every
        layer, with `layer` set to this one (see `Decoder.hidden`); segment_ids None or [B, T]
        int32, rows packed with several sequences (no cache): a token sees its own only.
        attention, mesh: how a call without a cache attends (asyncrl/model/attention.py).

        Returns the attention output [B, T, D] and the updated cache."""
        c = self.config
        q = jnp.einsum("BTD,DNH->BTNH", x, self.q[...])
        k = jnp.einsum("BTD,DKH->BTKH", x, self.k[...])
        v = jnp.einsum("BTD,DKH->BTKH", x, self.v[...])
        if c.qkv_bias:
            q = q + self.q_bias[...][None, None]
            k = k + self.k_bias[...][None, None]
            v = v + self.v_bias[...][None, None]
        if c.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, sin, cos), apply_rope(k, sin, cos)
        batch, length = x.shape[:2]
        q = q.reshape(batch, length, c.num_kv_heads, c.num_groups, c.head_dim)

        if cache is None:
            return self._out(attend(q, k, v, positions=positions, segment_ids=segment_ids,
                                    impl=attention, dtype=x.dtype, mesh=mesh)), None
        out, cache = cache.attend(q, k, v, positions, x.dtype)
        return self._out(out), cache

    def _out(self, out):
        """[B, T, K, G, H] -> [B, T, D]."""
        c = self.config
        out = out.reshape(*out.shape[:2], c.num_heads, c.head_dim)
        return jnp.einsum("BTNH,NHD->BTD", out, self.o[...])


def _flat_decode() -> bool:
    """Whether one-token decode uses `_attend_one_flat` (decided at trace time).

    XLA:CPU runs a dot with its batch dims leading, so `attend_masked`'s K batch dim makes it
    transpose every layer's [B, S, K, H] cache into a fresh [B, K, ...] buffer on every step:
    another pass over the cache. Other backends keep `attend_masked`: TPU chooses operand layouts
    itself, and a K batch dim is what tensor parallelism over kv heads needs (the flat form
    contracts over K * H, so a K-sharded cache would need an all-reduce). Not yet measured on
    GPU, where a fused decode-attention kernel is the real fix.
    """
    return target_platform() == "cpu"


def _attend_one_flat(q, keys, values, mask, dtype):
    """`attend_masked` for one query per row, reading the cache in its own layout.

    q [B, K, G, H], keys / values [B, S, K, H], mask [B, S] -> [B, K, G, H]. Heads are
    flattened, C = K * H: the queries become block-diagonal [B, N, C] (query head (k, g) is
    zero outside kv head k's H columns), so both dots contract or keep C as the cache's
    minor dim and need no transpose. That does K times the attention flops, which decode
    can afford: it is bound by reading the cache, not by arithmetic.
    """
    batch, kv_heads, groups, head_dim = q.shape
    own = jnp.eye(kv_heads, dtype=bool)[None, :, None, :, None]  # [1, K, 1, K, 1]
    q_blocks = jnp.where(own, q[:, :, :, None, :], jnp.zeros((), q.dtype))
    q_blocks = q_blocks.reshape(batch, kv_heads * groups, kv_heads * head_dim)  # [B, N, C]
    flat_k = keys.reshape(*keys.shape[:2], -1).astype(q.dtype)  # [B, S, C], a free reshape
    flat_v = values.reshape(*values.shape[:2], -1).astype(dtype)
    scores = jnp.einsum("BSC,BNC->BSN", flat_k, q_blocks,
                        preferred_element_type=jnp.float32) * head_dim ** -0.5
    scores = jnp.where(mask[:, :, None], scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=1).astype(dtype)  # [B, S, N]
    every = jnp.einsum("BSN,BSC->BNC", probs, flat_v)  # head (k, g) against all K kv heads
    every = every.reshape(batch, kv_heads, groups, kv_heads, head_dim)
    # Keep each query head's own kv head by selecting it (not by multiplying with the
    # identity, which would let a non-finite value from another head turn into NaN).
    return jnp.diagonal(every, axis1=1, axis2=3).transpose(0, 3, 1, 2)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs, *, stack=(), stack_axes=()):
        d, f, dt = config.hidden_dim, config.mlp_dim, config.param_dtype
        self.gate = _param(rngs, (*stack, d, f), (*stack_axes, "embed", "mlp"), dt)
        self.up = _param(rngs, (*stack, d, f), (*stack_axes, "embed", "mlp"), dt)
        self.down = _param(rngs, (*stack, f, d), (*stack_axes, "mlp", "embed"), dt)

    def __call__(self, x):
        gate = jnp.einsum("BTD,DF->BTF", x, self.gate[...])
        up = jnp.einsum("BTD,DF->BTF", x, self.up[...])
        return jnp.einsum("BTF,FD->BTD", jax.nn.silu(gate) * up, self.down[...])


class Block(nnx.Module):
    """Pre-norm decoder layer. Built with stack=(L,) it holds all L layers' weights."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs, *, stack=(), stack_axes=()):
        s = dict(stack=stack, stack_axes=stack_axes)
        self.attn_norm = RMSNorm(config.hidden_dim, config.norm_eps, config.param_dtype, **s)
        self.attn = Attention(config, rngs, **s)
        self.mlp_norm = RMSNorm(config.hidden_dim, config.norm_eps, config.param_dtype, **s)
        self.mlp = MLP(config, rngs, **s)

    def __call__(self, x, positions, sin, cos, cache, segment_ids=None, attention="dense",
                 mesh=None):
        attn_out, cache = self.attn(self.attn_norm(x), positions, sin, cos, cache, segment_ids,
                                    attention, mesh)
        x = x + attn_out
        return x + self.mlp(self.mlp_norm(x)), cache


_UNROLL_LAYERS = contextvars.ContextVar("unroll_layers", default=False)


@contextlib.contextmanager
def unrolled_layers():
    """While active, `Decoder.hidden` traces its layer scan fully unrolled.

    The reference of tests/test_plan.py for asyncrl/plan/hlo_cost.py's loop counting: XLA's
    cost analysis counts a while loop's body once whatever its trip count, so a scanned
    model reads as one layer's bytes and flops; unrolled, every layer is its own code and is
    counted. Nothing else uses it. Off by default because
    compile time then grows with depth. It is read at trace time and jit's cache does not know
    of it: a function traced before keeps its loop, so trace a fresh one inside the block.
    """
    token = _UNROLL_LAYERS.set(True)
    try:
        yield
    finally:
        _UNROLL_LAYERS.reset(token)


class Decoder(nnx.Module):
    """Embedding, L stacked blocks, final norm, tied or untied unembedding."""

    def __init__(self, config: ModelConfig, rngs: nnx.Rngs):
        c, dt = config, config.param_dtype
        self.config = config
        self.embed = _param(rngs, (c.vocab_size, c.hidden_dim), ("vocab", "embed"), dt)
        self.blocks = Block(c, rngs, stack=(c.num_layers,), stack_axes=("layers",))
        self.final_norm = RMSNorm(c.hidden_dim, c.norm_eps, dt)
        if not c.tie_embeddings:
            # [V, D] like the embedding, so tied and untied share one unembed einsum.
            self.lm_head = _param(rngs, (c.vocab_size, c.hidden_dim), ("vocab", "embed"), dt)

    def __call__(self, tokens, positions, cache=None, logits_at=None):
        """tokens, positions [B, T] int32; cache None, a KVCache or a PagedKVCache;
        logits_at None or [B] int32, the one index along T per row whose logits are wanted.

        Returns logits [B, T, V] float32 ([B, 1, V] with logits_at) and the updated cache
        (None without a cache).
        """
        x, cache = self.hidden(tokens, positions, cache)
        if logits_at is not None:
            # A prefill needs the last prompt token's logits only; unembedding every padded
            # position would cost T x V x D, a fifth of a prefill's arithmetic at SmolLM2's
            # shapes.
            x = jnp.take_along_axis(x, logits_at[:, None, None], axis=1)
        return unembed(x, self.unembedding_table()), cache

    def hidden(self, tokens, positions, cache=None, remat: str = "none", segment_ids=None,
               attention: str = "dense", mesh=None):
        """The final-normed hidden states [B, T, D] that the unembedding reads, and the
        updated cache (None without one). remat: a REMAT_POLICIES name; it only matters
        under differentiation. segment_ids: None, or [B, T] int32 for rows packed with
        several sequences (0 on padding, 1..k along a row; positions restart at 0 in each):
        attention stays within a sequence. Without a cache only, as are `attention` (an
        ATTENTION_IMPLS name: 'dense' holds the [T, S] scores, the others never do) and
        `mesh` (the trainer's: its Pallas kernels run per shard)."""
        if segment_ids is not None and cache is not None:
            raise ValueError("segment_ids (packed rows) apply without a cache only")
        c = self.config
        x = jnp.take(self.embed[...], tokens, axis=0)  # [B, T, D]
        sin, cos = rope_angles(positions, rope_frequencies(c))
        block_def, block_params = nnx.split(self.blocks)

        # Scan over the stacked leading L axis; each step rebuilds one layer's Block view.
        if cache is None:
            def layer(x, params):
                return nnx.merge(block_def, params)(x, positions, sin, cos, None,
                                                    segment_ids, attention, mesh)[0], None

            policy = REMAT_POLICIES.get(remat)()
            if policy is not None:
                layer = jax.checkpoint(layer, policy=policy, prevent_cse=False)
            x, _ = jax.lax.scan(layer, x, block_params, unroll=_UNROLL_LAYERS.get())
        else:
            # The whole cache rides in the carry and each layer writes its rows into it.
            # Scanning it as xs / ys instead slices a layer out, copies it, and writes it
            # back into a fresh ys buffer: several copies of the cache per decode step.
            def layer(carry, xs):
                x, cache = carry
                params, index = xs
                x, cache = nnx.merge(block_def, params)(x, positions, sin, cos,
                                                        cache.replace(layer=index))
                return (x, cache), None

            layers = jnp.arange(c.num_layers, dtype=jnp.int32)
            (x, cache), _ = jax.lax.scan(layer, (x, cache.replace(layer=layers[0])),
                                         (block_params, layers), unroll=_UNROLL_LAYERS.get())
            cache = cache.replace(layer=None)  # the caller's pytree structure, unchanged
        return self.final_norm(x), cache

    def unembedding_table(self) -> jax.Array:
        """[V, D]: the embedding itself when tied, else lm_head."""
        return self.embed[...] if self.config.tie_embeddings else self.lm_head[...]


def unembed(hidden, table):
    """logits [..., V] float32 from final hidden states [..., D] and the table [V, D]."""
    return jnp.einsum("...D,VD->...V", hidden, table, preferred_element_type=jnp.float32)


@flax.struct.dataclass
class KVCache:
    """Keys and values of every layer; slot j of row b holds the token at position j."""

    k: jax.Array  # [L, B, S, K, H]
    v: jax.Array  # [L, B, S, K, H]
    layer: jax.Array | None = None  # int32 scalar: the layer attending now (set by the scan)

    @classmethod
    def init(cls, config: ModelConfig, batch: int, max_len: int, dtype=None) -> "KVCache":
        dtype = jnp.dtype(dtype or config.param_dtype)
        shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
        return cls(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype))

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def attend(self, q, k, v, positions, dtype):
        """Writes this layer's k / v [B, T, K, H] at `positions` and attends q [B, T, K, G, H]
        over slots j <= position. Returns ([B, T, K, G, H], the updated cache)."""
        batch = q.shape[0]
        # One scatter into the full stacked cache, which is the scan carry: XLA updates the
        # carried buffer in place, so a step writes B*T rows instead of copying the cache.
        # mode="drop": writes at index >= S vanish instead of clamping onto the last slot.
        at = (jnp.broadcast_to(self.layer, positions.shape), jnp.arange(batch)[:, None],
              positions)
        cache_k = self.k.at[at].set(k.astype(self.k.dtype), mode="drop")
        cache_v = self.v.at[at].set(v.astype(self.v.dtype), mode="drop")
        keys = jax.lax.dynamic_index_in_dim(cache_k, self.layer, keepdims=False)  # [B, S, K, H]
        values = jax.lax.dynamic_index_in_dim(cache_v, self.layer, keepdims=False)
        return attend_cached(q, keys, values, positions, dtype), self.replace(k=cache_k, v=cache_v)


def attend_cached(q, keys, values, positions, dtype):
    """q [B, T, K, G, H] at `positions` [B, T] over cached keys / values [B, S, K, H], slot j
    holding position j: each query sees slots j <= its position. [B, T, K, G, H]."""
    mask = jnp.arange(keys.shape[1])[None, None, :] <= positions[:, :, None]  # [B, T, S]
    if q.shape[1] == 1 and _flat_decode():
        return _attend_one_flat(q[:, 0], keys, values, mask[:, 0], dtype)[:, None]
    return attend_masked(q, keys.astype(q.dtype), values.astype(dtype), mask, dtype)


def init_params(config: ModelConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State]:
    """Random weights (HF-style N(0, 0.02), unit norms, zero biases) in config.param_dtype."""
    return nnx.split(Decoder(config, rngs=nnx.Rngs(seed)), nnx.Param)


def abstract_params(config: ModelConfig) -> tuple[nnx.GraphDef, nnx.State]:
    """graphdef and a State of ShapeDtypeStructs (with logical axes), materialising nothing."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))), nnx.Param)


def graphdef_for(config: ModelConfig) -> nnx.GraphDef:
    """The static half of the model, for params that came from a loader or another mesh."""
    return abstract_params(config)[0]


def apply(graphdef: nnx.GraphDef, params: nnx.State, tokens, positions, cache=None,
          logits_at: jax.Array | None = None):
    """logits [B, T, V] float32 for tokens [B, T] at positions [B, T]; with logits_at [B]
    int32, only each row's logits at that index along T: [B, 1, V].

    Without a cache: causal attention among the T tokens, by comparing positions.
    With a PagedKVCache: the same, through its page table (see asyncrl/model/paged.py).
    With a KVCache: each token's k/v is written at slot positions[b, t] (dropped if >= S), and
    the query at positions[b, t] attends to slots j <= positions[b, t]. Prefill is positions
    0..T-1; decode is one token per row at its own position. Right padding at positions
    len, len+1, ... is harmless: later decode steps overwrite those slots before any query
    can see them.

    Pure: jit it with `jax.jit(apply, static_argnums=0)` (a graphdef is hashable) and donate
    the cache.
    """
    return nnx.merge(graphdef, params)(tokens, positions, cache, logits_at)


def apply_hidden(graphdef: nnx.GraphDef, params: nnx.State, tokens, positions,
                 remat: str = "none", segment_ids=None, attention: str = "dense",
                 mesh=None) -> tuple[jax.Array, jax.Array]:
    """The final hidden states [B, T, D] and the unembedding table [V, D], without a cache.

    For a loss that unembeds a few positions at a time (see `unembed`) instead of holding
    logits [B, T, V], which at a real vocabulary dwarf every other activation. remat: what
    the backward pass keeps of each layer (REMAT_POLICIES); segment_ids (packed rows),
    attention and mesh as in `Decoder.hidden`.
    """
    model = nnx.merge(graphdef, params)
    return (model.hidden(tokens, positions, remat=remat, segment_ids=segment_ids,
                         attention=attention, mesh=mesh)[0],
            model.unembedding_table())
