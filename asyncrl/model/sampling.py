"""The distribution tokens are drawn from: temperature, top-k, top-p.

Shared by the rollout engine, which samples from it (asyncrl/rollout/sampling.py), and the
trainer, which scores its own weights under the same distribution (asyncrl/train/trainer.py),
so the importance ratio of an on-policy token is 1 at any sampling setting.

Shapes: B rows, V vocabulary (any leading axes in `sampling_logits`).
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

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        return self.top_k > 0 or self.top_p < 1


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
