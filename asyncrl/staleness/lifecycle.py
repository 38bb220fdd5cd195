"""The lifecycle of one trajectory, with every transition recorded and illegal ones refused.

    PENDING → ROUTED → RUNNING ⇄ INTERRUPTED → … → GENERATED → REWARDED → OCCUPIED → CONSUMED
                                                                  any live state → ABORTED

ROUTED → ROUTED and INTERRUPTED → ROUTED are re-routes (an instance failed, or a migration
picked the trajectory up); INTERRUPTED → RUNNING is a partial rollout resumed where it was.
"""

from __future__ import annotations

import enum
import threading
import time
from typing import Hashable, NamedTuple

from asyncrl.staleness.errors import StalenessError


class TrajectoryState(enum.Enum):
    PENDING = "pending"
    ROUTED = "routed"
    RUNNING = "running"
    INTERRUPTED = "interrupted"
    GENERATED = "generated"
    REWARDED = "rewarded"
    OCCUPIED = "occupied"
    CONSUMED = "consumed"
    ABORTED = "aborted"


_S = TrajectoryState
LEGAL_TRANSITIONS: dict[TrajectoryState, frozenset[TrajectoryState]] = {
    _S.PENDING: frozenset({_S.ROUTED, _S.ABORTED}),
    # ROUTED -> INTERRUPTED: queued on an instance that failed, was drained or restarted.
    _S.ROUTED: frozenset({_S.RUNNING, _S.ROUTED, _S.INTERRUPTED, _S.ABORTED}),
    _S.RUNNING: frozenset({_S.INTERRUPTED, _S.GENERATED, _S.ABORTED}),
    _S.INTERRUPTED: frozenset({_S.ROUTED, _S.RUNNING, _S.ABORTED}),
    _S.GENERATED: frozenset({_S.REWARDED, _S.ABORTED}),
    # A group whose rewards carry no signal is dropped here by the dynamic-sampling filter.
    _S.REWARDED: frozenset({_S.OCCUPIED, _S.ABORTED}),
    _S.OCCUPIED: frozenset({_S.CONSUMED}),
    _S.CONSUMED: frozenset(),
    _S.ABORTED: frozenset(),
}
TERMINAL_STATES = frozenset(s for s, nexts in LEGAL_TRANSITIONS.items() if not nexts)


class IllegalTransition(StalenessError):
    """A trajectory was asked to move between two states the lifecycle does not connect."""


class Transition(NamedTuple):
    state: TrajectoryState
    time: float  # time.monotonic() seconds


class LifecycleTracker:
    """Current state and transition history of every trajectory. Thread-safe."""

    def __init__(self):
        self._history: dict[Hashable, list[Transition]] = {}
        self._lock = threading.Lock()

    def add(self, trajectory_id: Hashable) -> None:
        with self._lock:
            if trajectory_id in self._history:
                raise IllegalTransition(
                    f"trajectory {trajectory_id!r}: added twice "
                    f"(it is {self._history[trajectory_id][-1].state.name})"
                )
            self._history[trajectory_id] = [Transition(_S.PENDING, time.monotonic())]

    def transition(self, trajectory_id: Hashable, new_state: TrajectoryState) -> None:
        with self._lock:
            history = self._history.get(trajectory_id)
            if history is None:
                raise IllegalTransition(
                    f"trajectory {trajectory_id!r}: unknown, cannot move it to {new_state.name}"
                )
            current = history[-1].state
            if new_state not in LEGAL_TRANSITIONS[current]:
                raise IllegalTransition(
                    f"trajectory {trajectory_id!r}: illegal transition "
                    f"{current.name} -> {new_state.name}"
                )
            history.append(Transition(new_state, time.monotonic()))

    def state(self, trajectory_id: Hashable) -> TrajectoryState:
        with self._lock:
            history = self._history.get(trajectory_id)
            if history is None:
                raise IllegalTransition(f"trajectory {trajectory_id!r}: unknown")
            return history[-1].state

    def history(self, trajectory_id: Hashable) -> list[Transition]:
        with self._lock:
            return list(self._history[trajectory_id])

    def in_state(self, state: TrajectoryState) -> list[Hashable]:
        with self._lock:
            return [i for i, h in self._history.items() if h[-1].state is state]

    def forget(self, trajectory_id: Hashable) -> list[Transition]:
        """Drops a finished trajectory's record (to bound memory) and returns its history."""
        with self._lock:
            history = self._history.get(trajectory_id)
            if history is None or history[-1].state not in TERMINAL_STATES:
                state = "unknown" if history is None else history[-1].state.name
                raise IllegalTransition(
                    f"trajectory {trajectory_id!r}: cannot forget it while {state}"
                )
            return self._history.pop(trajectory_id)

    def __len__(self) -> int:
        with self._lock:
            return len(self._history)
