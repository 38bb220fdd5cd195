"""What crosses between the coordinator core and a driver: events in, commands out.

Plain frozen records of ids and numbers. Tokens, log-probs and rewards' text never travel
here: they live in the TrajectoryServer, which instances write to and the trainer reads from.

Events (what happened; a driver feeds them to `Core.step(now, events)`):
  InstanceState  an instance's snapshot: version, slots in use, queue, KV cache, decode steps
                 (`asyncrl.records`: the record the instance itself reports, passed on as is)
  Finished       an instance finished generating these trajectories (already in the server)
  Scored         a reward for one trajectory (or the reason it could not be scored)
  Extracted      an instance handed these trajectories back, partial (migration, recycling)
  Failed         an instance died; what it held must be re-routed (`rejoining`: its driver
                 is starting a fresh one in its place)
  Rejoined       the fresh instance in a failed one's place runs, empty, on weights `version`
  RejoinFailed   no fresh instance will come: the failed one stays dead for the run
  Synced         an instance now generates with weights `version`
  Published      the trainer published weights `version`

Commands (what to do; the driver applies them in order):
  Dispatch    start a new group, or resume one partial trajectory, on an instance
  Sync        the instance pulls the newest weights
  Extract     the instance hands these trajectories back
  Drop        the instance forgets these trajectories (their entry was aborted)
  Score       send this generated trajectory to the reward function
  BatchReady  the trainer's batch `version` can be taken (`Core.take_batch`)
"""

from __future__ import annotations

import dataclasses

from asyncrl.records import InstanceState

# ---------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    instance: int
    trajectory_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Scored:
    trajectory_id: int
    reward: float | None  # None: the reward could not be computed
    # Why it failed; with a reward (0.0), why the reward raised on this response alone.
    error: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Extracted:
    instance: int
    trajectory_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Failed:
    instance: int
    error: str
    rejoining: bool = False  # a restart is under way: the run need not end if all are down


@dataclasses.dataclass(frozen=True, slots=True)
class Rejoined:
    instance: int
    version: int  # the weights the fresh instance pulled when it started


@dataclasses.dataclass(frozen=True, slots=True)
class RejoinFailed:
    instance: int
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class Synced:
    instance: int
    version: int


@dataclasses.dataclass(frozen=True, slots=True)
class Published:
    version: int


Event = (InstanceState | Finished | Scored | Extracted | Failed | Rejoined | RejoinFailed | Synced
         | Published)


# ---------------------------------------------------------------------------- commands


@dataclasses.dataclass(frozen=True, slots=True)
class Dispatch:
    instance: int
    entry: int
    trajectory_ids: tuple[int, ...]  # a new group's members, or the one trajectory resumed
    resume: bool  # True: continue from the tokens the server holds (re-prefill them)


@dataclasses.dataclass(frozen=True, slots=True)
class Sync:
    instance: int


@dataclasses.dataclass(frozen=True, slots=True)
class Extract:
    instance: int
    trajectory_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Drop:
    instance: int
    trajectory_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Score:
    trajectory_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class BatchReady:
    version: int


Command = Dispatch | Sync | Extract | Drop | Score | BatchReady


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt the core may dispatch: its id in the task, and its tokens."""

    prompt_id: int
    tokens: tuple[int, ...]
