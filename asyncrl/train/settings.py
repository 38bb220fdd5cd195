"""The trainer's settings from a run's config: `train_config(c)`, for every process and every
command that builds a Trainer (the run, evaluation and export of a checkpoint, the planner).

Here, beside the trainer, so that what builds one needs the train package alone: the run, the
planner and evaluation no longer import each other for it.
"""

from __future__ import annotations

from asyncrl.config_args import ConfigError
from asyncrl.model.sampling import SamplingParams
from asyncrl.train.losses import LossConfig
from asyncrl.train.trainer import TrainConfig


def train_config(c) -> TrainConfig:
    try:
        loss = LossConfig(advantage=c.train.advantage, policy_loss=c.train.policy_loss,
                          eps_low=c.train.eps_low or None, eps_high=c.train.eps_high or None,
                          tis_cap=c.train.tis_cap or None, kl_coef=c.train.kl_coef,
                          entropy_coef=c.train.entropy_coef, aggregation=c.train.aggregation)
    except ValueError as error:  # checked here, not in config.validate: the losses need JAX
        raise ConfigError(f"config.train: {error}") from None
    return TrainConfig(loss=loss, learning_rate=c.train.learning_rate,
                       lr_schedule=c.train.lr_schedule, warmup_steps=c.train.warmup_steps,
                       total_steps=c.train.steps, weight_decay=c.train.weight_decay,
                       max_grad_norm=c.train.max_grad_norm,
                       num_microbatches=c.train.num_microbatches, remat=c.train.remat,
                       sampling=SamplingParams.of_rollout(c.rollout), seed=c.seed)
