"""The decoder on its own: cache semantics, dtypes and sharding, on the tiny preset."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType

from asyncrl.model import (
    KVCache,
    ModelConfig,
    ShardingRules,
    apply,
    graphdef_for,
    init_params,
    init_sharded,
    shardings_for,
)

B, T, S = 2, 8, 16
apply_jit = jax.jit(apply, static_argnums=0)


@pytest.fixture(scope="module")
def model():
    config = ModelConfig.tiny()
    graphdef, params = init_params(config, seed=0)
    # N(0, 0.02) weights give logits ~0.02, too flat to show a masking bug; sharpen them.
    params = jax.tree.map(lambda x: 4 * x, params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, (B, T)),
                         jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    logits, _ = apply_jit(graphdef, params, tokens, positions)
    return config, graphdef, params, tokens, positions, logits


def test_shapes_and_dtypes(model):
    config, graphdef, params, tokens, positions, logits = model
    assert logits.shape == (B, T, config.vocab_size) and logits.dtype == jnp.float32
    assert params["blocks"]["attn"]["q"].get_value().shape == (2, 64, 4, 16)  # [L, D, N, H]
    assert params["blocks"]["attn"]["q"].get_metadata()["logical_axes"] == (
        "layers", "embed", "heads", "head_dim")
    assert graphdef_for(config) == graphdef  # loaders' graphdef hits the same jit cache


def test_prefill_then_decode_matches_no_cache(model):
    config, graphdef, params, tokens, positions, logits = model
    cache = KVCache.init(config, B, S, jnp.float32)
    prefix = 5
    steps = [apply_jit(graphdef, params, tokens[:, :prefix], positions[:, :prefix], cache)]
    cache = steps[0][1]
    for t in range(prefix, T):
        step_logits, cache = apply_jit(graphdef, params, tokens[:, t:t + 1],
                                       positions[:, t:t + 1], cache)
        steps.append((step_logits, cache))
    cached = jnp.concatenate([s[0] for s in steps], axis=1)
    np.testing.assert_allclose(cached, logits, atol=1e-5)



def test_logits_at_one_index_per_row_equal_those_of_the_full_forward(model):
    config, graphdef, params, tokens, positions, logits = model
    cache = KVCache.init(config, B, S, jnp.float32)
    at = jnp.asarray([T - 1, 2], jnp.int32)  # a different index per row, as with right padding
    picked, _ = apply_jit(graphdef, params, tokens, positions, cache, at)
    assert picked.shape == (B, 1, config.vocab_size)
    np.testing.assert_allclose(picked[:, 0], logits[jnp.arange(B), at], atol=1e-5)

def test_right_padding_is_overwritten_before_it_is_seen(model):
    """Row 1 is 3 tokens long, padded to 5: decode from position 3 must ignore the padding."""
    config, graphdef, params, tokens, positions, logits = model
    cache = KVCache.init(config, B, S, jnp.float32)
    padded = tokens[:, :5].at[1, 3:].set(7)  # junk after row 1's real tokens
    _, cache = apply_jit(graphdef, params, padded, positions[:, :5], cache)
    # Row 0 continues at 5, row 1 at 3 (its real length), one token each.
    next_tokens = jnp.stack([tokens[0, 5:6], tokens[1, 3:4]])
    next_positions = jnp.array([[5], [3]], jnp.int32)
    step, _ = apply_jit(graphdef, params, next_tokens, next_positions, cache)
    np.testing.assert_allclose(step[0, 0], logits[0, 5], atol=1e-5)
    np.testing.assert_allclose(step[1, 0], logits[1, 3], atol=1e-5)


def test_writes_past_the_cache_are_dropped(model):
    config, graphdef, params, tokens, positions, _ = model
    cache = KVCache.init(config, B, S, jnp.float32)
    _, cache = apply_jit(graphdef, params, tokens, positions, cache)
    _, after = apply_jit(graphdef, params, tokens[:, :1], jnp.full((B, 1), S, jnp.int32), cache)
    np.testing.assert_array_equal(after.k, cache.k)  # nothing clamped onto slot S-1


def test_bfloat16_params_stay_close():
    config = ModelConfig.tiny()
    graphdef, params = init_params(config, seed=0)
    graphdef16, params16 = init_params(config.replace(param_dtype="bfloat16"), seed=0)
    assert params16["embed"].get_value().dtype == jnp.bfloat16
    tokens = jnp.arange(B * T, dtype=jnp.int32).reshape(B, T)
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    cache = KVCache.init(config.replace(param_dtype="bfloat16"), B, S)
    assert cache.k.dtype == jnp.bfloat16
    logits16, _ = apply_jit(graphdef16, params16, tokens, positions, cache)
    logits, _ = apply_jit(graphdef, params, tokens, positions)
    assert logits16.dtype == jnp.float32
    np.testing.assert_allclose(logits16, logits, atol=2e-2)


@pytest.mark.parametrize("axis, rules", [("fsdp", ShardingRules.fsdp()),
                                         ("tp", ShardingRules.tensor_parallel())])
def test_sharded_meshes_give_the_same_logits(model, axis, rules):
    config, graphdef, params, tokens, positions, logits = model
    # make_mesh's default Explicit axes: shardings_for must still give a mesh apply runs on.
    mesh = jax.make_mesh((4,), (axis,), devices=jax.devices()[:4])
    sharded = jax.device_put(params, shardings_for(params, mesh, rules))
    q = sharded["blocks"]["attn"]["q"].get_value()
    assert q.sharding.spec == (jax.sharding.PartitionSpec(None, "fsdp", None, None)
                               if axis == "fsdp" else
                               jax.sharding.PartitionSpec(None, None, "tp", None))
    # 2 kv heads do not split 4 ways: the rule falls back to replicating that dim.
    assert sharded["blocks"]["attn"]["k"].get_value().sharding.spec == (
        jax.sharding.PartitionSpec(None, "fsdp", None, None) if axis == "fsdp"
        else jax.sharding.PartitionSpec(None, None, None, None))
    cache = KVCache.init(config, B, S, jnp.float32)
    cache = jax.device_put(cache, shardings_for(cache, mesh, rules))
    out, _ = apply_jit(graphdef, sharded, tokens, positions, cache)
    np.testing.assert_allclose(out, logits, rtol=1e-5, atol=1e-4)


def test_init_sharded_matches_init_params():
    config = ModelConfig.tiny()
    _, params = init_params(config, seed=0)
    mesh = jax.make_mesh((4,), ("tp",), axis_types=(AxisType.Auto,), devices=jax.devices()[4:])
    _, sharded = init_sharded(config, 0, mesh, ShardingRules.tensor_parallel())
    embed = sharded["embed"].get_value()
    assert embed.sharding.spec == jax.sharding.PartitionSpec("tp", None)
    np.testing.assert_allclose(embed, params["embed"].get_value(), atol=1e-7)
