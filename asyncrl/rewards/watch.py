"""Possible reward hacking, seen from the training batches.

A reward that pays for something other than a stated answer (a lenient grader, a user's own
reward, a bug) shows in two ways before evaluation sees it: rewarded responses that do not
put an answer where the prompt asked, and a reward that rises while the share of responses
that do falls. A strict reward can do neither (it scores a response without the format 0), so
either is worth a warning on the console and a flag in the metrics.
"""

from __future__ import annotations

import dataclasses
from collections import deque

# Batches whose figures are averaged: one batch of 8 prompts swings by ±0.2.
WINDOW = 3
# A rise of the reward and a fall of the format rate of this much (a share of responses).
THRESHOLD = 0.1
# A strict reward never pays in full without the format, so any steady share says the reward
# is lenient; this much (one response in 20) is past what a shaping bug could explain.
UNSTATED_SHARE = 0.05


@dataclasses.dataclass(frozen=True)
class BatchAnswers:
    """One training batch: the mean reward, the share of responses that state an answer in
    the asked-for format, and the share given full reward (≥ 1) without one."""

    reward_mean: float
    format_rate: float
    rewarded_unformatted: float


class RewardHackingWatch:
    """Feed it every batch in step order; `update` says whether the run looks like it is
    gaming its reward now, `why` says how, and `turned_on` whether this batch started it (the
    one to warn about)."""

    def __init__(self, window: int = WINDOW, threshold: float = THRESHOLD,
                 unstated_share: float = UNSTATED_SHARE):
        if window < 1 or not 0 < threshold < 1 or not 0 < unstated_share < 1:
            raise ValueError(f"RewardHackingWatch: window ≥ 1 and threshold in (0, 1), got "
                             f"{window}, {threshold}, {unstated_share}")
        self.window, self.threshold, self.unstated_share = window, threshold, unstated_share
        self._first: list[BatchAnswers] = []
        self._recent: deque[BatchAnswers] = deque(maxlen=window)
        self.why = ""
        self.turned_on = False

    def update(self, batch: BatchAnswers) -> bool:
        if len(self._first) < self.window:
            self._first.append(batch)
        self._recent.append(batch)
        was = bool(self.why)
        self.why = self._diagnose()
        self.turned_on = bool(self.why) and not was
        return bool(self.why)

    def _diagnose(self) -> str:
        def mean(batches, field):
            return sum(getattr(b, field) for b in batches) / len(batches)

        unformatted = mean(self._recent, "rewarded_unformatted")
        if unformatted >= self.unstated_share:
            return (f"{unformatted:.0%} of the last {len(self._recent)} batches' responses were "
                    f"rewarded without an answer in the asked-for format")
        if len(self._first) < self.window or len(self._recent) < self.window:
            return ""
        reward_rise = mean(self._recent, "reward_mean") - mean(self._first, "reward_mean")
        format_fall = mean(self._first, "format_rate") - mean(self._recent, "format_rate")
        if reward_rise >= self.threshold and format_fall >= self.threshold:
            return (f"the batch reward rose by {reward_rise:.2f} while the share of responses "
                    f"stating an answer in the asked-for format fell by {format_fall:.2f} "
                    f"(means of the first and last {self.window} batches)")
        return ""
