"""The simulator's TrajectoryServer: the live class, made cheaper where a simulation pays.

A simulated run is one thread and moves ~60,000 trajectories through six states per
training step, so the server is its largest cost. Three things change, none of the effects:
  * the lifecycle keeps each trajectory's current state only (the live `LifecycleTracker`
    records every transition with its time and takes a lock for each: the history a threaded
    run is debugged with). Every transition is still checked against LEGAL_TRANSITIONS, and
    an illegal one fails as it would live;
  * a report with no tokens (simulated trajectories carry none) only changes the state;
  * a transition allocates nothing to keep the per-instance index of held work.
tests/coordinator/test_drivers_agree.py runs the live server beside this one: the core's
decisions must not differ.
"""

from __future__ import annotations

from typing import Hashable

from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import TrajectoryState

# Module constants: reading an Enum member off its class costs ~10x a global lookup.
_ROUTED, _RUNNING = TrajectoryState.ROUTED, TrajectoryState.RUNNING
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

    def report(self, trajectory_id, tokens, logprobs, policy_logprobs, versions, finish_reason):
        record = self._records.get(trajectory_id)
        if tokens or logprobs or policy_logprobs or versions or record is None or record.tokens:
            return super().report(trajectory_id, tokens, logprobs, policy_logprobs, versions,
                                  finish_reason)
        with self._lock:  # nothing to append: the live report's state change alone
            if self._lifecycle.state(trajectory_id) is not _RUNNING:
                return False
            if finish_reason is None:
                self.interrupt(trajectory_id)
            else:
                self.finish(trajectory_id, finish_reason)
            return True

    def _move(self, trajectory_id, state):
        self._lifecycle.transition(trajectory_id, state)
        instance = self._records[trajectory_id].instance
        held = self._held.get(instance)
        if state is _ROUTED or state is _RUNNING:
            if held is None:
                held = self._held[instance] = set()
            held.add(trajectory_id)
        elif held is not None:
            held.discard(trajectory_id)
