"""`config.eval`: what a run evaluates, how often and how, and its checks."""

from __future__ import annotations

from asyncrl.data.sources import SPLITS
from asyncrl.rewards.registry import REWARDS, format_check
from asyncrl.sections import Section, fail, int_at_least, section


@section
class EvalSection(Section):
    name = "eval"
    heldout_size: int  # problems of a split each evaluation reads
    every_steps: int  # 0: before and after training only
    split: str  # what periodic evaluations read
    max_new_tokens: int
    samples: int  # responses sampled per problem for pass@k (0: greedy only)
    pass_k: tuple[int, ...]
    # 'auto': the task reward's own format check; '': none; or a registered reward.
    format_reward: str

    def check(self) -> None:
        for field in ("heldout_size", "every_steps", "samples"):
            int_at_least(f"eval.{field}", getattr(self, field), 0)
        int_at_least("eval.max_new_tokens", self.max_new_tokens, 1)
        if self.split not in SPLITS:
            fail("eval.split", self.split, f"one of {', '.join(SPLITS)} (what periodic "
                 f"evaluations read; the test split is also evaluated before and after training)")
        if self.samples and not all(1 <= k <= self.samples for k in self.pass_k):
            fail("eval.pass_k", self.pass_k, f"each k an int in [1, eval.samples = {self.samples}]")
        if self.format_reward not in ("", "auto") and self.format_reward not in REWARDS:
            fail("eval.format_reward", self.format_reward,
                 f"'auto' (the task reward's own), '' (none) or a registered reward: "
                 f"{', '.join(REWARDS.names())}")

    def check_against(self, reward: str) -> None:
        """The format rate must measure the format the task's reward (config.task.reward)
        reads."""
        if self.format_reward not in ("", "auto") and format_check(reward) not in (
                None, self.format_reward):
            fail("eval.format_reward", self.format_reward,
                 f"'auto' or {format_check(reward)!r}: the format task.reward = {reward!r} reads")

    def format_check(self, reward: str) -> str | None:
        """The format check this section names for a task paid by `reward`: 'auto' is the
        one matching the reward's answer format (None for a reward of unknown format), ''
        none."""
        if self.format_reward == "auto":
            return format_check(reward)
        return self.format_reward or None
