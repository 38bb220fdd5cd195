"""The train step: matches a plain full-batch computation, shards, donates, fails loudly."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncrl.model import apply, apply_hidden
from asyncrl.train import losses
from asyncrl.train.late_metrics import LateMetrics
from asyncrl.train import trainer as trainer_module
from asyncrl.train.trainer import FSDP, Trainer, TrainConfig, _token_logprobs, trainer_mesh
from tests.train.helpers import CONFIG, MODEL, G, make_batch



def plain_token_logprobs(logits, tokens):
    """log π and entropy [B, T] from whole logits [B, T, V] (0 at t = 0): what the trainer's
    chunked computation must equal."""
    logz = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    taken = jnp.take_along_axis(logz, tokens[:, 1:, None], axis=-1)[..., 0]
    entropy = -(jnp.exp(logz) * logz).sum(-1)
    pad = jnp.zeros_like(taken[:, :1])
    return jnp.concatenate([pad, taken], 1), jnp.concatenate([pad, entropy], 1)


def reference_loss(params, batch):
    """The loss of the whole batch in one plain pass (at step 0, the reference = params)."""
    logits, _ = apply(*params, batch.tokens, batch.positions)
    logp, entropy = plain_token_logprobs(logits, batch.tokens)
    mask = np.asarray(batch.loss_mask)
    adv = losses.compute_advantages(CONFIG.loss, jnp.asarray(batch.rewards), G)
    per_token, _ = losses.token_terms(CONFIG.loss, logp, jnp.asarray(batch.behaviour_logp), adv, mask, entropy, logp)
    return float((per_token * losses.aggregation_weights(jnp.asarray(mask), CONFIG.loss.aggregation)).sum())


@pytest.fixture(scope="module")
def two_steps(trainer):
    """2 devices × 2 micro-batches, and 1 device × 1 micro-batch, from the same init."""
    single = Trainer.create(
        dataclasses.replace(CONFIG, num_microbatches=1), MODEL, trainer_mesh(jax.devices()[2:3]), G
    )
    batches = [make_batch(0), make_batch(1)]
    out = {}
    init_params = jax.device_get(trainer.init_state().params)
    for name, tr in (("fsdp", trainer), ("single", single)):
        # From host params: the same init, and no second compile of the random init.
        state = tr.init_state(init_params)
        metrics = []
        for batch in batches:
            state, m = tr.step(state, tr.put_batch(batch))
            metrics.append(jax.device_get(m))
        out[name] = (init_params, state, metrics)
    return out, batches, trainer.graphdef


def test_first_loss_equals_plain_full_batch_loss(two_steps):
    out, batches, graphdef = two_steps
    init_params, _, metrics = out["fsdp"]
    want = reference_loss((graphdef, init_params), batches[0])
    np.testing.assert_allclose(float(metrics[0]["loss"]), want, rtol=1e-4, atol=1e-6)


def test_microbatched_fsdp_step_matches_single_device(two_steps):
    out, _, _ = two_steps
    fsdp_params, single_params = (jax.device_get(out[k][1].params) for k in ("fsdp", "single"))
    assert not np.allclose(jax.tree.leaves(fsdp_params)[0], jax.tree.leaves(out["fsdp"][0])[0])  # it moved
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6), fsdp_params, single_params)
    for key in ("loss", "grad_norm", "clip_frac", "clip_low_frac", "approx_kl", "kl_ref", "entropy",
                "is_weight_p90"):
        np.testing.assert_allclose(out["fsdp"][2][1][key], out["single"][2][1][key], rtol=1e-4, atol=1e-6)


def test_params_and_moments_shard_over_fsdp(two_steps):
    state = two_steps[0]["fsdp"][1]
    q = state.params["blocks"]["attn"]["q"].get_value()
    assert FSDP in q.sharding.spec and len(q.sharding.device_set) == 2
    assert q.addressable_shards[0].data.shape[1] == MODEL.hidden_dim // 2
    mu = jax.tree.leaves(state.opt_state)[1]
    assert len(mu.sharding.device_set) == 2 and FSDP in mu.sharding.spec


def test_compiles_once_and_donates_the_state(trainer):
    state = trainer.init_state()
    for seed in range(3):
        old = state
        state, _ = trainer.step(state, trainer.put_batch(make_batch(seed, version=seed)))
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old.params))
    assert trainer.step._cache_size() == 1
    assert int(state.step) == 3


def test_staleness_and_weight_metrics(trainer):
    batch = make_batch(5, version=4)
    _, m = trainer.step(trainer.init_state(), trainer.put_batch(batch))
    m = jax.device_get(m)
    lag = 4 - batch.v_traj
    on = batch.loss_mask > 0
    tok_lag = (4 - batch.token_versions)[on]
    assert m["staleness_mean"] == pytest.approx(lag.mean()) and m["staleness_max"] == lag.max()
    assert m["token_lag_mean"] == pytest.approx(tok_lag.mean()) and m["token_lag_max"] == tok_lag.max()
    assert m["trained_tokens"] == on[:, 1:].sum()
    cap = CONFIG.loss.tis_cap
    assert m["is_weight_p50"] <= m["is_weight_p90"] <= m["is_weight_p99"] <= m["is_weight_max"] <= cap
    assert 0 < m["is_truncated_frac"] < 1 and m["is_weight_nonfinite"] == 0
    assert m["learning_rate"] == 0.0  # step 0 of the warm-up


@pytest.mark.parametrize(
    "corrupt, quantity",
    [
        (lambda b: b.behaviour_logp.__setitem__((2, 9), np.nan), "importance weight"),
        (lambda b: b.rewards.__setitem__(1, np.inf), "loss"),
    ],
)
def test_non_finite_values_raise_naming_step_and_quantity(trainer, corrupt, quantity):
    late = LateMetrics()
    state = trainer.init_state()
    state, m = trainer.step(state, trainer.put_batch(make_batch(0, version=0)))
    assert late.push(1, m) is None
    bad = make_batch(1, version=1)
    corrupt(bad)
    state, m = trainer.step(state, trainer.put_batch(bad))
    step, good = late.push(2, m)  # step 1 read one step late, and fine
    assert step == 1 and np.isfinite(good["loss"])
    with pytest.raises(FloatingPointError, match=f"step 2: {quantity}"):
        late.flush()


def test_bad_configs_say_what_was_received():
    with pytest.raises(ValueError, match="unknown learning-rate schedule 'linear'; registered: constant, cosine"):
        TrainConfig(lr_schedule="linear")
    with pytest.raises(ValueError, match="num_microbatches"):
        TrainConfig(num_microbatches=0)


@pytest.mark.parametrize("chunk_tokens", [4, 1000], ids=["chunked-with-padding", "one-chunk"])
def test_chunked_log_probs_equal_whole_logits_with_their_gradients(trainer, monkeypatch, chunk_tokens):
    batch = make_batch(0)
    tokens = jnp.asarray(batch.tokens)
    b, t = tokens.shape
    assert (t - 1) % 4  # so the 4-token chunks need padding
    monkeypatch.setattr(trainer_module, "LOGITS_CHUNK_ELEMENTS", chunk_tokens * b * MODEL.vocab_size)
    params = jax.device_get(trainer.init_state().params)
    hidden, table = apply_hidden(trainer.graphdef, params, tokens, jnp.asarray(batch.positions))
    weights = jnp.asarray(np.random.default_rng(0).normal(size=(b, t)), jnp.float32)

    def objective(fn, hidden, table):
        logp, entropy = fn(hidden, table)
        return (weights * logp).sum() + 0.1 * (weights * entropy).sum(), (logp, entropy)

    def plain(hidden, table):
        return plain_token_logprobs(jnp.einsum("BTD,VD->BTV", hidden, table), tokens)

    def chunked(hidden, table):
        return _token_logprobs(hidden, table, tokens)

    grads = {}
    for name, fn in (("plain", plain), ("chunked", chunked)):
        grad_fn = jax.jit(jax.grad(lambda h, w: objective(fn, h, w), argnums=(0, 1), has_aux=True))
        grads[name] = grad_fn(hidden, table)
    (g_chunked, (logp, entropy)), (g_plain, (want_logp, want_entropy)) = grads["chunked"], grads["plain"]
    np.testing.assert_allclose(logp, want_logp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy, want_entropy, rtol=1e-5, atol=1e-5)
    assert float(jnp.abs(logp[:, 0]).max()) == 0.0  # t = 0 predicts nothing
    for got, want in zip(g_chunked, g_plain):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_remat_policies_change_memory_not_the_update(trainer):
    """Recomputing a layer in the backward pass gives the same step as storing it."""
    batch = make_batch(0)
    init = jax.device_get(trainer.init_state().params)
    updated = {}
    for remat in ("full", "dots"):
        tr = Trainer.create(dataclasses.replace(CONFIG, remat=remat), MODEL, trainer.mesh, G)
        state, _ = tr.step(tr.init_state(init), tr.put_batch(batch))
        updated[remat] = jax.device_get(state.params)
    state, _ = trainer.step(trainer.init_state(init), trainer.put_batch(batch))
    baseline = jax.device_get(state.params)
    for remat, params in updated.items():
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), params, baseline)
    with pytest.raises(ValueError, match="unknown remat policy 'some'; registered: dots, full, none"):
        dataclasses.replace(CONFIG, remat="some")


def test_bf16_compute_trains_float32_master_weights_at_a_small_learning_rate():
    # A bf16 model at 1e-6 (experiments/gsm8k.py's setting): Adam's first step moves every
    # weight with a gradient by about the learning rate. Kept in bf16 (spacing 2^-15 ≈ 3e-5
    # at 0.02) almost all of those updates round away; the float32 master keeps them.
    model = dataclasses.replace(MODEL, param_dtype="bfloat16")
    config = TrainConfig(learning_rate=1e-6, weight_decay=0.0, max_grad_norm=1e9)
    trainer = Trainer.create(config, model, trainer_mesh(jax.devices()[:1]), G)
    state = trainer.init_state()
    before = jax.device_get(state.params)
    assert {leaf.dtype for leaf in jax.tree.leaves(before)} == {np.dtype(np.float32)}
    assert {leaf.dtype for leaf in jax.tree.leaves(state.opt_state) if leaf.ndim} == {np.dtype(np.float32)}
    state, _ = trainer.step(state, trainer.put_batch(make_batch(0)))
    after = jax.device_get(state.params)
    moved = np.concatenate([np.abs(a - b).ravel() for a, b in
                            zip(jax.tree.leaves(after), jax.tree.leaves(before))])
    # (Embedding rows of tokens the batch lacks have no gradient: 89% move on this batch.)
    assert (moved > 0).mean() > 0.8, (moved > 0).mean()
    assert np.median(moved[moved > 0]) == pytest.approx(1e-6, rel=0.05)
    # What rollout gets: the master in the model's dtype, on the same shards.
    policy = trainer.policy_params(state.params)
    for master, cast in zip(jax.tree.leaves(state.params), jax.tree.leaves(policy)):
        assert cast.dtype == jnp.bfloat16 and cast.sharding == master.sharding
        np.testing.assert_array_equal(np.asarray(cast), np.asarray(master.astype(jnp.bfloat16)))
    # The same update applied to bf16 weights, as the trainer kept them before, is lost.
    kept_bf16 = [(b.astype(jnp.bfloat16) + (a - b)).astype(jnp.bfloat16) != b.astype(jnp.bfloat16)
                 for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(before))]
    assert np.concatenate([np.ravel(k) for k in kept_bf16]).mean() < 0.2
