"""A paged KV cache: fixed-size pages in one pool, a page table per sequence.

    pages       [L, P, page_size, 2K, H]  kv head i's key at 2i, its value at 2i + 1: the
                                          layout the TPU kernel reads (asyncrl/model/paged_tpu.py)
    page_table  [B, W] int32              page of positions [w * page_size, (w+1) * page_size)
                                          of row b; P (one past the pool) where none is held

A row attends to its positions 0..position through its page table, so memory follows the
tokens a sequence holds, not a reserved maximum, and several rows may share a page (a GRPO
group's prompt). Which pages a row holds is decided on the host (asyncrl/rollout/pages.py);
the table travels with each call.

Attention reads the pages through one of three backends, chosen at trace time:
  gather        an XLA gather of the pages in the table's columns, then the dense attention
                (CPU, GPU); the engine sends only the columns some row holds a page in
                (`asyncrl.rollout.engine.live_width`), so it reads live pages, not all W;
  tpu_ragged    asyncrl/model/paged_tpu.py's Pallas kernel, which copies only each row's
                pages below its length and nothing for finished or empty slots (TPU);
  gpu_paged     JAX's Pallas GPU paged attention kernel on this pool's layout
                (asyncrl/model/paged_gpu.py), which loads each row's pages below its length
                in compute blocks (GPU).
The kernels run decode (one query per row); prefill chunks gather. Off its platform a
kernel runs in Pallas' interpreter: that is how tests check it against the gather.
Writes are one scatter into the pool (the scan carry, updated in place); a row's writes land
only in pages its table names, and rows marked not `writing` write nothing, so a freed row
cannot touch pages handed to another sequence.
"""

from __future__ import annotations

import importlib
import logging

import flax.struct
import jax
import jax.numpy as jnp

from asyncrl.model.config import ModelConfig

# asyncrl.rollout.pages.ATTENTION_BACKENDS repeats these for config checks that load no model.
BACKENDS = ("auto", "gather", "tpu_ragged", "gpu_paged")
# Imported when a trace calls one: Pallas' TPU and Triton modules are slow to import.
_DECODE_KERNELS = {"tpu_ragged": "asyncrl.model.paged_tpu",
                   "gpu_paged": "asyncrl.model.paged_gpu"}


@flax.struct.dataclass
class PagedKVCache:
    pages: jax.Array  # [L, P, page_size, 2K, H]
    page_table: jax.Array  # [B, W] int32
    writing: jax.Array | None = None  # [B] bool: rows whose k / v are stored (default all)
    layer: jax.Array | None = None  # int32 scalar, set by the layer scan
    backend: str = flax.struct.field(pytree_node=False, default="auto")

    @staticmethod
    def init_pages(config: ModelConfig, num_pages: int, page_size: int, dtype=None) -> jax.Array:
        dtype = jnp.dtype(dtype or config.param_dtype)
        return jnp.zeros((config.num_layers, num_pages, page_size, 2 * config.num_kv_heads,
                          config.head_dim), dtype)

    @property
    def num_pages(self) -> int:
        return self.pages.shape[1]

    @property
    def page_size(self) -> int:
        return self.pages.shape[2]

    def attend(self, q, k, v, positions, dtype):
        """Writes k / v [B, T, K, H] at `positions` [B, T] and attends q [B, T, K, G, H] over
        each row's positions <= its own. Returns ([B, T, K, G, H], the updated cache)."""
        batch, length, kv_heads, groups, head_dim = q.shape
        ps, width = self.page_size, self.page_table.shape[1]
        slot = jnp.minimum(positions // ps, width - 1)
        page = jnp.take_along_axis(self.page_table, slot, axis=1)  # [B, T]
        keep = positions < width * ps
        if self.writing is not None:
            keep &= self.writing[:, None]
        page = jnp.where(keep, page, self.num_pages)  # out of range: mode="drop" skips it
        kv = jnp.stack([k, v], axis=3).reshape(batch, length, 2 * kv_heads, head_dim)
        at = (jnp.broadcast_to(self.layer, positions.shape), page, positions % ps)
        pages = self.pages.at[at].set(kv.astype(self.pages.dtype), mode="drop")
        cache = self.replace(pages=pages)
        backend = resolve_backend(self.backend, head_dim)
        if backend in _DECODE_KERNELS and length == 1:
            return _attend_kernel(backend, cache, q, positions, dtype), cache
        return _attend_gather(cache, q, positions, dtype), cache


def resolve_backend(backend: str, head_dim: int | None = None,
                    platform: str | None = None) -> str:
    """"auto": the platform's decode kernel when compiling for a TPU or a GPU and it can take
    the shape, else the gather. The TPU kernel tiles head_dim by TPU lanes: it needs a
    multiple of 128 (Qwen2.5-0.5B's 64 cannot); the GPU kernel's dots need a multiple of
    16. A kernel named for a shape it cannot take is an error. `platform`: what the program
    is for (default: what this trace compiles for)."""
    from asyncrl.model.attention import target_platform

    if backend not in BACKENDS:
        raise ValueError(f"paged attention backend must be one of {BACKENDS}, got {backend!r}")
    for kernel, multiple in _HEAD_DIM_MULTIPLE.items():
        if backend == kernel and head_dim is not None and head_dim % multiple:
            raise ValueError(f"the {kernel} attention kernel needs head_dim a multiple of "
                             f"{multiple}, the model's is {head_dim}: use 'auto' or 'gather'")
    if backend != "auto":
        if backend in _DECODE_KERNELS:
            _warn_if_interpreted(backend, platform or target_platform())
        return backend
    kernel = {"tpu": "tpu_ragged", "gpu": "gpu_paged", "cuda": "gpu_paged"}.get(
        platform or target_platform())
    fits = kernel is not None and (head_dim is None or head_dim % _HEAD_DIM_MULTIPLE[kernel] == 0)
    return kernel if fits else "gather"


_HEAD_DIM_MULTIPLE = {"tpu_ragged": 128, "gpu_paged": 16}


def _warn_if_interpreted(backend: str, platform: str) -> None:
    """A kernel named off its platform runs in Pallas' interpreter (how tests check it on a
    CPU): correct, and orders of magnitude slower, so it is said, not silent."""
    module = importlib.import_module(_DECODE_KERNELS[backend])
    if platform not in module.PLATFORMS:
        logging.getLogger(__name__).warning(
            "rollout attention %r runs on %s in Pallas' interpreter (it compiles only on %s): "
            "correct but very slow; 'auto' picks what this platform runs", backend, platform,
            "/".join(module.PLATFORMS))


def _attend_gather(cache: PagedKVCache, q, positions, dtype):
    """Every row's pages in the table's W columns gathered into [B, W * page_size, 2K, H],
    then dense attention."""
    from asyncrl.model.transformer import attend_cached

    batch, _, kv_heads, _, head_dim = q.shape
    rows = cache.pages[cache.layer, jnp.minimum(cache.page_table, cache.num_pages - 1)]
    rows = rows.reshape(batch, -1, 2 * kv_heads, head_dim)  # [B, S, 2K, H]
    return attend_cached(q, rows[:, :, 0::2], rows[:, :, 1::2], positions, dtype)


def _attend_kernel(backend: str, cache: PagedKVCache, q, positions, dtype):
    """One query per row through the platform's kernel, which reads only the pages below
    each row's length; rows not `writing` (finished or empty slots) read nothing.
    Interpreted off its platform (tests)."""
    from asyncrl.model.attention import target_platform

    module = importlib.import_module(_DECODE_KERNELS[backend])
    batch, _, kv_heads, groups, head_dim = q.shape
    kv_lens = positions[:, 0] + 1
    if cache.writing is not None:
        kv_lens = jnp.where(cache.writing, kv_lens, 0)
    queries = q.reshape(batch, kv_heads * groups, head_dim).astype(cache.pages.dtype)
    interpret = target_platform() not in module.PLATFORMS
    out = module.paged_decode(queries, cache.pages, cache.page_table, kv_lens, cache.layer,
                              sm_scale=head_dim ** -0.5, interpret=interpret)
    return out.reshape(batch, 1, kv_heads, groups, head_dim).astype(dtype)


def kv_bytes_per_token(config: ModelConfig, dtype=None) -> int:
    """Keys and values of one position in every layer; dtype defaults to the model's (the
    engine's default cache dtype)."""
    itemsize = jnp.dtype(dtype or config.param_dtype).itemsize
    return 2 * config.num_layers * config.num_kv_heads * config.head_dim * itemsize


def live_kv_bytes(config: ModelConfig, lengths, page_size: int, dtype) -> int:
    """Bytes of KV a paged decode step must read: each row's pages below its length."""
    pages = sum(-(-int(n) // page_size) for n in lengths)
    return pages * page_size * kv_bytes_per_token(config, dtype)
