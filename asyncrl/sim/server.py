"""The simulator's TrajectoryServer: the live class, keeping only each trajectory's state.

The live `LifecycleTracker` records every transition with its time and takes a lock for each:
the history a threaded run is debugged with, at ~10 µs a transition. A simulated run is one
thread and moves ~50,000 trajectories through six states per training step, so its tracker
keeps the current state only. Every transition is still checked against the same
LEGAL_TRANSITIONS, and an illegal one fails as it would live.
"""

from __future__ import annotations

from typing import Hashable

from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import TrajectoryState
from asyncrl.staleness.lifecycle import LEGAL_TRANSITIONS, TERMINAL_STATES, IllegalTransition


# Legal moves by identity: hashing an Enum member runs Python code, and this is checked
# ~500,000 times a simulated run.
_LEGAL = {id(state): frozenset(id(n) for n in nexts) for state, nexts in LEGAL_TRANSITIONS.items()}
_TERMINAL = frozenset(id(s) for s in TERMINAL_STATES)


class _States(dict):
    def __missing__(self, trajectory_id):
        raise IllegalTransition(f"trajectory {trajectory_id!r}: unknown")


class CurrentStateLifecycle:
    """`LifecycleTracker`'s interface and rules, without history, timestamps or a lock."""

    def __init__(self):
        self._state: dict[Hashable, TrajectoryState] = _States()
        # The most frequent call of a simulated run, made a dict lookup (no Python frame).
        self.state = self._state.__getitem__

    def add(self, trajectory_id: Hashable) -> None:
        if trajectory_id in self._state:
            raise IllegalTransition(f"trajectory {trajectory_id!r}: added twice "
                                    f"(it is {self._state[trajectory_id].name})")
        self._state[trajectory_id] = TrajectoryState.PENDING

    def transition(self, trajectory_id: Hashable, new_state: TrajectoryState) -> None:
        current = self._state.get(trajectory_id)
        if current is None:
            raise IllegalTransition(
                f"trajectory {trajectory_id!r}: unknown, cannot move it to {new_state.name}")
        if id(new_state) not in _LEGAL[id(current)]:
            raise IllegalTransition(f"trajectory {trajectory_id!r}: illegal transition "
                                    f"{current.name} -> {new_state.name}")
        self._state[trajectory_id] = new_state

    def in_state(self, state: TrajectoryState) -> list[Hashable]:
        return [t for t, s in self._state.items() if s is state]

    def forget(self, trajectory_id: Hashable) -> list:
        state = self._state.get(trajectory_id)
        if id(state) not in _TERMINAL:
            name = "unknown" if state is None else state.name
            raise IllegalTransition(f"trajectory {trajectory_id!r}: cannot forget it while {name}")
        del self._state[trajectory_id]
        return []  # no history is kept

    def __len__(self) -> int:
        return len(self._state)


class SimTrajectoryServer(TrajectoryServer):
    def __init__(self):
        super().__init__()
        self._lifecycle = CurrentStateLifecycle()
