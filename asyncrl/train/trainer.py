"""The train step: one consumed buffer in, one optimiser update and its metrics out.

    mesh = trainer_mesh(jax.devices()[:2])
    trainer = Trainer.create(TrainConfig(), ModelConfig.tiny(), mesh, group_size=4)
    state, metrics = trainer.step(trainer.init_state(), trainer.put_batch(batch))

`Trainer.step` is `train_step(state, batch) -> (state, metrics)`: pure, jitted once with
explicit shardings, the state donated. Shapes: B sequences (a multiple of the group size G
and of the micro-batch count M), T tokens. With TrainConfig.tokens_per_row set, B rows of
T = tokens_per_row tokens instead, each packed with several of the N trajectories
(`TrainBatch.from_groups`); B is then bucketed, so the step compiles for a few values of it.

Mesh: FSDP over one named axis, 'fsdp'. The model's logical 'embed' axis and the batch are
split over it (`ShardingRules.fsdp`), so each device holds 1/n of every weight and of every
micro-batch; the same code runs unchanged on a 1-device mesh.

Precision: the state keeps float32 master weights and Adam moments whatever the model's
`param_dtype`; the forward and backward passes run on a copy cast to `param_dtype` (bf16 for
real models), and `policy_params` is that copy, what rollout and evaluation get. Kept in bf16,
an AdamW step at 1e-6 on weights of scale 0.02 changed 2% of them: the rest rounded away.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from asyncrl.model import (
    REMAT_POLICIES, ModelConfig, ShardingRules, abstract_params, apply_hidden, init_params,
    shardings_for, unembed,
)
import asyncrl.train.losses as losses
from asyncrl.registry import Registry
from asyncrl.model.sampling import SamplingParams, sampling_logits
from asyncrl.train import packing
from asyncrl.train.losses import LossConfig

FSDP = "fsdp"
MASTER_DTYPE = jnp.float32


def cast_floats(tree, dtype):
    """`tree` with its floating-point leaves cast to `dtype` (a no-op where they are)."""
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    loss: LossConfig = LossConfig()
    learning_rate: float = 1e-6
    lr_schedule: str = "constant"  # name in LR_SCHEDULES; linear warmup first in both
    warmup_steps: int = 0
    total_steps: int = 1000  # where cosine reaches its floor
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of the peak
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0
    # M: gradient accumulation, so B does not set the memory. Rows of one trajectory only:
    # packed rows run one row per device per micro-batch, as many as the batch's rows.
    num_microbatches: int = 1
    remat: str = "none"  # REMAT_POLICIES: what each layer keeps for the backward pass
    # 0: one trajectory per row, right-padded; else rows of this many tokens, each packed with
    # several trajectories (asyncrl/train/packing.py), their count bucketed.
    tokens_per_row: int = 0
    # How the step attends (ATTENTION_IMPLS, asyncrl/model/attention.py): 'auto' never holds
    # a row's [T, T] scores; 'dense' does (the reference).
    attention: str = "dense"
    # How rollouts draw tokens: the loss's log-probs are of that distribution (temperature,
    # top-k / top-p set), the one the behaviour log-probs are of, so on-policy tokens have
    # importance weight 1 at any sampling setting.
    sampling: SamplingParams = SamplingParams()
    seed: int = 0

    def __post_init__(self):
        LR_SCHEDULES.get(self.lr_schedule)
        REMAT_POLICIES.get(self.remat)
        for name in ("warmup_steps", "total_steps", "num_microbatches", "tokens_per_row"):
            value = getattr(self, name)
            if value < (0 if name in ("warmup_steps", "tokens_per_row") else 1):
                raise ValueError(f"TrainConfig.{name} out of range; received {value}")
        if self.tokens_per_row and self.num_microbatches != 1:
            raise ValueError(
                f"TrainConfig.num_microbatches = {self.num_microbatches} with tokens_per_row = "
                f"{self.tokens_per_row}: packed rows take one row per device per micro-batch, "
                f"as many micro-batches as the batch's rows; leave it at 1")
        if self.warmup_steps > self.total_steps:
            raise ValueError(
                f"warmup_steps ({self.warmup_steps}) exceeds total_steps ({self.total_steps})"
            )
        if not self.learning_rate > 0 or not self.max_grad_norm > 0:
            raise ValueError(
                f"learning_rate and max_grad_norm must be > 0; received {self.learning_rate}, "
                f"{self.max_grad_norm}"
            )


LR_SCHEDULES = Registry("learning-rate schedule")
LR_SCHEDULES.add(
    "constant",
    lambda c: optax.join_schedules(
        [optax.linear_schedule(0.0, c.learning_rate, max(c.warmup_steps, 1)),
         optax.constant_schedule(c.learning_rate)],
        [c.warmup_steps],
    ),
)
LR_SCHEDULES.add(
    "cosine",
    lambda c: optax.warmup_cosine_decay_schedule(
        0.0, c.learning_rate, c.warmup_steps, c.total_steps, c.learning_rate * c.min_lr_ratio
    ),
)


def make_optimizer(config: TrainConfig) -> optax.GradientTransformation:
    def decay_mask(params):
        # No weight decay on norm scales: decaying them towards 0 shrinks every activation.
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "norm" not in jax.tree_util.keystr(path), params
        )

    return optax.chain(
        optax.clip_by_global_norm(config.max_grad_norm),
        optax.adamw(
            LR_SCHEDULES.get(config.lr_schedule)(config),
            b1=config.b1, b2=config.b2, eps=config.adam_eps,
            weight_decay=config.weight_decay, mask=decay_mask,
        ),
    )


@flax.struct.dataclass
class TrainBatch:
    """One consumed buffer, flattened to sequences. Log-probs are of tokens[b, t] at t."""

    tokens: jax.Array  # [B, T] int32, prompt + response, right-padded
    positions: jax.Array  # [B, T] int32
    loss_mask: jax.Array  # [B, T] float32, 1 on generated tokens to train on (never t = 0)
    behaviour_logp: jax.Array  # [B, T] float32, engine log-prob of tokens[b, t]
    token_versions: jax.Array  # [B, T] int32, weight version that generated tokens[b, t]
    rewards: jax.Array  # [B] float32
    v_traj: jax.Array  # [B] int32, the entry's dispatch version
    buffer_version: jax.Array  # [] int32, the buffer consumed = the trainer's version
    # Static: it fixes the [B/G, G] reshape of the advantage estimator and is a run
    # constant, so it never retraces the step.
    group_size: int = flax.struct.field(pytree_node=False)
    # Packed rows (TrainConfig.tokens_per_row > 0), else None: a row holds several
    # trajectories, each with positions from 0 as the engine saw it. rewards and v_traj are
    # then one per trajectory, [N] in group order, and replicated rather than split by row.
    segment_ids: jax.Array | None = None  # [B, T] int32: 0 on padding, 1..k along a row
    trajectory: jax.Array | None = None  # [B, T] int32: a token's index into rewards (0: padding)
    padded_len: jax.Array | None = None  # [] int32: max_len, a trajectory's row unpacked

    @classmethod
    def from_groups(cls, groups, v_traj, version: int, max_len: int, group_size: int,
                    tokens_per_row: int = 0, row_multiple: int = 1) -> "TrainBatch":
        """Consumed groups of trajectory records (prompt, tokens, logprobs, versions, reward)
        as host arrays: B·G rows right-padded to max_len; with tokens_per_row, packed first-fit
        decreasing into rows of that many tokens, as many rows as `packing.bucket_rows` says
        for `row_multiple` (the trainer's devices)."""
        records = [r for g in groups for r in g]
        n, width = len(records), tokens_per_row or max_len
        if tokens_per_row:
            rows = packing.first_fit_decreasing(
                [len(r.prompt) + len(r.tokens) for r in records], tokens_per_row)
            rows += [[]] * (packing.bucket_rows(len(rows), row_multiple, n) - len(rows))
        else:
            rows = [[i] for i in range(n)]
        shape = (len(rows), width)
        tokens, segment_ids, trajectory = (np.zeros(shape, np.int32) for _ in range(3))
        mask, behaviour = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        versions = np.full(shape, version, np.int32)
        positions = np.broadcast_to(np.arange(width, dtype=np.int32), shape).copy()
        for row, members in enumerate(rows):
            start = 0
            for segment, i in enumerate(members, 1):
                r = records[i]
                response, end = start + len(r.prompt), start + len(r.prompt) + len(r.tokens)
                tokens[row, start:response] = r.prompt
                tokens[row, response:end] = r.tokens
                mask[row, response:end] = 1.0
                behaviour[row, response:end] = r.logprobs
                versions[row, response:end] = r.versions
                # From 0 at the trajectory's start, on through the padding after the last one.
                positions[row, start:] = np.arange(width - start)
                segment_ids[row, start:end], trajectory[row, start:end] = segment, i
                start = end
        packed = {} if not tokens_per_row else dict(
            segment_ids=segment_ids, trajectory=trajectory, padded_len=np.int32(max_len))
        rewards = np.asarray([r.reward for r in records], np.float32)
        seq_v_traj = np.repeat(np.asarray(v_traj, np.int32), group_size)
        return cls(tokens, positions, mask, behaviour, versions, rewards, seq_v_traj,
                   np.int32(version), group_size=group_size, **packed)


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # [] int32, optimiser updates done = the policy version
    params: Any  # nnx.State
    opt_state: Any
    rng: jax.Array  # [2] uint32; kept for the loop and the checkpoint, unused by the loss
    ref_params: Any = None  # frozen reference for the KL term; None when kl_coef == 0


def trainer_mesh(devices) -> Mesh:
    return Mesh(np.asarray(devices), (FSDP,))


def batch_shardings(mesh: Mesh, group_size: int, packed: bool = False) -> TrainBatch:
    """Rows split over 'fsdp'. rewards and v_traj go with them, one per row, unless rows are
    packed: then they are one per trajectory, a few numbers each device holds whole."""
    rows, one = NamedSharding(mesh, P(FSDP)), NamedSharding(mesh, P())
    if not packed:
        return TrainBatch(rows, rows, rows, rows, rows, rows, rows, one, group_size=group_size)
    return TrainBatch(rows, rows, rows, rows, rows, one, one, one, group_size=group_size,
                      segment_ids=rows, trajectory=rows, padded_len=one)


# Logits held at once by the loss, per micro-batch: 64 MiB of float32.
LOGITS_CHUNK_ELEMENTS = 1 << 24


def _token_logprobs(hidden: jax.Array, table: jax.Array, tokens: jax.Array,
                    sampling: SamplingParams = SamplingParams()) -> tuple[jax.Array, jax.Array]:
    """log π(tokens[:, t]) and the entropy at t, [B, T]; t = 0 has no prediction, so 0.

    π is the distribution rollouts sample from (`sampling`, asyncrl/model/sampling.py:
    logits over the temperature, renormalised over the top-k / top-p set); greedy sampling
    has none, and reports the model's own, as the engine does.

    hidden [B, T, D] and table [V, D] from `apply_hidden`. The logits [B, T, V] are never
    held whole: at SmolLM2's vocabulary one 16 x 128 micro-batch has 400 MB of them, and the
    softmax, the entropy and their gradients held several such tensors at once (1.2 GB of a
    default step's temporaries). Positions are unembedded a chunk at a time instead, and
    each chunk is recomputed in the backward pass rather than stored.
    """
    b, t, d = hidden.shape
    n = t - 1  # position t predicts token t + 1
    tempered = not sampling.greedy and (sampling.temperature != 1 or sampling.truncates)
    chunk = max(1, min(n, LOGITS_CHUNK_ELEMENTS // (b * table.shape[0])))
    num = -(-n // chunk)
    pad = num * chunk - n
    h = jnp.pad(hidden[:, :-1], ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad)))
    h = h.reshape(b, num, chunk, d).swapaxes(0, 1)  # [num, B, chunk, D]
    targets = targets.reshape(b, num, chunk).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(args):
        h_chunk, target_chunk = args
        logits = unembed(h_chunk, table)  # [B, chunk, V]
        if tempered:
            logits = sampling_logits(logits, sampling)
        logz = jax.nn.log_softmax(logits, axis=-1)
        taken = jnp.take_along_axis(logz, target_chunk[..., None], axis=-1)[..., 0]
        return taken, -(jnp.exp(logz) * logz).sum(-1)

    taken, entropy = jax.lax.map(one_chunk, (h, targets))  # [num, B, chunk] each
    zero = jnp.zeros((b, 1), taken.dtype)

    def unchunk(x):
        return jnp.concatenate([zero, x.swapaxes(0, 1).reshape(b, -1)[:, :n]], 1)

    return unchunk(taken), unchunk(entropy)


@dataclasses.dataclass(frozen=True)
class Trainer:
    """Holds what the step closes over: configs, graphdef, mesh, shardings, optimiser."""

    config: TrainConfig
    model_config: ModelConfig
    mesh: Mesh
    graphdef: Any
    state_shardings: TrainState
    tx: optax.GradientTransformation
    step: Any  # the jitted train_step(state, batch) -> (state, metrics)
    init_fn: Any  # jitted (params | None) -> TrainState, compiled once per kind of argument
    group_size: int
    to_policy: Any  # jitted master params -> the model's dtype, on the params' shards

    @classmethod
    def create(cls, config: TrainConfig, model_config: ModelConfig, mesh: Mesh, group_size: int):
        tx = make_optimizer(config)
        graphdef, abstract = abstract_params(model_config)
        abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, MASTER_DTYPE), abstract)
        rules = ShardingRules.fsdp(FSDP)
        param_sh = shardings_for(abstract, mesh, rules)
        # Adam's moments inherit the params' logical axes, so they shard the same way.
        opt_sh = shardings_for(jax.eval_shape(tx.init, abstract), mesh, rules)
        scalar = NamedSharding(mesh, P())
        state_sh = TrainState(
            step=scalar, params=param_sh, opt_state=opt_sh, rng=scalar,
            ref_params=param_sh if config.loss.kl_coef > 0 else None,
        )
        compute = jnp.dtype(model_config.param_dtype)
        fn = _make_step_fn(config, graphdef, tx, mesh, param_sh, compute)
        # Donating the state lets XLA update params and Adam moments in place: without it
        # the step holds two copies of the optimiser state at its peak.
        step = jax.jit(
            fn,
            in_shardings=(state_sh, batch_shardings(mesh, group_size, config.tokens_per_row > 0)),
            out_shardings=(state_sh, scalar),
            donate_argnums=0,
        )
        return cls(config, model_config, mesh, graphdef, state_sh, tx, step,
                   _make_init_fn(config, model_config, tx, state_sh), group_size,
                   jax.jit(lambda p: cast_floats(p, compute), out_shardings=param_sh))

    def policy_params(self, params):
        """The master weights as the policy computes with them: in the model's dtype, on the
        same shards (the master itself when that dtype is float32)."""
        if jnp.dtype(self.model_config.param_dtype) == MASTER_DTYPE:
            return params
        return self.to_policy(params)

    def init_state(self, params=None) -> TrainState:
        """A fresh state, built straight into its shards (nothing lands on device 0 first).

        `params`: start from these weights (e.g. loaded from HF) instead of a random init.
        """
        if params is not None:  # host or foreign-mesh weights: an explicit, intended copy
            params = jax.device_put(params, self.state_shardings.params)
        return self.init_fn(params)

    def abstract_state(self) -> TrainState:
        """ShapeDtypeStructs with shardings: the restore target of a checkpoint."""
        shapes = jax.eval_shape(self.init_state)
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            shapes, self.state_shardings,
        )

    def host_batch(self, groups, v_traj, version: int, max_len: int) -> TrainBatch:
        """Consumed groups as host arrays in the layout the step is compiled for
        (`TrainBatch.from_groups`): packed into rows of config.tokens_per_row when set, a
        bucketed multiple of the devices (a micro-batch is one row per device)."""
        return TrainBatch.from_groups(groups, v_traj, version, max_len, self.group_size,
                                      self.config.tokens_per_row, self.mesh.size)

    def put_batch(self, batch: TrainBatch) -> TrainBatch:
        """Host arrays → the trainer mesh, rows split over 'fsdp' (an intended transfer)."""
        if batch.group_size != self.group_size:
            raise ValueError(
                f"batch.group_size={batch.group_size}, but the trainer was built for "
                f"group_size={self.group_size}"
            )
        packed = self.config.tokens_per_row > 0
        if (batch.segment_ids is not None) != packed:
            raise ValueError(
                f"the trainer was built for tokens_per_row={self.config.tokens_per_row} "
                f"({'packed rows' if packed else 'one trajectory per row'}), but the batch "
                f"{'has' if batch.segment_ids is not None else 'has no'} segment ids: build it "
                f"with Trainer.host_batch")
        return jax.device_put(batch, batch_shardings(self.mesh, self.group_size, packed))


def _make_init_fn(config: TrainConfig, model_config: ModelConfig, tx, state_sh):
    with_ref = config.loss.kl_coef > 0

    compute = jnp.dtype(model_config.param_dtype)

    def init(params):
        if params is None:
            params = init_params(model_config, config.seed)[1]
        master = cast_floats(params, MASTER_DTYPE)
        return TrainState(
            step=jnp.zeros((), jnp.int32), params=master, opt_state=tx.init(master),
            rng=jax.random.PRNGKey(config.seed),
            # Frozen: it needs no master copy, only what the forward pass reads.
            ref_params=cast_floats(params, compute) if with_ref else None,
        )

    return jax.jit(init, out_shardings=state_sh)


_UNROLL_MICROBATCHES = contextvars.ContextVar("unroll_microbatches", default=False)


@contextlib.contextmanager
def unrolled_microbatches():
    """While active, the train step traces its micro-batch loop unrolled, as
    `asyncrl.model.transformer.unrolled_layers` does the layers: the reference against which
    tests/test_plan.py checks that asyncrl/plan/hlo_cost.py counts every iteration of the
    scanned step (XLA counts a loop's body once). Nothing else uses it. Read at trace time."""
    token = _UNROLL_MICROBATCHES.set(True)
    try:
        yield
    finally:
        _UNROLL_MICROBATCHES.reset(token)


def _make_step_fn(config: TrainConfig, graphdef, tx, mesh: Mesh, param_sh, compute):
    loss_cfg = config.loss
    m = config.num_microbatches  # rows of one trajectory; packed rows count their own

    def microbatches(x, m):
        """[B, ...] → [M, B/M, ...] with micro-batch k = rows k, k+M, ...

        Strided, not contiguous: each device holds a contiguous block of rows, so every
        micro-batch keeps an equal share on every device and no rows move.
        """
        b = x.shape[0]
        if b % m:
            raise ValueError(f"batch of {b} sequences does not split into {m} micro-batches")
        x = x.reshape(b // m, m, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, FSDP)))

    def micro_loss(master, ref_params, mb):
        tokens, positions, mask, behaviour, adv, agg_w, segment_ids = mb
        # The cast is inside the differentiated function: the gradient comes back in float32.
        params = cast_floats(master, compute)
        logp, entropy = _token_logprobs(
            *apply_hidden(graphdef, params, tokens, positions, config.remat, segment_ids,
                          config.attention, mesh),
            tokens, config.sampling)
        ref_logp = None
        if ref_params is not None:
            ref = apply_hidden(graphdef, jax.lax.stop_gradient(ref_params), tokens, positions,
                               segment_ids=segment_ids, attention=config.attention, mesh=mesh)
            ref_logp = _token_logprobs(*ref, tokens, config.sampling)[0]
        # A micro-batch holds whole rows, so each trajectory's sums (GSPO's ratio) are whole.
        per_token, aux = losses.token_terms(loss_cfg, logp, behaviour, adv, mask, entropy, ref_logp,
                                            losses.Sequences(segment_ids))
        loss = (per_token * agg_w).sum()
        sums = {k: jnp.where(mask > 0, v, 0.0).sum() for k, v in aux.items() if k != "is_weight"}
        # An infinite log-ratio is truncated to a finite weight, but it still means the engine
        # or the trainer produced a NaN/Inf log-prob for a trained token: count it as well.
        finite = jnp.isfinite(aux["is_weight"]) & jnp.isfinite(logp - behaviour)
        sums["is_weight_nonfinite"] = jnp.where(mask > 0, ~finite, False).sum().astype(jnp.float32)
        return loss, (sums, aux["is_weight"])

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def train_step(state: TrainState, batch: TrainBatch):
        # Position 0 (a row's first token, or a packed trajectory's) has no prediction.
        mask = jnp.where(batch.positions > 0, batch.loss_mask.astype(jnp.float32), 0.0)
        adv = losses.compute_advantages(loss_cfg, batch.rewards, batch.group_size)  # [N]
        sequences = losses.ROWS
        if batch.segment_ids is not None:  # packed rows: each token gets its trajectory's
            adv = adv[batch.trajectory]
            padded = (batch.rewards.shape[0] * batch.padded_len).astype(jnp.float32)
            sequences = losses.Sequences(batch.segment_ids, padded)
        # Weights from the whole batch's mask: the micro-batch losses then sum to the
        # full-batch loss exactly, whatever M is.
        agg_w = losses.aggregation_weights(mask, loss_cfg.aggregation, sequences)
        per_row = (batch.tokens, batch.positions, mask, batch.behaviour_logp, adv, agg_w,
                   batch.segment_ids)
        # Packed rows: one row per device at once, whatever the batch's row count (bucketed
        # by the host), so a longer batch runs more micro-batches, never more rows per chip
        # than the planner checked.
        count = m if batch.segment_ids is None else batch.tokens.shape[0] // mesh.size
        xs = jax.tree.map(lambda x: microbatches(x, count), per_row)  # (None: left out)

        def accumulate(carry, mb):
            grads, loss, sums = carry
            (l, (s, w)), g = grad_fn(state.params, state.ref_params, mb)
            # Pinned to the params' shards: an unconstrained carry may be replicated, and a
            # replicated gradient buffer is exactly the memory FSDP exists to avoid.
            grads = jax.lax.with_sharding_constraint(jax.tree.map(jnp.add, grads, g), param_sh)
            return (grads, loss + l, jax.tree.map(jnp.add, sums, s)), w

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        zeros = jax.lax.with_sharding_constraint(zeros, param_sh)
        first = jax.tree.map(lambda x: x[0], xs)
        (_, (sums0, _)), _ = jax.eval_shape(grad_fn, state.params, state.ref_params, first)
        init = (zeros, jnp.zeros(()), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), sums0))
        (grads, loss, sums), weights = jax.lax.scan(accumulate, init, xs,
                                                    unroll=_UNROLL_MICROBATCHES.get())

        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
        metrics = _metrics(config, state.step, loss, grads, sums, weights, xs[2], mask, batch)
        return new_state, metrics

    return train_step


def _metrics(config, step, loss, grads, sums, weights, micro_mask, mask, batch) -> dict[str, Any]:
    n_tok = jnp.maximum(mask.sum(), 1.0)
    on = micro_mask > 0  # [M, B/M, T], lined up with the stacked weights
    w = jnp.where(on, weights, jnp.nan)
    q50, q90, q99 = jnp.nanquantile(w, jnp.array([0.5, 0.9, 0.99]))
    seq_lag = (batch.buffer_version - batch.v_traj).astype(jnp.float32)
    tok_lag = (batch.buffer_version - batch.token_versions).astype(jnp.float32)
    tok_lag = jnp.where(mask > 0, tok_lag, jnp.nan)
    out = {
        "loss": loss,
        "grad_norm": optax.tree.norm(grads),
        "learning_rate": LR_SCHEDULES.get(config.lr_schedule)(config)(step),
        "clip_frac": sums["clipped"] / n_tok,
        "clip_low_frac": sums["clipped_low"] / n_tok,
        "is_weight_p50": q50,
        "is_weight_p90": q90,
        "is_weight_p99": q99,
        "is_weight_max": jnp.nanmax(w),
        "is_truncated_frac": sums["is_truncated"] / n_tok,
        "is_weight_nonfinite": sums["is_weight_nonfinite"],
        "approx_kl": sums["approx_kl"] / n_tok,
        "entropy": sums["entropy"] / n_tok,
        "staleness_mean": seq_lag.mean(),
        "staleness_max": seq_lag.max(),
        "token_lag_mean": jnp.nanmean(tok_lag),
        "token_lag_max": jnp.nanmax(tok_lag),
        "trained_tokens": mask.sum(),
    }
    if "kl_ref" in sums:
        out["kl_ref"] = sums["kl_ref"] / n_tok
    return out
