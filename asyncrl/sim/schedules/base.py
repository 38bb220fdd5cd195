"""What every schedule shares: the hooks the engine calls, admission, and barrier drivers.

A schedule decides three things the engine does not:
  admission    when a new group (prompt) may be dispatched, and to which instances;
  consumption  which scored groups a training step takes, and when it may start;
  weight sync  when instances load new weights, and what happens to responses in flight.

Admitted groups wait in `pending` until an instance has a free slot; `pump` routes them
(with the schedule's router from `asyncrl.coordinator.routing`) and asks `admit` for more.
Barrier-style schedules (sync, one-step, slime) are written as a generator (`process`) that
yields the condition it waits for; `drive` resumes it whenever an event may have changed one.
"""

from __future__ import annotations

import collections
from typing import Callable, Iterator

from asyncrl.registry import Registry
from asyncrl.coordinator.routing import build_router

SCHEDULES = Registry("schedule")


class Schedule:
    def __init__(self, engine, eta: int, router: str = "least_loaded"):
        if not isinstance(eta, int) or eta < 0:
            raise ValueError(f"schedule: eta must be an int ≥ 0, got {eta!r}")
        self.engine = engine
        self.eta = eta
        self.router = build_router(router, engine.profile.latency)
        self.pending: collections.deque = collections.deque()
        self._pumping = False
        self._proc: Iterator[Callable[[], bool]] | None = None
        self._waiting: Callable[[], bool] | None = None

    # ---------------------------------------------------------------- hooks

    def responses_per_group(self, group_size: int) -> int:
        """Responses launched per prompt (more than N with redundant rollout)."""
        return group_size

    def start(self) -> None:
        raise NotImplementedError

    def on_group_scored(self, group) -> None:
        raise NotImplementedError

    def on_slots_freed(self, inst) -> None:
        self.pump()

    def on_instance_synced(self, inst) -> None:
        self.pump()

    # ---------------------------------------------------------------- dispatch

    def admit(self) -> bool:
        """Admits one new group into `pending` if the schedule's rule allows it now."""
        return False

    def pump(self) -> None:
        """Routes pending groups while instances have free slots, admitting more as allowed."""
        if self._pumping:
            return
        engine = self.engine
        self._pumping = True
        try:
            while engine.n_free > 0:
                if not self.pending:
                    if not self.admit():
                        break
                    continue
                group = self.pending[0]
                if group.state != 0:  # dropped while it waited (LIVE is 0)
                    self.pending.popleft()
                    continue
                if engine.route(group, self.router) is None:
                    break
                self.pending.popleft()
        finally:
            self._pumping = False

    # ---------------------------------------------------------------- barrier drivers

    def process(self) -> Iterator[Callable[[], bool]]:
        """A barrier schedule's loop; yields what it waits for. Unused by free-running ones."""
        raise NotImplementedError

    def drive(self) -> None:
        """Resumes `process` for as long as the condition it waits on holds."""
        if self._proc is None:
            self._proc = self.process()
            self._waiting = next(self._proc)
        while self._waiting():
            self._waiting = next(self._proc)


class Batch:
    """One generate() call of a barrier schedule: `target` groups wanted, stragglers beyond."""

    def __init__(self, target: int):
        self.target = target
        self.groups: list = []  # every group launched for it
        self.scored: list = []  # scored, in the order they were scored

    @property
    def complete(self) -> bool:
        return len(self.scored) >= self.target
