"""Every loss against a plain NumPy reference, clip ⇔ zero gradient, and the TIS cap."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncrl.train import losses
from asyncrl.train.losses import LossConfig

B, T, G = 8, 6, 4
jax.config.update("jax_numpy_rank_promotion", "raise")


def _inputs(seed: int, spread: float = 0.4):
    rng = np.random.default_rng(seed)
    behaviour = -rng.uniform(0.1, 3.0, (B, T))
    # θ and behaviour differ by up to ±spread nats: enough for clipping and truncation to fire.
    logp = behaviour + rng.uniform(-spread, spread, (B, T))
    mask = (rng.uniform(size=(B, T)) < 0.8).astype(np.float32)
    mask[0] = 0.0  # one empty sequence: aggregations must not divide by zero
    rewards = rng.integers(0, 3, B).astype(np.float32)
    adv = rng.normal(size=B).astype(np.float32)
    return logp.astype(np.float32), behaviour.astype(np.float32), mask, rewards, adv


# --------------------------------------------------------------------------- NumPy references


def np_advantages(name, rewards, g):
    r = rewards.reshape(-1, g).astype(np.float64)
    mean = r.mean(1, keepdims=True)
    if name == "grpo":
        out = (r - mean) / (r.std(1, ddof=1, keepdims=True) + 1e-6)
    elif name == "drgrpo":
        out = r - mean
    else:  # rloo: mean of the *other* rewards, computed the slow way
        others = np.array([[np.delete(row, i).mean() for i in range(g)] for row in r])
        out = r - others
    return out.reshape(-1)


def np_agg_weights(mask, mode):
    if mode == "token-mean":
        return mask / max(mask.sum(), 1)
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(1, keepdims=True)
        return mask / np.maximum(lengths, 1) / max((lengths > 0).sum(), 1)
    return mask / mask.size


def np_policy(name, logp, prox, behaviour, adv, mask, eps_low, eps_high, cap):
    """Per-token loss, clipped flag, weight — straight from the papers' formulas."""
    A = np.broadcast_to(adv[:, None], logp.shape)
    if name == "decoupled_ppo":
        ratio = np.exp(logp - prox)
        raw_w = np.exp(prox - behaviour)
        w = raw_w if cap is None else np.where(raw_w > cap, 0.0, raw_w)
        objective = np.minimum(ratio * A, np.clip(ratio, 1 - eps_low, 1 + eps_high) * A)
        clipped = ((A > 0) & (ratio > 1 + eps_high)) | ((A < 0) & (ratio < 1 - eps_low))
        return -w * objective, clipped, w
    if name == "uncorrected":  # the control: π_prox stands in for the behaviour policy
        ratio = np.exp(logp - prox)
        objective = np.minimum(ratio * A, np.clip(ratio, 1 - eps_low, 1 + eps_high) * A)
        clipped = ((A > 0) & (ratio > 1 + eps_high)) | ((A < 0) & (ratio < 1 - eps_low))
        return -objective, clipped, ratio
    if name == "gspo":
        lengths = np.maximum(mask.sum(1, keepdims=True), 1)
        ratio = np.exp((mask * (logp - behaviour)).sum(1, keepdims=True) / lengths) * np.ones_like(logp)
    else:
        ratio = np.exp(logp - behaviour)
    objective = np.minimum(ratio * A, np.clip(ratio, 1 - eps_low, 1 + eps_high) * A)
    clipped = ((A > 0) & (ratio > 1 + eps_high)) | ((A < 0) & (ratio < 1 - eps_low))
    if cap is None:
        return -objective, clipped, ratio
    # Dual clip (Ye et al. 2020): a negative advantage's objective is bounded below by C·A.
    objective = np.where(A < 0, np.maximum(objective, cap * A), objective)
    clipped = clipped | ((A < 0) & (ratio > cap))
    return -objective, clipped, np.minimum(ratio, cap)


def _policy_inputs(seed, name):
    """θ, π_prox and π_behaviour all distinct, as after a first update inside a batch."""
    spread = 0.05 if name == "gspo" else 0.4  # GSPO's ε is ~1e-4: keep ratios near 1
    logp, behaviour, mask, _, adv = _inputs(seed, spread)
    prox = logp + np.random.default_rng(seed + 100).uniform(-spread, spread, logp.shape)
    return logp, prox.astype(np.float32), behaviour, adv, mask


def _run_policy(name, cap, logp, prox, behaviour, adv, mask):
    low, high = LossConfig(policy_loss=name).eps
    inp = losses.PolicyInputs(
        jnp.asarray(logp), jnp.asarray(prox), jnp.asarray(behaviour),
        jnp.broadcast_to(jnp.asarray(adv)[:, None], logp.shape), jnp.asarray(mask),
    )
    return losses.POLICY_LOSSES.get(name).fn(inp, low, high, cap), (low, high)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("name", losses.ADVANTAGES.names())
def test_advantages_match_numpy(name):
    _, _, _, rewards, _ = _inputs(0)
    got = losses.ADVANTAGES.get(name)(jnp.asarray(rewards), G)
    np.testing.assert_allclose(got, np_advantages(name, rewards, G), rtol=1e-5, atol=1e-5)


def test_advantages_reject_bad_group():
    with pytest.raises(ValueError, match="group_size=3, batch=8"):
        losses.grpo_advantages(jnp.zeros(8), 3)


@pytest.mark.parametrize("mode", losses.AGGREGATIONS.names())
def test_aggregation_weights_match_numpy(mode):
    _, _, mask, _, _ = _inputs(1)
    np.testing.assert_allclose(
        losses.aggregation_weights(jnp.asarray(mask), mode), np_agg_weights(mask, mode), rtol=1e-6
    )


@pytest.mark.parametrize("cap", [None, 1.2])
@pytest.mark.parametrize("name", losses.POLICY_LOSSES.names())
def test_policy_loss_matches_numpy(name, cap):
    arrays = _policy_inputs(2, name)
    terms, (low, high) = _run_policy(name, cap, *arrays)
    want_loss, want_clip, want_w = np_policy(name, *arrays, low, high, cap)
    on = arrays[-1] > 0
    np.testing.assert_allclose(np.asarray(terms.loss)[on], want_loss[on], rtol=2e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(terms.clipped)[on], want_clip[on])
    np.testing.assert_allclose(np.asarray(terms.is_weight)[on], want_w[on], rtol=2e-5)
    assert want_clip[on].any() and (~want_clip[on]).any(), "inputs must exercise both branches"


@pytest.mark.parametrize("cap", [None, 1.2])
@pytest.mark.parametrize("name", losses.POLICY_LOSSES.names())
def test_gradient_is_zero_exactly_where_clipped(name, cap):
    logp, prox, behaviour, adv, mask = _policy_inputs(3, name)
    weights = losses.aggregation_weights(jnp.asarray(mask), "seq-mean-token-mean")

    def total(lp):
        terms, _ = _run_policy(name, cap, lp, prox, behaviour, adv, mask)
        return (terms.loss * weights).sum()

    grad = np.asarray(jax.grad(total)(jnp.asarray(logp)))
    terms, _ = _run_policy(name, cap, logp, prox, behaviour, adv, mask)
    clipped, live = np.asarray(terms.clipped), np.asarray(terms.is_weight) > 0
    on = mask > 0
    assert clipped[on].any()
    assert (grad[on & clipped] == 0).all()
    assert (grad[on & ~clipped & live] != 0).all()
    assert (grad[~on | ~live] == 0).all()


def test_single_update_never_clips_against_the_proximal_policy():
    # In the trainer π_prox = θ at consume time, so decoupled_ppo's ratio is exactly 1.
    logp, behaviour, mask, _, adv = _inputs(3)
    cfg = LossConfig(policy_loss="decoupled_ppo")
    _, aux = losses.token_terms(cfg, jnp.asarray(logp), jnp.asarray(behaviour), jnp.asarray(adv), jnp.asarray(mask))
    assert not np.asarray(aux["clipped"]).any()


def test_clip_low_counts_the_tokens_held_at_the_lower_bound():
    logp, behaviour, mask, _, adv = _inputs(5)
    _, aux = losses.token_terms(LossConfig(policy_loss="dapo", tis_cap=None), jnp.asarray(logp),
                                jnp.asarray(behaviour), jnp.asarray(adv), jnp.asarray(mask))
    ratio = np.where(mask > 0, np.exp(logp - behaviour), 1.0)  # padding is never clipped
    low = (adv[:, None] < 0) & (ratio < 1 - 0.2)
    high = (adv[:, None] > 0) & (ratio > 1 + 0.28)
    assert low.any() and high.any(), "inputs must exercise both bounds"
    np.testing.assert_array_equal(np.asarray(aux["clipped_low"]), low)
    np.testing.assert_array_equal(np.asarray(aux["clipped"]), low | high)


@pytest.mark.parametrize("name", [n for n in losses.POLICY_LOSSES.names() if n != "uncorrected"])
def test_tis_weights_never_exceed_cap(name):
    rng = np.random.default_rng(4)
    behaviour = -rng.uniform(0.1, 8.0, (B, T)).astype(np.float32)
    logp = (behaviour + rng.normal(0, 3.0, (B, T))).astype(np.float32)  # wild staleness
    mask = np.ones((B, T), np.float32)
    cfg = LossConfig(policy_loss=name, tis_cap=1.5)
    _, aux = losses.token_terms(cfg, jnp.asarray(logp), jnp.asarray(behaviour), jnp.ones(B), jnp.asarray(mask))
    w = np.asarray(aux["is_weight"])
    assert w.max() <= 1.5 and np.asarray(aux["is_truncated"]).any()
    assert np.isfinite(w).all()


def test_the_uncorrected_control_ignores_the_behaviour_policy():
    # However stale the samples, one update's ratio against π_prox = θ is 1: no correction.
    logp, behaviour, mask, _, adv = _inputs(6, spread=3.0)
    cfg = LossConfig(policy_loss="uncorrected", tis_cap=1.5)
    loss, aux = losses.token_terms(cfg, jnp.asarray(logp), jnp.asarray(behaviour), jnp.asarray(adv), jnp.asarray(mask))
    on = mask > 0
    np.testing.assert_allclose(np.asarray(aux["is_weight"])[on], 1.0)
    assert not np.asarray(aux["clipped"]).any() and not np.asarray(aux["is_truncated"]).any()
    np.testing.assert_allclose(np.asarray(loss)[on], -np.broadcast_to(adv[:, None], logp.shape)[on], rtol=1e-6)


def test_padding_with_infinite_logprobs_stays_finite():
    logp, behaviour, mask, _, adv = _inputs(5)
    behaviour = np.where(mask > 0, behaviour, -np.inf).astype(np.float32)
    cfg = LossConfig(kl_coef=0.1)
    ref = np.where(mask > 0, logp - 0.1, -np.inf).astype(np.float32)
    fn = lambda lp: (losses.token_terms(cfg, lp, jnp.asarray(behaviour), jnp.asarray(adv), jnp.asarray(mask), ref_logp=jnp.asarray(ref))[0] * mask).sum()
    assert np.isfinite(np.asarray(jax.grad(fn)(jnp.asarray(logp)))).all()


def test_kl_and_entropy_terms():
    logp, behaviour, mask, _, adv = _inputs(6)
    ref = logp + np.random.default_rng(6).normal(0, 0.3, logp.shape).astype(np.float32)
    ent = np.random.default_rng(7).uniform(0, 2, logp.shape).astype(np.float32)
    base = LossConfig(tis_cap=None)
    with_terms = LossConfig(tis_cap=None, kl_coef=0.05, entropy_coef=0.01)
    j = lambda a: jnp.asarray(a)
    l0, _ = losses.token_terms(base, j(logp), j(behaviour), j(adv), j(mask))
    l1, aux = losses.token_terms(with_terms, j(logp), j(behaviour), j(adv), j(mask), entropy=j(ent), ref_logp=j(ref))
    d = ref - logp
    k3 = np.exp(d) - d - 1
    on = mask > 0
    np.testing.assert_allclose(np.asarray(l1 - l0)[on], (0.05 * k3 - 0.01 * ent)[on], rtol=1e-4, atol=1e-6)
    assert (np.asarray(aux["kl_ref"])[on] >= 0).all()
    np.testing.assert_allclose(np.asarray(aux["approx_kl"])[on], (np.exp(logp - behaviour) - 1 - (logp - behaviour))[on], rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize(
    "field, registry", [("advantage", losses.ADVANTAGES), ("policy_loss", losses.POLICY_LOSSES), ("aggregation", losses.AGGREGATIONS)]
)
def test_unknown_name_lists_registered(field, registry):
    with pytest.raises(ValueError) as err:
        LossConfig(**{field: "nope"})
    for name in registry.names():
        assert name in str(err.value)
    assert "'nope'" in str(err.value)


def test_registry_listing_follows_registrations():
    losses.register_advantage("test_only_zero")(lambda r, g: jnp.zeros_like(r))
    try:
        with pytest.raises(ValueError, match="test_only_zero"):
            LossConfig(advantage="still_nope")
    finally:
        losses.ADVANTAGES.remove("test_only_zero")


def test_config_checks_say_what_was_received():
    with pytest.raises(ValueError, match="eps_low=0.1, eps_high=0.3"):
        LossConfig(policy_loss="grpo", eps_low=0.1, eps_high=0.3)
    assert LossConfig(policy_loss="grpo", eps_low=0.1).eps == (0.1, 0.1)
    assert LossConfig(policy_loss="dapo").eps == (0.2, 0.28)
    with pytest.raises(ValueError, match="tis_cap"):
        LossConfig(tis_cap=0.0)
