"""What crosses between a rollout instance and its driver: plain records, no JAX.

The trajectory's payload and the instance's state are the records every layer shares
(`asyncrl.records`): the instance reports them as they are, no driver rebuilds them.
"""

from __future__ import annotations

import dataclasses

from asyncrl.records import Trajectory


class InstanceFailed(RuntimeError):
    """`submit` to an instance whose thread has died: the work was not taken."""


@dataclasses.dataclass
class Work:
    """A group to start (one prefill fanned out into its members) or one trajectory to resume."""

    trajectories: list[Trajectory]  # new members have no tokens; a resume holds one partial

    @property
    def resume(self) -> bool:
        return len(self.trajectories) == 1 and bool(self.trajectories[0].tokens)
