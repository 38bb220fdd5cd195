"""A virtual clock and an event heap: the simulator never sleeps and runs no threads.

Events at equal times run in the order they were scheduled (a counter breaks ties), so a run
is a deterministic function of its config and seed.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Callable


class SimulationStalled(RuntimeError):
    """The event heap emptied (or time ran out) before the run's goal was reached."""


class EventLoop:
    def __init__(self):
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., Any], tuple]] = []
        self._order = itertools.count()
        self.processed = 0

    def at(self, time: float, fn: Callable[..., Any], *args: Any) -> None:
        """Runs fn(*args) at virtual `time` (never before now)."""
        if time < self.now:
            # Rounding in closed-form step sums can land a hair before now; never go back.
            if time < self.now - 1e-6:
                raise ValueError(f"event scheduled in the past: {time} < now {self.now} ({fn})")
            time = self.now
        heapq.heappush(self._heap, (time, next(self._order), fn, args))

    def after(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
        self.at(self.now + delay, fn, *args)

    def run(self, done: Callable[[], bool], max_time: float = float("inf"),
            after_time_point: Callable[[], None] = lambda: None) -> None:
        """Processes events in time order until `done()` holds.

        `after_time_point()` runs once before the first event and after the last event of
        each time point (every event due at that time, those it scheduled at the same time
        included): a driver batches what happened at one instant there.

        Raises SimulationStalled if the heap empties or the clock passes `max_time` first:
        a schedule that deadlocks must fail loudly, not report a throughput.
        """
        heap = self._heap
        pop = heapq.heappop
        after_time_point()
        while not done():
            if not heap:
                raise SimulationStalled(f"no events left at t={self.now:.3f}s")
            time = heap[0][0]
            if time > max_time:
                raise SimulationStalled(f"virtual time passed the limit {max_time:.0f}s")
            self.now = time
            while heap and heap[0][0] == time:
                _, _, fn, args = pop(heap)
                fn(*args)
                self.processed += 1
            after_time_point()

    def __len__(self) -> int:
        return len(self._heap)
