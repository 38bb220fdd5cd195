"""Redundant rollout: launch more than is needed, abort the stragglers once enough finished.

Two knobs, from the paper:
  * batch: B' = ceil(B · batch_ratio) slots per virtual buffer. The staleness manager takes
    the first B entries to land; it aborts the other B' − B reservations itself
    (`StalenessManager(redundant_batch_size=B')`, reported by `take_aborted()`).
  * group: N' = N + extra_responses responses per prompt; the group is complete when N of
    them are scored, and the rest are aborted.

Off by default: dropping the slowest responses drops the longest, which biases long
chain-of-thought training toward short answers.

  none   B' = B, N' = N;
  batch  B' = ceil(B · batch_ratio);
  group  N' = N + extra_responses;
  both   both.
"""

from __future__ import annotations

import dataclasses
import math

from asyncrl.registry import Registry

REDUNDANCY_POLICIES = Registry("redundancy policy")


@dataclasses.dataclass(frozen=True)
class Redundancy:
    batch_ratio: float = 1.0
    extra_responses: int = 0

    def __post_init__(self):
        if not (isinstance(self.batch_ratio, (int, float)) and self.batch_ratio >= 1.0):
            raise ValueError(f"redundancy: batch_ratio must be ≥ 1, got {self.batch_ratio!r}")
        if not isinstance(self.extra_responses, int) or self.extra_responses < 0:
            raise ValueError(
                f"redundancy: extra_responses must be an int ≥ 0, got {self.extra_responses!r}")

    def redundant_batch_size(self, batch_size: int) -> int:
        """B' for the staleness manager; B' == B means no batch redundancy."""
        return max(batch_size, math.ceil(batch_size * self.batch_ratio - 1e-9))

    def responses_to_launch(self, group_size: int) -> int:
        return group_size + self.extra_responses

    @staticmethod
    def group_complete(scored: int, group_size: int) -> bool:
        """A group trains once N responses are scored; surplus ones still running are aborted."""
        return scored >= group_size

    @property
    def enabled(self) -> bool:
        return self.batch_ratio > 1.0 or self.extra_responses > 0


@REDUNDANCY_POLICIES.register("none")
def _none() -> Redundancy:
    return Redundancy()


@REDUNDANCY_POLICIES.register("batch")
def _batch(batch_ratio: float = 1.25) -> Redundancy:
    return Redundancy(batch_ratio=batch_ratio)


@REDUNDANCY_POLICIES.register("group")
def _group(extra_responses: int = 4) -> Redundancy:
    return Redundancy(extra_responses=extra_responses)


@REDUNDANCY_POLICIES.register("both")
def _both(batch_ratio: float = 1.25, extra_responses: int = 4) -> Redundancy:
    return Redundancy(batch_ratio=batch_ratio, extra_responses=extra_responses)


def build_redundancy(name: str, **kwargs) -> Redundancy:
    return REDUNDANCY_POLICIES.build(name, **kwargs)
