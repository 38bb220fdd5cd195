"""The trainer's settings from a run's spec: `train_config(train, sampling, seed)`, for every
process and every command that builds a Trainer (the run, evaluation and export of a
checkpoint, the planner).

Here, beside the trainer, so that what builds one needs the train package alone: the run, the
planner and evaluation no longer import each other for it.
"""

from __future__ import annotations

from asyncrl.config_args import ConfigError
from asyncrl.model.sampling import SamplingParams
from asyncrl.train.losses import LossConfig
from asyncrl.train.section import TrainSection
from asyncrl.train.trainer import TrainConfig


def train_config(train: TrainSection, sampling: SamplingParams, seed: int) -> TrainConfig:
    """`sampling`: the rollout's (config.rollout), whose log-probs the loss corrects against;
    `seed`: the run's (config.seed)."""
    # The loss and schedule names are checked here, not in config.resolve: their registries
    # live beside the losses and optimizers, which need JAX. Still before anything loads.
    try:
        loss = LossConfig(advantage=train.advantage, policy_loss=train.policy_loss,
                          eps_low=train.eps_low or None, eps_high=train.eps_high or None,
                          tis_cap=train.tis_cap or None, kl_coef=train.kl_coef,
                          entropy_coef=train.entropy_coef, aggregation=train.aggregation)
        return TrainConfig(loss=loss, learning_rate=train.learning_rate,
                           lr_schedule=train.lr_schedule, warmup_steps=train.warmup_steps,
                           total_steps=train.steps, weight_decay=train.weight_decay,
                           max_grad_norm=train.max_grad_norm,
                           num_microbatches=train.num_microbatches, remat=train.remat,
                           tokens_per_row=train.tokens_per_row, attention=train.attention,
                           sampling=sampling, seed=seed)
    except ValueError as error:
        raise ConfigError(f"config.train: {error}") from None
