"""slime (THUDM/slime `train_async.py`): a generate/train pipeline with a loop barrier.

The loop, as published:

    gen(0) starts
    for r in 0, 1, ...:
        wait for gen(r)                           # a batch of B groups
        start gen(r + 1)                          # with the weights instances hold now
        train on gen(r)
        if (r + 1) % update_weights_interval == 0:
            wait for gen(r + 1)                   # "sync generate before update weights"
            update weights (broadcast to every rollout engine)

One generate() call dispatches `over_sampling` × B groups and returns once B are scored;
the rest are aborted. With `partial_rollout` (slime's --partial-rollout) an aborted group is
not lost: its responses keep their tokens and go back to the data buffer, to be continued
first by the next generate() call (re-prefilled, on whatever weights are loaded by then).

Here update_weights_interval = η by default, so responses are at most η versions old unless
recycled partial rollouts make them older (that is reported, not prevented). Each batch
still waits for its B-th group, and generation stops at every weight update.
"""

from __future__ import annotations

import math

from asyncrl.sim.engine import GENERATED, LIVE, SCORED
from asyncrl.sim.schedules.base import SCHEDULES, Batch, Schedule


@SCHEDULES.register("slime")
class Slime(Schedule):
    def __init__(self, engine, eta, router="least_loaded", over_sampling=1.5,
                 partial_rollout=True, update_weights_interval=0):
        super().__init__(engine, eta, router)
        if over_sampling < 1.0:
            raise ValueError(f"slime: over_sampling must be ≥ 1, got {over_sampling}")
        self.over_sampling = over_sampling
        self.partial_rollout = partial_rollout
        # 0 means "use η" (η = 0 still syncs every step: the interval is at least 1).
        self.interval = update_weights_interval or max(eta, 1)

    def start(self):
        self.batches: dict[int, Batch] = {}
        self.owner: dict[int, Batch] = {}
        self.recycled: list = []  # aborted groups with partial responses, continued first
        self.launching: Batch | None = None
        self.to_launch = 0
        self.busy = False
        self.drive()

    def _launch(self, r: int) -> None:
        batch = Batch(self.engine.batch_size)
        self.batches[r] = batch
        self.launching = batch
        self.to_launch = math.ceil(batch.target * self.over_sampling)
        # Recycled partial groups go first (slime's buffer hands them out before new prompts).
        while self.recycled and self.to_launch:
            group = self.recycled.pop(0)
            self._adopt(batch, group)
            if group.state == LIVE:
                self.pending.append(group)
            elif group.state == SCORED:  # finished after the last batch returned
                self.owner.pop(group.id)
                batch.scored.append(group)
        if batch.complete:
            self._finish(batch)
        else:
            self.pump()

    def _adopt(self, batch: Batch, group) -> None:
        batch.groups.append(group)
        self.owner[group.id] = batch
        self.to_launch -= 1

    def admit(self):
        if self.launching is None or self.to_launch <= 0:
            return False
        group = self.engine.new_group(prio=self.engine.latest_version)
        self._adopt(self.launching, group)
        self.pending.append(group)
        return True

    def on_group_scored(self, group):
        batch = self.owner.pop(group.id)
        if batch.complete:  # scored after its batch returned: it belongs to the next one
            self.recycled.append(group)
        else:
            batch.scored.append(group)
            if batch.complete:
                self._finish(batch)
        self.drive()

    def _finish(self, batch: Batch) -> None:
        """generate() returns: abort the groups still running (or recycle them)."""
        if self.launching is batch:
            self.launching = None
        # Trains on exactly B: extra scored groups (recycled ones) wait for the next batch.
        self.recycled.extend(batch.scored[batch.target:])
        del batch.scored[batch.target:]
        engine = self.engine
        for group in batch.groups:
            if group.state == LIVE and self.partial_rollout:
                for traj in group.trajs:
                    engine.hold(traj)  # may finish a response on its last step
            if group.state == LIVE:
                self.owner.pop(group.id, None)
                if self.partial_rollout:
                    self.recycled.append(group)
                else:
                    engine.drop(group)
            elif group.state == GENERATED:  # responses done, reward pending: keep it
                self.owner[group.id] = batch
        self.pending = type(self.pending)(g for g in self.pending if g.state == LIVE
                                          and g.id in self.owner)

    def _done(self):
        self.busy = False
        self.drive()

    def process(self):
        engine = self.engine
        self._launch(0)
        r = 0
        while True:
            yield lambda: self.batches[r].complete
            self._launch(r + 1)
            self.busy = True
            engine.train(self.batches.pop(r).scored, r, then=self._done)
            yield lambda: not self.busy
            if (r + 1) % self.interval == 0:
                yield lambda: self.batches[r + 1].complete
                self.busy = True
                engine.broadcast(r + 1, then=self._done, reprefill=False)
                yield lambda: not self.busy
            r += 1
