"""Paged attention against the contiguous cache's dense attention, on random inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncrl.model import KVCache, ModelConfig
from asyncrl.model import paged_gpu, paged_tpu
from asyncrl.model.paged import PagedKVCache

CONFIG = ModelConfig.tiny()
L, K, G, H = CONFIG.num_layers, CONFIG.num_kv_heads, CONFIG.num_groups, CONFIG.head_dim
PAGE, WIDTH, POOL = 4, 5, 24  # rows of up to 20 positions
POSITIONS = np.asarray([[17], [6], [0], [11]], np.int32)  # one decode query per row


def _random(rng, *shape):
    return jnp.asarray(rng.normal(size=shape), jnp.float32)


def _caches(rng):
    """A contiguous cache and a paged one holding the same keys / values per row, the pages
    scattered over the pool in a shuffled order."""
    batch, length = POSITIONS.shape[0], PAGE * WIDTH
    k, v = _random(rng, L, batch, length, K, H), _random(rng, L, batch, length, K, H)
    dense = KVCache(k=k, v=v)
    order = rng.permutation(POOL)[:batch * WIDTH].reshape(batch, WIDTH)
    table = np.full((batch, WIDTH), POOL, np.int32)
    pages = np.zeros((L, POOL, PAGE, 2 * K, H), np.float32)
    for b in range(batch):
        held = int(POSITIONS[b, 0]) // PAGE + 1  # pages below the row's next position only
        table[b, :held] = order[b, :held]
        kv = np.stack([np.asarray(k[:, b]), np.asarray(v[:, b])], axis=3)  # [L, S, K, 2, H]
        kv = kv.reshape(L, WIDTH, PAGE, 2 * K, H)
        pages[:, table[b, :held]] = kv[:, :held]
    return dense, PagedKVCache(jnp.asarray(pages), jnp.asarray(table), backend="gather")


def test_gather_backend_matches_dense_attention_and_writes_into_the_rows_pages():
    rng = np.random.default_rng(0)
    dense, paged = _caches(rng)
    q = _random(rng, POSITIONS.shape[0], 1, K, G, H)
    k, v = _random(rng, POSITIONS.shape[0], 1, K, H), _random(rng, POSITIONS.shape[0], 1, K, H)
    for layer in range(L):
        layer = jnp.int32(layer)
        want, dense_after = dense.replace(layer=layer).attend(q, k, v, POSITIONS, jnp.float32)
        got, paged_after = jax.jit(lambda c: c.attend(q, k, v, POSITIONS, jnp.float32))(
            paged.replace(layer=layer))
        np.testing.assert_allclose(got, want, atol=1e-5)
        # The new key landed where the row's table says its position lives.
        b, pos = 1, int(POSITIONS[1, 0])
        page = int(paged.page_table[b, pos // PAGE])
        np.testing.assert_array_equal(paged_after.pages[layer, page, pos % PAGE, 0::2],
                                      dense_after.k[layer, b, pos])


def test_a_row_not_writing_leaves_every_page_alone():
    rng = np.random.default_rng(1)
    _, paged = _caches(rng)
    q = _random(rng, POSITIONS.shape[0], 1, K, G, H)
    k, v = _random(rng, POSITIONS.shape[0], 1, K, H), _random(rng, POSITIONS.shape[0], 1, K, H)
    silent = paged.replace(layer=jnp.int32(0), writing=jnp.zeros((POSITIONS.shape[0],), bool))
    _, after = silent.attend(q, k, v, POSITIONS, jnp.float32)
    np.testing.assert_array_equal(after.pages, paged.pages)


@pytest.mark.parametrize("backend", ["tpu_ragged", "gpu_paged"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_kernels_interpreted_match_the_gather_and_skip_rows_not_writing(
        backend, dtype, monkeypatch):
    """Each decode kernel in Pallas' interpreter, with small blocks so rows span several
    (TPU: 2 pages a block, the next row's first block copied while the last computes; GPU:
    1 page a compute block, the table in 4 partitions): the gather's attention for every
    writing row; a row not writing reads no page and returns zeros."""
    monkeypatch.setattr(paged_tpu, "BLOCK_POSITIONS", 2 * PAGE)
    monkeypatch.setattr(paged_gpu, "BLOCK_POSITIONS", PAGE)
    monkeypatch.setattr(paged_gpu, "MAX_SPLITS", 4)
    config = ModelConfig.tiny(head_dim=128)
    kv_heads, groups = config.num_kv_heads, config.num_groups
    rng = np.random.default_rng(3)
    batch = POSITIONS.shape[0]
    order = rng.permutation(POOL)[:batch * WIDTH].reshape(batch, WIDTH).astype(np.int32)
    pages = jnp.asarray(rng.normal(size=(L, POOL, PAGE, 2 * kv_heads, 128)), dtype)
    q = _random(rng, batch, 1, kv_heads, groups, 128)
    k = _random(rng, batch, 1, kv_heads, 128)
    v = _random(rng, batch, 1, kv_heads, 128)
    writing = jnp.asarray([True, False, True, True])
    tolerance = 1e-5 if dtype == "float32" else 2e-2
    for layer in range(L):
        cache = PagedKVCache(pages, jnp.asarray(order), writing=writing, layer=jnp.int32(layer))
        want, _ = cache.replace(backend="gather").attend(q, k, v, POSITIONS, jnp.float32)
        got, _ = cache.replace(backend=backend).attend(q, k, v, POSITIONS, jnp.float32)
        live = np.asarray(writing)
        np.testing.assert_allclose(np.asarray(got)[live], np.asarray(want)[live],
                                   atol=tolerance)
        np.testing.assert_array_equal(np.asarray(got)[~live], 0.0)


def test_the_gpu_kernel_lowers_for_cuda_reading_the_pool_in_place():
    """Lowered for CUDA from this host (Triton IR; the PTX compile needs a GPU): one Triton
    call at 7B's heads, bf16, 32k positions in pages of 64, fed the pool itself for both
    keys and values: no transpose, no slice, no copy of the pool into K / V layouts."""
    import functools
    import re

    shape = jax.ShapeDtypeStruct
    args = (shape((8, 28, 128), jnp.bfloat16), shape((2, 8 * 512, 64, 8, 128), jnp.bfloat16),
            shape((8, 512), jnp.int32), shape((8,), jnp.int32), shape((), jnp.int32))
    text = jax.jit(functools.partial(paged_gpu.paged_decode, sm_scale=0.1)).trace(
        *args).lower(lowering_platforms=("cuda",)).as_text()
    calls = re.findall(r"stablehlo.custom_call @(\S+)\((%\w+), (%\w+), (%\w+)", text)
    assert [target for target, *_ in calls] == ["__gpu$xla.gpu.triton"]
    _, _, keys, values = calls[0]
    assert keys == values, "keys and values should be read from one pool"
    pool = re.search(rf"{keys} = (.*)", text).group(1)
    assert pool.startswith("stablehlo.reshape %arg1"), pool  # [L, P, ...] -> [L * P, ...]
    assert "stablehlo.transpose" not in text
