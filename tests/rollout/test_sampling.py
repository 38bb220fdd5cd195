"""sampling.py against numpy re-implementations: truncation sets, log-probs, key derivation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncrl.model.sampling import SamplingParams, sampling_logits
from asyncrl.rollout.sampling import sample, token_keys

V = 32


def _logits(seed, rows=3):
    return jax.random.normal(jax.random.key(seed), (rows, V)) * 2.0


def _np_log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _np_support(logits, params):
    """Boolean [B, V]: tokens the truncated distribution can draw (numpy, by sorting)."""
    scaled = np.asarray(logits, np.float64) / params.temperature
    keep = np.ones_like(scaled, bool)
    if params.top_k:
        kth = np.sort(scaled, -1)[:, -params.top_k][:, None]
        keep &= scaled >= kth
    if params.top_p < 1:
        masked = np.where(keep, scaled, -np.inf)
        for b in range(scaled.shape[0]):
            order = np.argsort(-masked[b])
            probs = np.exp(_np_log_softmax(masked[b][order]))
            before = np.cumsum(probs) - probs
            cut = order[before < params.top_p]
            row = np.zeros(V, bool)
            row[cut] = True
            keep[b] &= row
    return keep


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(temperature=1.3, top_p=0.6),
    SamplingParams(temperature=0.9, top_k=8, top_p=0.5),
])
def test_truncation_set_and_behaviour_logprobs(params):
    logits = _logits(0)
    support = _np_support(logits, params)
    truncated = np.asarray(sampling_logits(logits, params))
    np.testing.assert_array_equal(truncated > jnp.finfo(jnp.float32).min, support)

    # Draw many tokens per row; each must be in the support and carry the renormalised log-prob.
    n = 512
    keys = token_keys(0, jnp.repeat(jnp.arange(3, dtype=jnp.uint32), n),
                      jnp.tile(jnp.arange(n, dtype=jnp.int32), 3))
    tokens, behaviour, policy = sample(jnp.repeat(logits, n, axis=0), keys, params)
    tokens = np.asarray(tokens).reshape(3, n)
    rows = np.arange(3)[:, None]
    assert support[rows, tokens].all()
    scaled = np.where(support, np.asarray(logits) / params.temperature, -np.inf)
    np.testing.assert_allclose(np.asarray(behaviour).reshape(3, n),
                               _np_log_softmax(scaled)[rows, tokens], atol=1e-5)
    np.testing.assert_allclose(np.asarray(policy).reshape(3, n),
                               _np_log_softmax(np.asarray(logits))[rows, tokens], atol=1e-5)
    # Empirical frequency of each row's most likely token follows the truncated distribution.
    top = np.argmax(np.asarray(logits), -1)
    expected = np.exp(_np_log_softmax(scaled)[np.arange(3), top])
    observed = (tokens == top[:, None]).mean(-1)
    np.testing.assert_allclose(observed, expected, atol=4 * np.sqrt(0.25 / n))


def test_greedy_is_argmax_and_reports_policy_logprob():
    logits = _logits(1)
    keys = token_keys(0, jnp.zeros(3, jnp.uint32), jnp.arange(3, dtype=jnp.int32))
    tokens, behaviour, policy = sample(logits, keys, SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(tokens, np.argmax(np.asarray(logits), -1))
    np.testing.assert_array_equal(behaviour, policy)
    np.testing.assert_allclose(policy, _np_log_softmax(np.asarray(logits)).max(-1), atol=1e-6)


def test_keys_depend_on_trajectory_and_index_not_on_row():
    ids = jnp.asarray([7, 7, 8, 7], jnp.uint32)
    idx = jnp.asarray([0, 1, 0, 0], jnp.int32)
    data = np.asarray(jax.random.key_data(token_keys(3, ids, idx)))
    np.testing.assert_array_equal(data[0], data[3])  # same (id, index) in another row
    assert len({tuple(d) for d in data[:3]}) == 3
    other_seed = np.asarray(jax.random.key_data(token_keys(4, ids, idx)))
    assert not np.array_equal(data, other_seed)
    # The same logits drawn in another row with the same key give the same token.
    logits = jnp.broadcast_to(_logits(2, rows=1), (4, V))
    tokens, _, _ = sample(logits, token_keys(3, ids, idx), SamplingParams(temperature=1.0))
    assert tokens[0] == tokens[3]


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(top_k=2.5)])
def test_invalid_params_are_rejected(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)
