"""Paged attention against the contiguous cache's dense attention, on random inputs."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ref_ragged_paged_attention

from asyncrl.model import KVCache, ModelConfig
from asyncrl.model.paged import PagedKVCache, ragged_inputs

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


def test_the_tpu_kernels_inputs_give_the_kernels_reference_result():
    """What the engine hands `ragged_paged_attention` (layers' pools side by side, the layer's
    page offset, lengths, one query per row), through the kernel's own reference
    implementation: the contract holds on a CPU, where the kernel itself cannot run."""
    rng = np.random.default_rng(2)
    _, paged = _caches(rng)
    q = _random(rng, POSITIONS.shape[0], 1, K, G, H)
    k, v = _random(rng, POSITIONS.shape[0], 1, K, H), _random(rng, POSITIONS.shape[0], 1, K, H)
    for layer in range(L):
        cache = paged.replace(layer=jnp.int32(layer))
        want, written = cache.attend(q, k, v, POSITIONS, jnp.float32)
        got = ref_ragged_paged_attention(*ragged_inputs(written, q, POSITIONS),
                                         sm_scale=H ** -0.5)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want).reshape(got.shape),
                                   atol=1e-5)
