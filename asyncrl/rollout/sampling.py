"""Token sampling for the rollout engine: temperature, top-k, top-p, and per-token RNG keys.

Two log-probs come out of every sampled token:
- the **behaviour** log-prob, under the distribution the token was actually drawn from (logits
  divided by the temperature, renormalised over the top-k / top-p set). It is the denominator
  of the importance ratio, and the trainer scores its own weights under the same distribution
  (`sampling_logits`, from asyncrl/train/trainer.py), so an on-policy token has ratio 1.
- the **policy** log-prob, under the model's own distribution (temperature 1, no truncation),
  kept with the trajectory for analysis.
Greedy decoding (temperature 0) has no sampling distribution; it reports the policy log-prob
as the behaviour log-prob, so a greedy rollout has importance ratio 1 against its own weights.

Keys come from (seed, trajectory id, token index) by `fold_in` chains and never from a slot,
an instance or a step counter: the same trajectory draws the same tokens wherever it runs, and
a trajectory interrupted and resumed elsewhere continues its own random stream.

Shapes: B rows (decode slots or group members), V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from asyncrl.model.sampling import SamplingParams, sampling_logits


def token_keys(seed: int, trajectory_ids: jax.Array, token_indices: jax.Array) -> jax.Array:
    """One key per row: fold_in(fold_in(key(seed), trajectory_id), token_index).

    trajectory_ids: [B] uint32; token_indices: [B] int32 (index of the token being drawn
    within the trajectory's generated tokens, 0 for the first one).
    """
    base = jax.random.key(seed)

    def one(trajectory_id, token_index):
        return jax.random.fold_in(jax.random.fold_in(base, trajectory_id), token_index)

    return jax.vmap(one)(trajectory_ids, token_indices)


def sample(logits: jax.Array, keys: jax.Array, params: SamplingParams):
    """Draws one token per row.

    Args:
        logits: [B, V] model logits (any float dtype; computed in float32).
        keys: [B] typed PRNG keys, from `token_keys`.
        params: static sampling parameters.
    Returns:
        tokens [B] int32, behaviour log-probs [B] f32, policy log-probs [B] f32.
    """
    logits = logits.astype(jnp.float32)
    policy_logprobs = jax.nn.log_softmax(logits, axis=-1)
    if params.greedy:
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        behaviour_logprobs = policy_logprobs
    else:
        truncated = sampling_logits(logits, params)
        tokens = jax.vmap(jax.random.categorical)(keys, truncated).astype(jnp.int32)
        behaviour_logprobs = jax.nn.log_softmax(truncated, axis=-1)

    def pick(table):
        return jnp.take_along_axis(table, tokens[:, None], axis=-1)[:, 0]

    return tokens, pick(behaviour_logprobs), pick(policy_logprobs)
