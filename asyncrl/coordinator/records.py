"""What the coordinator core hands out and reads: its batches, counters and prompt source."""

from __future__ import annotations

import dataclasses
from typing import Protocol

from asyncrl.coordinator.messages import Prompt
from asyncrl.servers.trajectory import TrajectoryRecord


class PromptSource(Protocol):
    def __next__(self) -> Prompt: ...  # the next fresh prompt; StopIteration when exhausted
    def get(self, prompt_id: int) -> Prompt: ...  # a prompt again, by id (retries, resumes)


@dataclasses.dataclass
class Counters:
    dispatched: int = 0
    migrated: int = 0
    aborted_entries: int = 0
    reward_failures: int = 0
    reward_errors: int = 0  # responses the reward raised on alone: scored 0 and trained on
    filtered_groups: int = 0
    kept_groups: int = 0  # scored groups that took a buffer slot (with signal, when filtering)
    rerouted_after_failure: int = 0
    failed_instances: int = 0
    rejoined_instances: int = 0  # fresh instances that took a failed one's place


@dataclasses.dataclass
class Batch:
    """A consumed training batch: its entries, each one's V_traj and its group's records."""

    version: int
    entries: list[int]
    v_traj: list[int]
    groups: list[list[TrajectoryRecord]]

    @property
    def staleness(self) -> list[int]:
        return [self.version - v for v in self.v_traj]


class AllInstancesFailed(RuntimeError):
    """No rollout instance is left to run anything."""
