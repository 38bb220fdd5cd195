"""`config.train` and `config.checkpoint`: the optimisation, the loss's settings and when the
run checkpoints. Import-light; the loss names are checked with the losses (JAX), in
`asyncrl.train.settings.train_config`, before anything loads.
"""

from __future__ import annotations

from asyncrl.model.attention_names import ATTENTION_IMPLS
from asyncrl.model.remat import REMAT_POLICIES
from asyncrl.sections import Section, fail, int_at_least, positive, registered, section


@section
class TrainSection(Section):
    name = "train"
    steps: int
    batch_size: int  # B, in entries (prompts; each a group of rollout.group_size responses)
    num_microbatches: int
    learning_rate: float
    lr_schedule: str
    warmup_steps: int
    weight_decay: float
    max_grad_norm: float
    advantage: str
    policy_loss: str
    aggregation: str
    eps_low: float  # 0: the policy loss's own ε
    eps_high: float
    tis_cap: float  # 0: no cap
    kl_coef: float
    entropy_coef: float
    remat: str
    attention: str  # ATTENTION_IMPLS: how training and scoring attend (asyncrl/model/attention.py)
    # 0: one trajectory per row, padded to rollout.max_len; else rows of this many tokens,
    # each packed with several trajectories (asyncrl/train/packing.py).
    tokens_per_row: int
    batch_timeout_s: float
    stop_without_signal: bool
    # A run folder recorded before these fields resolves as it trained: dense scores, a
    # trajectory per row.
    added = {"attention": "dense", "tokens_per_row": 0}

    def check(self) -> None:
        for field, minimum in (("batch_size", 1), ("steps", 1), ("num_microbatches", 1),
                               ("warmup_steps", 0), ("tokens_per_row", 0)):
            int_at_least(f"train.{field}", getattr(self, field), minimum)
        for field in ("learning_rate", "max_grad_norm", "batch_timeout_s"):
            positive(f"train.{field}", getattr(self, field))
        if self.tokens_per_row and self.num_microbatches != 1:
            fail("train.num_microbatches", self.num_microbatches,
                 f"1 with packed rows (train.tokens_per_row = {self.tokens_per_row}): a "
                 f"micro-batch is then one packed row per trainer device, and a step runs as "
                 f"many as its rows need")
        registered("train.remat", self.remat, REMAT_POLICIES)
        if self.attention not in ATTENTION_IMPLS:
            fail("train.attention", self.attention, f"one of {', '.join(ATTENTION_IMPLS)}")
        if not 0 <= self.eps_low < 1:
            fail("train.eps_low", self.eps_low, "expected a number in [0, 1) (0: the policy "
                 "loss's own ε)")
        if not self.eps_high >= 0:
            fail("train.eps_high", self.eps_high, "expected a number ≥ 0 (0: the policy loss's "
                 "own ε)")
        if self.tis_cap < 0:
            fail("train.tis_cap", self.tis_cap, "expected a number ≥ 0 (0 turns the cap off)")
        if self.warmup_steps > self.steps:
            fail("train.warmup_steps", self.warmup_steps, f"at most train.steps ({self.steps})")
        if self.lr_schedule == "cosine" and self.warmup_steps == self.steps:
            # optax's cosine needs a step to decay over: it would fail inside the first step.
            fail("train.warmup_steps", self.warmup_steps,
                 f"below train.steps ({self.steps}) with train.lr_schedule = 'cosine'")


@section
class CheckpointSection(Section):
    name = "checkpoint"
    every_steps: int  # 0: at the end only
    keep: int

    def check(self) -> None:
        int_at_least("checkpoint.every_steps", self.every_steps, 0)
        int_at_least("checkpoint.keep", self.keep, 1)
