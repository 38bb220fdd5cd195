"""Packed rows (train.tokens_per_row): the packer's own invariants, the layout it writes, and
a packed step that trains exactly as the padded one (loss, gradients, every metric)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asyncrl.model import attention as attention_lib
from asyncrl.config import validate
from asyncrl.config_args import ConfigError
from asyncrl.config import with_overrides
from asyncrl.model import apply_hidden
from asyncrl.train import losses, packing
from asyncrl.train.losses import LossConfig
from asyncrl.train.trainer import TrainBatch, Trainer, TrainConfig, _token_logprobs, trainer_mesh
from experiments.grpo import get_config
from tests.train.helpers import MODEL

MAX_LEN, ROW = 16, 24  # a trajectory's padded length unpacked; the packed rows' budget
# Prompt + response lengths, in group order. First-fit decreasing into rows of 24 fills
# five rows exactly (16 + 8, 15 + 9, 14 + 10, 13 + 11, 12 + 7 + 5), their last trajectory
# ending at the row's last token, and a sixth with 20 (6 + 5 + 4 + 3 + 2).
LENGTHS = [16, 8, 13, 11, 7, 5, 9, 3, 12, 4, 10, 6, 14, 2, 15, 5]


@dataclasses.dataclass
class _Record:  # what TrainBatch.from_groups reads of a trajectory
    prompt: np.ndarray
    tokens: list
    logprobs: list
    versions: list
    reward: float


def _groups(group_size: int, seed: int = 0) -> list[list[_Record]]:
    """Trajectories of LENGTHS with 1-5 prompt tokens, groups of `group_size`, each group
    rewarded unevenly (a GRPO signal), versions rising along partial rollouts."""
    rng = np.random.default_rng(seed)
    records = []
    for i, length in enumerate(LENGTHS):
        p = int(rng.integers(1, min(length, 6)))
        g = length - p
        records.append(_Record(
            prompt=rng.integers(3, MODEL.vocab_size, p).astype(np.int32),
            tokens=rng.integers(3, MODEL.vocab_size, g).tolist(),
            logprobs=(-rng.uniform(4.5, 6.5, g)).tolist(),  # ≈ log(1/256) ± 1, as the engine's
            versions=np.minimum(2 + (np.arange(g) >= 3), 3).tolist(),
            reward=float(rng.integers(0, 2) if group_size == 1 else i % 3 == 0),
        ))
    return [records[k:k + group_size] for k in range(0, len(records), group_size)]


def _v_traj(group_size: int) -> list[int]:
    return [2] * (len(LENGTHS) // group_size)


# ------------------------------------------------------------------------------- the packer


def test_first_fit_decreasing_places_longest_first_into_the_first_row_with_room():
    # 7 opens row 0, 6 row 1, 5 row 2; 4 fits row 1 (6 + 4 = 10), 3 row 0, 2 row 2.
    assert packing.first_fit_decreasing([5, 3, 7, 2, 4, 6], 10) == [[2, 1], [5, 4], [0, 3]]
    # Equal lengths keep their order.
    assert packing.first_fit_decreasing([4, 4, 4], 8) == [[0, 1], [2]]


@pytest.mark.parametrize("seed", range(5))
def test_first_fit_decreasing_holds_every_trajectory_once_and_never_overflows(seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(16, 64))
    lengths = rng.integers(1, capacity + 1, int(rng.integers(1, 200))).tolist()
    rows = packing.first_fit_decreasing(lengths, capacity)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= capacity for row in rows)
    # Decreasing, first fit: when a trajectory was placed (longest first, ties by index), no
    # earlier row had room for it.
    rank = {i: k for k, i in enumerate(sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)))}
    for r, row in enumerate(rows):
        for i in row:
            for earlier in rows[:r]:
                used = sum(lengths[j] for j in earlier if rank[j] < rank[i])
                assert capacity - used < lengths[i], (r, i)


def test_a_trajectory_longer_than_a_row_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="a trajectory of 30 tokens does not fit a row of "
                                         "train.tokens_per_row = 24"):
        packing.first_fit_decreasing([10, 30], 24)


@pytest.mark.parametrize("multiple", [1, 2, 4, 8])
def test_row_counts_are_bucketed_to_few_shapes_that_split_evenly(multiple):
    trajectories = 256
    buckets = [packing.bucket_rows(rows, multiple, trajectories)
               for rows in range(1, trajectories + 1)]
    assert all(b % multiple == 0 for b in buckets)
    assert all(rows <= b <= -(-trajectories // multiple) * multiple
               for rows, b in enumerate(buckets, 1))
    assert buckets == sorted(buckets)
    # Each bucket at most 9/8 of the rows it holds, once rounded to the multiple.
    assert all(b <= 9 / 8 * (-(-rows // multiple) * multiple)
               for rows, b in enumerate(buckets, 1))
    assert len(set(buckets)) <= max(8 * np.log2(trajectories / multiple), 1)


# ------------------------------------------------------------------------------- the layout


def test_packed_rows_hold_each_trajectory_once_with_its_own_positions():
    groups = _groups(8)
    records = [r for g in groups for r in g]
    batch = TrainBatch.from_groups(groups, _v_traj(8), 3, MAX_LEN, 8, ROW, row_multiple=4)
    rows, width = batch.tokens.shape
    assert width == ROW and rows == 8  # 6 rows used, bucketed up to 2 × 4
    seen = []
    for row in range(rows):
        ids = batch.segment_ids[row]
        used = int((ids > 0).sum())
        assert (ids[:used] > 0).all() and (ids[used:] == 0).all()  # padding at the end only
        for segment in range(1, ids.max() + 1):
            at = np.flatnonzero(ids == segment)
            assert (np.diff(at) == 1).all()  # contiguous
            (i,) = set(batch.trajectory[row, at])
            r = records[i]
            seen.append(i)
            np.testing.assert_array_equal(batch.tokens[row, at], np.concatenate([r.prompt, r.tokens]))
            np.testing.assert_array_equal(batch.positions[row, at], np.arange(len(at)))
            response = at[len(r.prompt):]
            assert batch.loss_mask[row, at].sum() == len(r.tokens) and batch.loss_mask[row, response].all()
            np.testing.assert_allclose(batch.behaviour_logp[row, response], r.logprobs, rtol=1e-6)
            np.testing.assert_array_equal(batch.token_versions[row, response], r.versions)
    assert sorted(seen) == list(range(len(records)))
    assert (batch.loss_mask[batch.segment_ids == 0] == 0).all()
    assert sum(batch.segment_ids[:, -1] > 0) == 5  # trajectories ending at a row's end
    # Per trajectory, in group order: the advantages' [N/G, G] reshape still holds groups.
    np.testing.assert_array_equal(batch.rewards, [r.reward for r in records])
    assert batch.v_traj.shape == (len(records),) and int(batch.padded_len) == MAX_LEN


def test_a_batch_of_more_packed_rows_runs_more_micro_batches_not_more_rows_at_once():
    """A micro-batch of packed rows is one row per device, however many rows the batch has:
    a batch four times as long holds what the planner checked for one row at once."""
    config = TrainConfig(tokens_per_row=ROW, remat="full")
    trainer = Trainer.create(config, MODEL, trainer_mesh(jax.devices()[:2]), 8)
    state = trainer.abstract_state()

    def at_once(copies):
        groups = [g for _ in range(copies) for g in _groups(8)]
        batch = trainer.put_batch(trainer.host_batch(groups, _v_traj(8) * copies, 3, MAX_LEN))
        memory = trainer.step.lower(state, batch).compile().memory_analysis()
        return batch.tokens.shape[0], memory.temp_size_in_bytes

    (rows, temp), (more_rows, more_temp) = at_once(1), at_once(4)
    assert more_rows >= 4 * rows - 2  # 6 rows, then 24 (bucketed to the 2 devices)
    # The batch's own arrays grow with the rows; what the step computes at once does not.
    assert more_temp < 1.5 * temp


# --------------------------------------------------------------- packed step = padded step


@pytest.fixture
def batch_baseline(monkeypatch):
    """An advantage estimator for groups of one (every registered one needs G ≥ 2): reward
    minus the batch's mean. Registered for this test alone."""
    losses.ADVANTAGES.add("batch_baseline", lambda rewards, g: rewards - rewards.mean())
    yield "batch_baseline"
    losses.ADVANTAGES.remove("batch_baseline")


def _step(loss: LossConfig, group_size: int, tokens_per_row: int, params,
          attention: str = "dense"):
    """One step from `params` on 2 devices × 2 micro-batches (packed: one row per device at
    once, as many as the rows need): its metrics, and the update,
    which here is the gradient itself. lr = Adam's ε = A makes the first update
    A·g / (|g| + A) = g (1 - |g|/A), and no clipping or decay acts."""
    big = 1e6
    config = TrainConfig(loss=loss, learning_rate=big, adam_eps=big, max_grad_norm=1e9,
                         weight_decay=0.0, num_microbatches=1 if tokens_per_row else 2,
                         tokens_per_row=tokens_per_row,
                         attention=attention)
    trainer = Trainer.create(config, MODEL, trainer_mesh(jax.devices()[:2]), group_size)
    batch = trainer.host_batch(_groups(group_size), _v_traj(group_size), 3, MAX_LEN)
    state, metrics = trainer.step(trainer.init_state(params), trainer.put_batch(batch))
    update = jax.tree.map(lambda new, old: -(np.asarray(new, np.float64) - old),
                          jax.device_get(state.params), params)
    return jax.device_get(metrics), update, batch


@pytest.mark.parametrize("loss, group_size", [
    (dict(aggregation="token-mean"), 8),
    # One ratio per sequence: ε wide enough that some sequences are not clipped.
    (dict(policy_loss="gspo", eps_low=0.1, eps_high=0.1, aggregation="seq-mean-token-mean"), 8),
    (dict(advantage="drgrpo", aggregation="seq-mean-token-sum-norm"), 8),
    (dict(advantage="batch_baseline", aggregation="seq-mean-token-mean"), 1),
], ids=["token-mean", "gspo-seq-mean", "drgrpo-sum-norm", "groups-of-1-seq-mean"])
def test_packed_step_equals_the_padded_step(request, trainer, loss, group_size):
    if loss.get("advantage") == "batch_baseline":
        request.getfixturevalue("batch_baseline")
    loss = LossConfig(**loss, kl_coef=0.02, entropy_coef=0.001)
    params = jax.device_get(trainer.init_state().params)
    padded, padded_grad, padded_batch = _step(loss, group_size, 0, params)
    packed, packed_grad, packed_batch = _step(loss, group_size, ROW, params)
    assert packed_batch.tokens.size < padded_batch.tokens.size  # it packed: 8 x 24 < 16 x 16
    for key, want in padded.items():
        np.testing.assert_allclose(packed[key], want, rtol=2e-5, atol=1e-7, err_msg=key)
    assert padded["grad_norm"] > 1e-3 and padded["clip_frac"] > 0  # a gradient, and clipping
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(padded_grad))
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-4,
                                                              atol=1e-5 * scale),
                 packed_grad, padded_grad)


def test_a_packed_step_attending_blockwise_equals_the_padded_dense_step(trainer, monkeypatch):
    """The blockwise path inside the real step, its rows of 24 cut in blocks of 7 (so the
    online softmax rescales across blocks, and blocks straddle trajectories)."""
    monkeypatch.setattr(attention_lib, "BLOCKWISE_BLOCK", 7)
    loss = LossConfig(aggregation="token-mean", kl_coef=0.02, entropy_coef=0.001)
    params = jax.device_get(trainer.init_state().params)
    padded, padded_grad, _ = _step(loss, 8, 0, params)
    packed, packed_grad, _ = _step(loss, 8, ROW, params, attention="blockwise")
    for key, want in padded.items():
        np.testing.assert_allclose(packed[key], want, rtol=2e-4, atol=1e-6, err_msg=key)
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(padded_grad))
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, rtol=1e-3,
                                                              atol=1e-4 * scale),
                 packed_grad, padded_grad)


def test_packed_log_probs_equal_the_padded_rows(trainer):
    """The same tokens scored in a packed row and in a row of their own: the same log-probs
    (what makes the importance weights against the engine's the same as today's)."""
    groups = _groups(8)
    padded = TrainBatch.from_groups(groups, _v_traj(8), 3, MAX_LEN, 8)
    packed = TrainBatch.from_groups(groups, _v_traj(8), 3, MAX_LEN, 8, ROW)
    params = jax.device_get(trainer.init_state().params)

    def logp(batch):
        hidden = apply_hidden(trainer.graphdef, params, jnp.asarray(batch.tokens),
                              jnp.asarray(batch.positions), segment_ids=batch.segment_ids)
        return np.asarray(_token_logprobs(*hidden, jnp.asarray(batch.tokens))[0])

    want, got = logp(padded), logp(packed)
    for i in range(len(LENGTHS)):
        on_packed = (packed.trajectory == i) & (packed.segment_ids > 0) & (packed.loss_mask > 0)
        np.testing.assert_allclose(got[on_packed], want[i][padded.loss_mask[i] > 0],
                                   rtol=1e-5, atol=1e-5)
    # Without segment ids the packed row's later trajectories would see the earlier ones.
    leaky = apply_hidden(trainer.graphdef, params, jnp.asarray(packed.tokens),
                         jnp.asarray(packed.positions))
    leaky = np.asarray(_token_logprobs(*leaky, jnp.asarray(packed.tokens))[0])
    assert np.abs(leaky - got)[packed.loss_mask > 0].max() > 1e-3


# -------------------------------------------------------------------------------- the config


def test_the_row_budget_is_checked_against_the_longest_trajectory():
    config = get_config("tiny")  # rollout.max_len = 20
    with pytest.raises(ConfigError, match=r"config.train.tokens_per_row = 19 is not allowed: 0 "
                       r"\(one trajectory per row\) or at least rollout.prompt_bucket \+ "
                       r"rollout.max_new_tokens = 20"):
        validate(with_overrides(config, {"train.tokens_per_row": 19}), device_count=8)
    # Packed rows are bucketed to split over the devices, whatever N is; their micro-batches
    # are one row per device, as many as the rows, so a count set beside them is refused.
    packed = {"train.num_microbatches": 1, "train.tokens_per_row": 20}
    assert validate(with_overrides(config, packed), device_count=8).train.tokens_per_row == 20
    with pytest.raises(ConfigError, match=r"config.train.num_microbatches = 2 is not allowed: "
                       r"1 with packed rows \(train.tokens_per_row = 20\)"):
        validate(with_overrides(config, {**packed, "train.num_microbatches": 2}),
                 device_count=8)
    with pytest.raises(ConfigError, match="config.train.num_microbatches = 3"):
        validate(with_overrides(config, {"train.num_microbatches": 3}), device_count=8)
