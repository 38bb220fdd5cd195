"""ROLL (alibaba/ROLL, async training with `async_generation_ratio`; ROLL Flash, arXiv 2510.11345).

As published: rollout runs ahead of training by at most `async_generation_ratio` steps,
with the same kind of count-based admission as AReaL, and the replay buffer's garbage
collection (`ReplayBuffer.gc()`) deletes groups older than that window as the step
advances. Weights are updated on every engine after each step (suspend, load, resume).

Modelled as AReaL's admission and interruptible update (resumed responses keep their
tokens: the favourable reading), plus the collection: before training step v, every group
whose oldest token is from a version < v − η is dropped, finished or still running. Its
compute is wasted, and the dropped groups are regenerated (they leave the admission count),
so consumed staleness is ≤ η by construction and paid for with work thrown away.
"""

from __future__ import annotations

import heapq

from asyncrl.sim.engine import LIVE
from asyncrl.sim.schedules.areal import AReaL
from asyncrl.sim.schedules.base import SCHEDULES


@SCHEDULES.register("roll")
class Roll(AReaL):
    def before_consume(self, step):
        window = step - self.eta
        engine = self.engine
        stale = [g for _, g in self.buffer if g.v_traj < window]
        if stale:
            self.buffer = [(i, g) for i, g in self.buffer if g.v_traj >= window]
            heapq.heapify(self.buffer)
            for group in stale:
                engine.drop(group)
            self.accepted -= len(stale)
        # In flight: only groups with a started response have a version to judge.
        running = [g for g in engine.groups.values() if g.state == LIVE and g.min_start < window]
        for group in running:
            engine.drop(group)
        self.in_flight -= len(running)
        if stale or running:
            self.pump()
