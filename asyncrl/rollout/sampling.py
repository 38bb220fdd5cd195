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

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. Frozen and hashable: jit treats it as static.

    temperature: 0 means greedy (argmax); otherwise logits are divided by it.
    top_k: keep the k most likely tokens; 0 means no top-k.
    top_p: keep the smallest set of most likely tokens whose mass reaches top_p; 1 means off.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not self.temperature >= 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(
                f"SamplingParams.top_k must be an int >= 0 (0 = off), got {self.top_k!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}")

    @classmethod
    def of_rollout(cls, rollout) -> SamplingParams:
        """The sampling a config's rollout section asks for (rollout and sampled evaluation)."""
        return cls(temperature=rollout.temperature, top_k=rollout.top_k, top_p=rollout.top_p)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1


def token_keys(seed: int, trajectory_ids: jax.Array, token_indices: jax.Array) -> jax.Array:
    """One key per row: fold_in(fold_in(key(seed), trajectory_id), token_index).

    trajectory_ids: [B] uint32; token_indices: [B] int32 (index of the token being drawn
    within the trajectory's generated tokens, 0 for the first one).
    """
    base = jax.random.key(seed)

    def one(trajectory_id, token_index):
        return jax.random.fold_in(jax.random.fold_in(base, trajectory_id), token_index)

    return jax.vmap(one)(trajectory_ids, token_indices)


def sampling_logits(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """The logits of the distribution tokens are drawn from: [B, V] -> [B, V].

    Temperature-scaled, with -inf outside the top-k / top-p set. Ties at the cut-off value
    are all kept, so the result never depends on how a sort orders equal values.
    Greedy returns the logits unchanged (see the module docstring).
    """
    logits = logits.astype(jnp.float32)
    if params.greedy:
        return logits
    scaled = logits / params.temperature
    neg_inf = jnp.finfo(jnp.float32).min
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(scaled, params.top_k)[0][..., -1:]  # [B, 1]
        scaled = jnp.where(scaled >= kth, scaled, neg_inf)
    if params.top_p < 1:
        ordered = jnp.sort(scaled, axis=-1)[..., ::-1]  # [B, V] descending
        probs = jax.nn.softmax(ordered, axis=-1)
        # A token is kept when the mass strictly before it is still short of top_p: the most
        # likely token is always kept, and the set is the smallest one reaching top_p.
        keep = (jnp.cumsum(probs, axis=-1) - probs) < params.top_p
        num_kept = jnp.sum(keep, axis=-1, keepdims=True)  # >= 1
        cutoff = jnp.take_along_axis(ordered, num_kept - 1, axis=-1)  # [B, 1]
        scaled = jnp.where(scaled >= cutoff, scaled, neg_inf)
    return scaled


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
