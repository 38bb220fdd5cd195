"""Where the trainer's wall time goes: one timer for the run's busy, idle and step figures.

The trainer is always in exactly one phase; `phase(name)` closes the current one and opens
the next, so the phases add up to the wall time:

    chrono.phase("wait")   # for a READY batch: the trainer's idle time
    chrono.phase("step")   # the train step and the weight push
    chrono.phase("checkpoint")
"""

from __future__ import annotations

import collections
import time


class Chrono:
    def __init__(self):
        self.start = time.perf_counter()
        self.seconds: collections.Counter[str] = collections.Counter()
        self.entered: collections.Counter[str] = collections.Counter()
        self._phase: str | None = None
        self._since = self.start

    def phase(self, name: str | None) -> None:
        """Ends the current phase and starts `name` (None: time is no longer attributed)."""
        now = time.perf_counter()
        if self._phase is not None:
            self.seconds[self._phase] += now - self._since
        self._phase, self._since = name, now
        if name is not None:
            self.entered[name] += 1

    def wall_s(self) -> float:
        return time.perf_counter() - self.start

    def figures(self) -> dict[str, float]:
        """The trainer's busy fraction and mean step time (push included)."""
        wall = max(self.wall_s(), 1e-9)
        return {
            "wall_s": wall,
            "trainer_busy_frac": 1.0 - self.seconds["wait"] / wall,
            "trainer_step_s_mean": self.seconds["step"] / max(self.entered["step"], 1),
        }
