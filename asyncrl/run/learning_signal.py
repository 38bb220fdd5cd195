"""Whether the first batches carry anything to learn from.

GRPO learns from the differences between a group's rewards: a group whose responses all score
alike has zero advantage everywhere and moves nothing. A run whose first batches hold only such
groups would train for its whole length without a word, so the run looks once, at the first
FIRST_STEPS steps of a run, and says what it can see of the cause:

  format rate 0    no response put its answer where the reward reads it: the prompt's
                   instruction and the grader disagree
  every reward ≥ 1 the model already solves the task
  every reward 0   every response is wrong (too hard as sampled), or cut at the token cap

`train.stop_without_signal` makes that an error that ends the run instead of a warning.
Every batch's count of such groups is in the metrics (`no_signal_groups`) either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from asyncrl.errors import UserError

FIRST_STEPS = 3


class NoLearningSignal(UserError):
    """The first batches' groups carry no signal and the config asks to stop on it."""


def no_signal_groups(group_rewards: Sequence[Sequence[float]]) -> int:
    """How many groups have all their rewards equal (GRPO's advantage is 0 for each)."""
    return sum(1 for rewards in group_rewards if len(rewards) and max(rewards) == min(rewards))


class LearningSignalWatch:
    """Feed it each trained step's batch figures (asyncrl.run.describe_batch); once the first
    `first_steps` steps of the run have all carried no signal, `update` returns the one message
    to show, else None."""

    def __init__(self, reward: str, instruction_fields: str, group_size: int,
                 first_steps: int = FIRST_STEPS):
        self.reward, self.instruction_fields = reward, instruction_fields
        self.group_size, self.first_steps = group_size, first_steps
        self._seen: list[dict[str, Any]] = []
        self.done = False

    def update(self, step: int, figures: dict[str, Any]) -> str | None:
        if self.done or step > self.first_steps:
            return None  # a resumed run was looked at when it started
        if figures["no_signal_groups"] < figures["groups"]:
            self.done = True  # some group differs: there is something to learn from
            return None
        self._seen.append(figures)
        if len(self._seen) < self.first_steps:
            return None
        self.done = True
        return self._message(step)

    def filtered(self, step: int, filtered_groups: int, kept_groups: int,
                 batch_size: int) -> str | None:
        """With coordinator.dynamic_sampling, groups without signal are dropped before any
        batch sees them: once the first `first_steps` batches' worth were dropped and not
        one group was kept (a group kept had signal: the filter is working, not starving),
        the one message to show (else None)."""
        if self.done or step >= self.first_steps or kept_groups or \
                filtered_groups < self.first_steps * batch_size:
            return None
        self.done = True
        return (f"coordinator.dynamic_sampling dropped {filtered_groups} groups whose "
                f"{self.group_size} responses all scored alike before batch {step + 1} formed: "
                f"nothing the rollouts produce carries a learning signal ({self.instruction_fields} "
                f"and task.reward = {self.reward!r} may disagree, or the task is solved or too "
                f"hard for the model); a run without dynamic sampling logs the rewards and format "
                f"rate that say which")

    def _message(self, step: int) -> str:
        seen = self._seen
        groups = sum(f["groups"] for f in seen)
        rewards = [r for f in seen for r in f["rewards"]]
        cut = sum(f["cut_rate"] for f in seen) / len(seen)
        formats = [f["format_rate"] for f in seen if "format_rate" in f]
        head = (f"steps 1-{step}: every one of {groups} groups scored all its "
                f"{self.group_size} responses alike (reward {min(rewards):g}"
                f"{'' if min(rewards) == max(rewards) else f' to {max(rewards):g}'}), so no "
                f"batch carries a learning signal")
        if formats and max(formats) == 0:
            why = (f"no response put its answer where task.reward = {self.reward!r} reads it "
                   f"(format rate 0): {self.instruction_fields} and the grader disagree")
        elif min(rewards) >= 1.0:
            why = "every response already earns full reward: the model solves this task"
        elif max(rewards) <= 0.0:
            why = ("every response scores 0: the task is too hard for the model as sampled "
                   "(more responses per group, rollout.group_size, or a higher temperature "
                   "may find a rewarded one)")
        else:
            why = "raise rollout.group_size or rollout.temperature for responses that differ"
        if cut >= 0.5:
            why += (f"; {cut:.0%} of responses were cut at rollout.max_new_tokens before "
                    f"they finished")
        return f"{head}: {why}"


def signal_figures(group_rewards: Sequence[Sequence[float]]) -> dict[str, Any]:
    """The batch figures LearningSignalWatch reads besides the format and cut rates."""
    return {"groups": len(group_rewards), "no_signal_groups": no_signal_groups(group_rewards),
            "rewards": [float(r) for rewards in group_rewards for r in rewards]}
