"""GRPO-family losses, chosen by name from registries.

Shapes: B sequences, T tokens, G group size (responses per prompt). Every [B, T] log-prob
array holds log π(tokens[b, t] | tokens[b, :t]) at position t, so it lines up with the
response mask and with the per-token weight versions the engine recorded. Rows packed with
several sequences (train.tokens_per_row) are B rows instead, and `Sequences` says which tokens
form each sequence: the per-sequence terms (GSPO's ratio, the seq-mean weights) are sums over
a sequence's tokens, so they do not depend on how the rows hold them.

Three policies appear in an off-policy step:
- θ, the params being trained (``logp``, differentiable);
- the proximal policy, the trainer's params at consume time (``proximal_logp``, no gradient).
  The trainer takes one optimiser update per consumed batch, so it is the stop-gradient of
  ``logp`` and costs no extra forward pass;
- the behaviour policy, whatever weights the engine held when it sampled each token
  (``behaviour_logp``). A partial rollout finished on newer weights mixes several versions
  in one sequence; because the correction is per token, that needs nothing special.

Which policy the clipped ratio is measured against:
- ``dapo``, ``grpo``, ``gspo``: always the behaviour policy, so the ratio r = π_θ / π_behaviour
  is both the importance weight and the trust region. TIS (``tis_cap = C``) truncates it:
  for A < 0 the clipped objective min(r·A, clip(r)·A) grows without bound in r, and the cap
  makes it max(·, C·A) (dual-clip PPO), so no token's weight exceeds C and a truncated token
  carries no gradient; for A > 0 the clip already bounds r by 1 + ε_high < C. Measuring the
  ratio against the trainer's own params instead (verl's and slime's TIS for a rollout /
  training engine mismatch) leaves one update per batch with no trust region against stale
  samples: at η = 2 it collapsed SmolLM2 on the default task (42.0% → 43.5% held out).
- ``decoupled_ppo`` (AReaL): the proximal policy; the behaviour log-probs enter only
  through the weight π_prox / π_behaviour, and tokens whose weight exceeds C are dropped
  (AReaL's ``behav_imp_weight_cap``) rather than truncated.

``is_weight`` reports the importance weight each token's loss applies: r itself, capped at C
with TIS (π_prox / π_behaviour, or 0 where dropped, for ``decoupled_ppo``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from asyncrl.registry import Registry

# ---------------------------------------------------------------------------------------
# Advantage estimators: rewards [B] (contiguous groups of G) -> advantages [B].
# ---------------------------------------------------------------------------------------

AdvantageFn = Callable[[jax.Array, int], jax.Array]
ADVANTAGES = Registry("advantage estimator")
_STD_EPS = 1e-6


def register_advantage(name: str):
    def wrap(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES.add(name, fn)
        return fn

    return wrap


def _groups(rewards: jax.Array, group_size: int) -> jax.Array:
    (b,) = rewards.shape
    if group_size < 2 or b % group_size:
        raise ValueError(
            f"group advantages need group_size >= 2 dividing the batch; received group_size="
            f"{group_size}, batch={b}"
        )
    return rewards.astype(jnp.float32).reshape(b // group_size, group_size)


@register_advantage("grpo")
def grpo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """(r - group mean) / (group std + eps); unbiased std, as in TRL and tunix."""
    r = _groups(rewards, group_size)
    centred = r - r.mean(axis=1, keepdims=True)
    return (centred / (r.std(axis=1, ddof=1, keepdims=True) + _STD_EPS)).reshape(-1)


@register_advantage("drgrpo")
def drgrpo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """Dr. GRPO: r - group mean; no std division, which favours low-variance prompts."""
    r = _groups(rewards, group_size)
    return (r - r.mean(axis=1, keepdims=True)).reshape(-1)


@register_advantage("rloo")
def rloo_advantages(rewards: jax.Array, group_size: int) -> jax.Array:
    """r_i - mean of the other G-1 rewards = G/(G-1) · (r_i - group mean)."""
    r = _groups(rewards, group_size)
    scale = group_size / (group_size - 1)
    return (scale * (r - r.mean(axis=1, keepdims=True))).reshape(-1)


# ---------------------------------------------------------------------------------------
# Policy losses: per-token loss, clip indicator and the importance weight actually used.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Sequences:
    """Which tokens of a [B, T] batch form one sequence: row b is sequence b (`segment_ids`
    None: each row one sequence, right-padded), or rows packed with several, told apart by
    their segment ids."""

    segment_ids: jax.Array | None = None  # [B, T] int32: 0 on padding, 1..k along a row
    # Packed rows only: N sequences × their padded length unpacked (a float32 scalar), the
    # constant Dr. GRPO's aggregation divides by (B × T when rows are the sequences).
    padded_tokens: jax.Array | None = None

    def _slots(self) -> tuple[jax.Array, int]:
        """Row b's k-th sequence is slot b·(T+1) + k (its padding slot b·(T+1)): [B, T] and
        the number of slots. A row holds at most T sequences, so slots never collide."""
        b, t = self.segment_ids.shape
        return self.segment_ids + (t + 1) * jnp.arange(b, dtype=jnp.int32)[:, None], b * (t + 1)

    def sums(self, x: jax.Array) -> jax.Array:
        """Each sequence's sum of x [B, T]: [B], or one per slot for packed rows (a slot no
        sequence holds sums to 0; a padding slot sums x over the row's padding)."""
        if self.segment_ids is None:
            return x.sum(axis=1)
        slots, count = self._slots()
        return jax.ops.segment_sum(x.ravel(), slots.ravel(), count)

    def spread(self, per_sequence: jax.Array) -> jax.Array:
        """`sums`' values back onto each sequence's tokens: [B, 1], or [B, T] when packed."""
        if self.segment_ids is None:
            return per_sequence[:, None]
        return per_sequence[self._slots()[0]]


ROWS = Sequences()  # one sequence per row


class PolicyInputs(NamedTuple):
    logp: jax.Array  # [B, T] under θ, differentiable
    proximal_logp: jax.Array  # [B, T] trainer params at consume time, stop-gradient
    behaviour_logp: jax.Array  # [B, T] recorded by the engine
    advantages: jax.Array  # [B, T] per-sequence advantage broadcast over tokens
    mask: jax.Array  # [B, T] float, 1 on trained response tokens
    sequences: Sequences = ROWS


class PolicyTerms(NamedTuple):
    loss: jax.Array  # [B, T] per-token loss, before aggregation
    clipped: jax.Array  # [B, T] bool: the clip bound the ratio, so no gradient flows
    is_weight: jax.Array  # [B, T] off-policy weight applied (1 where none)
    is_truncated: jax.Array  # [B, T] bool: the raw weight exceeded the cap


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
    fn: Callable[[PolicyInputs, float, float, float | None], PolicyTerms]
    eps: tuple[float, float]  # default (ε_low, ε_high)
    symmetric: bool  # ε_high must equal ε_low


POLICY_LOSSES = Registry("policy loss")


def register_loss(name: str, *, eps: tuple[float, float], symmetric: bool = False):
    def wrap(fn):
        POLICY_LOSSES.add(name, PolicyLoss(fn, eps, symmetric))
        return fn

    return wrap


def _masked(x: jax.Array, mask: jax.Array) -> jax.Array:
    # Padding may hold -inf log-probs; zero them before exp so inf·0 never makes a NaN.
    return jnp.where(mask > 0, x, 0.0)


def _clip_objective(ratio, adv, eps_low, eps_high, cap=None, value=None):
    """PPO's min(r·A, clip(r)·A), with TIS's dual clip max(·, C·A) for A < 0 when `cap` is
    set; written as a select, so 'clipped' is exactly no-gradient. `value` (default `ratio`)
    is what the unclipped branch differentiates: GSPO decides on the sequence ratio but
    takes its gradient per token."""
    low = (adv < 0) & (ratio < 1 - eps_low)
    high = (adv > 0) & (ratio > 1 + eps_high)
    bound = jnp.clip(ratio, 1 - eps_low, 1 + eps_high)
    if cap is not None:
        truncated = (adv < 0) & (ratio > cap)
        bound = jnp.where(truncated, cap, bound)
    else:
        truncated = jnp.zeros(ratio.shape, bool)
    clipped = low | high | truncated
    value = ratio if value is None else value
    return -jnp.where(clipped, jax.lax.stop_gradient(bound) * adv, value * adv), clipped


def _applied_weight(ratio, cap):
    """The importance weight a token's loss applies, and whether the cap truncated it."""
    ratio = jax.lax.stop_gradient(ratio)
    if cap is None:
        return ratio, jnp.zeros(ratio.shape, bool)
    return jnp.minimum(ratio, cap), ratio > cap


def _token_clip_loss(inp: PolicyInputs, eps_low, eps_high, tis_cap) -> PolicyTerms:
    ratio = jnp.exp(_masked(inp.logp - inp.behaviour_logp, inp.mask))
    loss, clipped = _clip_objective(ratio, inp.advantages, eps_low, eps_high, tis_cap)
    return PolicyTerms(loss, clipped, *_applied_weight(ratio, tis_cap))


@register_loss("dapo", eps=(0.2, 0.28))
def dapo_loss(inp: PolicyInputs, eps_low, eps_high, tis_cap) -> PolicyTerms:
    """Token-level PPO clip with clip-higher (asymmetric ε) from DAPO."""
    return _token_clip_loss(inp, eps_low, eps_high, tis_cap)


@register_loss("grpo", eps=(0.2, 0.2), symmetric=True)
def grpo_loss(inp: PolicyInputs, eps_low, eps_high, tis_cap) -> PolicyTerms:
    """Token-level PPO clip with one ε, as in DeepSeekMath's GRPO."""
    return _token_clip_loss(inp, eps_low, eps_high, tis_cap)


@register_loss("decoupled_ppo", eps=(0.2, 0.28))
def decoupled_ppo_loss(inp: PolicyInputs, eps_low, eps_high, tis_cap) -> PolicyTerms:
    """AReaL's decoupled objective: trust region around π_prox, π_prox/π_behaviour weight."""
    ratio = jnp.exp(_masked(inp.logp - inp.proximal_logp, inp.mask))
    loss, clipped = _clip_objective(ratio, inp.advantages, eps_low, eps_high)
    w = jnp.exp(_masked(inp.proximal_logp - inp.behaviour_logp, inp.mask))
    dropped = jnp.zeros(w.shape, bool) if tis_cap is None else w > tis_cap
    w = jax.lax.stop_gradient(jnp.where(dropped, 0.0, w))
    return PolicyTerms(w * loss, clipped, w, dropped)


@register_loss("uncorrected", eps=(0.2, 0.28))
def uncorrected_loss(inp: PolicyInputs, eps_low, eps_high, tis_cap) -> PolicyTerms:
    """A negative control: the DAPO clip against the trainer's own log-probs (π_prox, the
    weights before this update) instead of the behaviour policy that sampled the tokens.
    With one update per batch the ratio is 1: stale samples get no correction and no trust
    region. It exists to show that the behaviour log-probs matter; never train with it."""
    del tis_cap  # nothing to truncate: there is no importance weight
    ratio = jnp.exp(_masked(inp.logp - inp.proximal_logp, inp.mask))
    loss, clipped = _clip_objective(ratio, inp.advantages, eps_low, eps_high)
    return PolicyTerms(loss, clipped, *_applied_weight(ratio, None))


@register_loss("gspo", eps=(3e-4, 4e-4))
def gspo_loss(inp: PolicyInputs, eps_low, eps_high, tis_cap) -> PolicyTerms:
    """GSPO: one length-normalised ratio per sequence, clipped per sequence.

    Written in GSPO-token form: every token carries the sequence ratio s_i as its value and
    s_i·∇logπ_t as its gradient, which under seq-mean-token-mean aggregation equals the
    sequence objective's gradient. The TIS cap applies to the sequence ratio.
    """
    seqs = inp.sequences
    length = jnp.maximum(seqs.spread(seqs.sums(inp.mask)), 1.0)

    def seq_mean(x):
        return seqs.spread(seqs.sums(_masked(x, inp.mask))) / length

    seq_ratio = jnp.exp(seq_mean(inp.logp - inp.behaviour_logp))  # [B, 1] ([B, T] packed)
    token_logp = _masked(inp.logp, inp.mask)
    sg = jax.lax.stop_gradient
    # Value s_i, gradient s_i·∇logπ_t; the clip decisions are the sequence's.
    ratio = sg(seq_ratio) * jnp.exp(token_logp - sg(token_logp))
    seq_ratio = jnp.broadcast_to(seq_ratio, ratio.shape)
    loss, clipped = _clip_objective(seq_ratio, inp.advantages, eps_low, eps_high, tis_cap,
                                    value=ratio)
    return PolicyTerms(loss, clipped, *_applied_weight(seq_ratio, tis_cap))


# ---------------------------------------------------------------------------------------
# Aggregation: per-token weights from the *whole* batch's mask, so micro-batches sum to
# exactly the full-batch loss however the batch is split.
# ---------------------------------------------------------------------------------------

AggregationFn = Callable[[jax.Array, Sequences], jax.Array]
AGGREGATIONS = Registry("loss aggregation")


def register_aggregation(name: str):
    def wrap(fn: AggregationFn) -> AggregationFn:
        AGGREGATIONS.add(name, fn)
        return fn

    return wrap


@register_aggregation("token-mean")
def _token_mean(mask: jax.Array, sequences: Sequences) -> jax.Array:
    del sequences  # every token alike, whichever sequence holds it
    return mask / jnp.maximum(mask.sum(), 1.0)


@register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(mask: jax.Array, sequences: Sequences) -> jax.Array:
    lengths = sequences.sums(mask)
    n_seq = jnp.maximum((lengths > 0).sum(), 1)
    return mask / jnp.maximum(sequences.spread(lengths), 1.0) / n_seq


@register_aggregation("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(mask: jax.Array, sequences: Sequences) -> jax.Array:
    # Dr. GRPO: a constant normaliser (batch × padded length), so long answers are not
    # down-weighted per token. Packed rows divide by the same: their own B × T varies with
    # how well a batch packs.
    if sequences.padded_tokens is None:
        return mask / (mask.shape[0] * mask.shape[1])
    return mask / sequences.padded_tokens


def aggregation_weights(mask: jax.Array, mode: str, sequences: Sequences = ROWS) -> jax.Array:
    """[B, T] weights w with loss = Σ w · per_token_loss."""
    return AGGREGATIONS.get(mode)(mask.astype(jnp.float32), sequences)


# ---------------------------------------------------------------------------------------
# The full objective.
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LossConfig:
    advantage: str = "grpo"
    policy_loss: str = "dapo"
    eps_low: float | None = None  # None: the loss's own default
    eps_high: float | None = None
    tis_cap: float | None = 2.0  # C of min(π_train/π_behaviour, C); None turns TIS off
    kl_coef: float = 0.0  # k3 KL to the frozen reference; 0 skips the reference pass
    entropy_coef: float = 0.0
    aggregation: str = "token-mean"

    def __post_init__(self):
        ADVANTAGES.get(self.advantage)
        AGGREGATIONS.get(self.aggregation)
        loss = POLICY_LOSSES.get(self.policy_loss)
        low, high = self.eps
        if not 0 < low < 1 or high <= 0:
            raise ValueError(f"need 0 < eps_low < 1 and eps_high > 0; received {low}, {high}")
        if loss.symmetric and low != high:
            raise ValueError(
                f"policy loss {self.policy_loss!r} clips symmetrically; received eps_low={low}, "
                f"eps_high={high}"
            )
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0 or None; received {self.tis_cap}")
        if self.kl_coef < 0 or self.entropy_coef < 0:
            raise ValueError(
                f"kl_coef and entropy_coef must be >= 0; received {self.kl_coef}, "
                f"{self.entropy_coef}"
            )

    @property
    def eps(self) -> tuple[float, float]:
        low_default, high_default = POLICY_LOSSES.get(self.policy_loss).eps
        low = low_default if self.eps_low is None else self.eps_low
        if self.eps_high is not None:
            return low, self.eps_high
        symmetric = POLICY_LOSSES.get(self.policy_loss).symmetric
        return low, low if symmetric else high_default


def compute_advantages(cfg: LossConfig, rewards: jax.Array, group_size: int) -> jax.Array:
    return ADVANTAGES.get(cfg.advantage)(rewards, group_size)


def token_terms(
    cfg: LossConfig,
    logp: jax.Array,  # [B, T]
    behaviour_logp: jax.Array,  # [B, T]
    advantages: jax.Array,  # [B], one per row; [B, T] per token for packed rows
    mask: jax.Array,  # [B, T]
    entropy: jax.Array | None = None,  # [B, T]
    ref_logp: jax.Array | None = None,  # [B, T], required when kl_coef > 0
    sequences: Sequences = ROWS,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Per-token loss [B, T] (aggregate with `aggregation_weights`) and per-token diagnostics."""
    mask = mask.astype(jnp.float32)
    per_row = advantages.ndim == 1
    inputs = PolicyInputs(
        logp=logp,
        proximal_logp=jax.lax.stop_gradient(logp),
        behaviour_logp=behaviour_logp,
        advantages=jnp.broadcast_to(advantages[:, None] if per_row else advantages, logp.shape),
        mask=mask,
        sequences=sequences,
    )
    low, high = cfg.eps
    terms = POLICY_LOSSES.get(cfg.policy_loss).fn(inputs, low, high, cfg.tis_cap)
    loss = terms.loss
    # k3 of KL(π_behaviour‖π_θ) on behaviour samples: r - 1 - log r, r = π_θ/π_behaviour.
    log_r = _masked(jax.lax.stop_gradient(logp) - behaviour_logp, mask)
    aux = {
        "clipped": terms.clipped,
        # Which side binds tells a stale batch's story: the lower bound stops pushing down a
        # token that has already fallen by ε_low since it was sampled, the upper one stops
        # raising one that has risen by ε_high. The TIS cap's truncations are not counted here.
        "clipped_low": terms.clipped & (inputs.advantages < 0) & ~terms.is_truncated,
        "is_weight": terms.is_weight,
        "is_truncated": terms.is_truncated,
        "approx_kl": jnp.exp(log_r) - 1.0 - log_r,
    }
    if cfg.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("kl_coef > 0 needs the reference log-probs")
        # Schulman's k3 estimator of KL(π_θ‖π_ref): e^d - d - 1, d = log π_ref - log π_θ;
        # d = 0 on padding, so it adds neither KL nor gradient there.
        d = _masked(ref_logp - logp, mask)
        kl = jnp.exp(d) - d - 1.0
        loss = loss + cfg.kl_coef * kl
        aux["kl_ref"] = jax.lax.stop_gradient(kl)
    if entropy is not None:
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * entropy
        aux["entropy"] = jax.lax.stop_gradient(entropy)
    return loss, aux
