"""asyncrl.train: GRPO-family losses, the sharded train step and checkpoints."""

from asyncrl.train.checkpoint import (
    Checkpointer,
    CheckpointError,
    ResumeData,
    export_policy,
    restore_or_init,
)
from asyncrl.train.losses import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES, LossConfig
from asyncrl.train.late_metrics import LateMetrics, check_finite
from asyncrl.train.trainer import TrainBatch, TrainConfig, Trainer, TrainState, trainer_mesh

__all__ = [
    "ADVANTAGES",
    "AGGREGATIONS",
    "POLICY_LOSSES",
    "CheckpointError",
    "Checkpointer",
    "LateMetrics",
    "LossConfig",
    "ResumeData",
    "TrainBatch",
    "TrainConfig",
    "TrainState",
    "Trainer",
    "check_finite",
    "export_policy",
    "restore_or_init",
    "trainer_mesh",
]
