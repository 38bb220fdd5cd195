"""What a simulated run measures, and the one record it reports.

Throughput is response tokens trained per second of virtual time over the measured steps
(after `warmup_steps`, so pipelines are full), the quantity the paper compares. Staleness is
recorded for every consumed entry of every step: consumed version − V_traj, V_traj being the
version of the instance the core dispatched the entry to (the TrajectoryServer's record).
"""

from __future__ import annotations

import collections
import dataclasses
import time


class Metrics:
    def __init__(self):
        self.step_end: list[float] = []  # virtual time each training step finished
        self.step_tokens: list[int] = []  # response tokens trained in each step
        self.step_groups: list[int] = []
        self.staleness: collections.Counter[int] = collections.Counter()
        self.generated_tokens = 0  # every response token decoded (finished or not)
        self.wasted_tokens = 0  # decoded but never trained (aborted, dropped, collected)
        self.reprefill_tokens = 0.0  # KV recomputed after interruptions and migrations
        self.pulls = 0
        self.migrated = 0
        self.dropped_groups = 0

    @property
    def steps_done(self) -> int:
        return len(self.step_end)


class CoordTimer:
    """Wall time spent inside the coordinator core (its steps and the trainer's batch takes)."""

    def __init__(self):
        self.total = 0.0
        self.calls = 0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.total += time.perf_counter() - self._t0
        self.calls += 1


@dataclasses.dataclass
class Result:
    """One simulated run. Every field but `wall_s` and `coordinator_s` is deterministic."""

    system: str  # the label of the system simulated (the admission's name by default)
    instances: int
    eta: int
    seed: int
    batch_groups: int
    group_size: int
    throughput_tok_s: float
    samples_per_s: float
    step_time_s: float  # mean modelled time per training step over the measured steps
    max_staleness: int
    mean_staleness: float
    staleness_hist: dict[int, int]
    wasted_frac: float  # wasted / generated response tokens
    reprefill_per_step: float  # tokens re-prefilled per step (interruptions, migrations)
    pulls: int
    migrated: int
    dropped_groups: int
    events: int
    wall_s: float = 0.0
    coordinator_s: float = 0.0

    @classmethod
    def from_metrics(cls, m: Metrics, *, warmup: int, **fields) -> "Result":
        total = m.steps_done
        t0 = m.step_end[warmup - 1] if warmup > 0 else 0.0
        span = m.step_end[-1] - t0
        measured = total - warmup
        tokens = sum(m.step_tokens[warmup:])
        groups = sum(m.step_groups[warmup:])
        consumed = sum(m.staleness.values())
        return cls(
            throughput_tok_s=tokens / span,
            samples_per_s=groups * fields["group_size"] / span,
            step_time_s=span / measured,
            max_staleness=max(m.staleness) if m.staleness else 0,
            mean_staleness=sum(k * v for k, v in m.staleness.items()) / max(consumed, 1),
            staleness_hist=dict(sorted(m.staleness.items())),
            wasted_frac=m.wasted_tokens / max(m.generated_tokens, 1),
            reprefill_per_step=m.reprefill_tokens / total,
            pulls=m.pulls,
            migrated=m.migrated,
            dropped_groups=m.dropped_groups,
            **fields,
        )
