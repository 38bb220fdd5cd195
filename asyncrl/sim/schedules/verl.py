"""verl fully-async (`recipe/fully_async_policy`, README of Dec 2025): Rollouter + MessageQueue.

As published:
  * the Rollouter streams samples (here: groups) one by one onto free rollout capacity and
    puts each finished one into a MessageQueue;
  * the Trainer takes `require_batches × ppo_mini_batch_size` samples (here: B groups) from
    the queue, oldest first, and trains one local update; after
    `trigger_parameter_sync_step` local updates it triggers a parameter sync with the
    Rollouter (NCCL broadcast; trainer and every rollout engine take part);
  * freshness: between two syncs the Rollouter produces at most
        (1 + staleness_threshold) · trigger_parameter_sync_step · B − num_stale
    samples, num_stale being the samples still queued or in flight at the sync. Past that
    it pauses until the next sync. The threshold is a ratio of samples, not a version
    bound: a response that runs long is trained however old it is;
  * with `partial_rollout`, a sync interrupts the responses in flight, which keep their
    tokens and continue on the new weights (re-prefilled); without it, the sync waits for
    them to finish and dispatches nothing meanwhile;
  * the queue has a maximum size; when a sample arrives at a full queue, the oldest one is
    dropped.

Mapping to this grid: staleness_threshold = η (so the queue plus in-flight work is bounded by
(1 + η) · B, AReaL's bound), trigger_parameter_sync_step = 1, partial_rollout on (the
README's best mode), and a queue of (1 + staleness_threshold) · k · B groups. All are
config fields; 0 for staleness_threshold means "use η".
"""

from __future__ import annotations

import collections

from asyncrl.sim.schedules.base import SCHEDULES, Schedule


@SCHEDULES.register("verl")
class VerlFullyAsync(Schedule):
    def __init__(self, engine, eta, router="least_loaded", staleness_threshold=0.0,
                 trigger_parameter_sync_step=1, partial_rollout=True, max_queue_groups=0):
        super().__init__(engine, eta, router)
        self.threshold = float(staleness_threshold) if staleness_threshold else float(eta)
        if self.threshold < 0 or trigger_parameter_sync_step < 1:
            raise ValueError(
                "verl: need staleness_threshold ≥ 0 and trigger_parameter_sync_step ≥ 1")
        self.k = int(trigger_parameter_sync_step)
        self.partial_rollout = partial_rollout
        b = engine.batch_size
        self.budget = int((1 + self.threshold) * self.k * b)
        self.max_queue = max_queue_groups or self.budget

    def start(self):
        self.queue: collections.deque = collections.deque()  # scored groups, oldest first
        self.in_flight = 0  # admitted, not yet scored or dropped
        self.quota = self.budget
        self.produced = 0  # admitted since the last sync
        self.step = 0
        self.paused = False  # a sync is draining or running
        self.syncing = False
        self.pump()

    def admit(self):
        if self.paused or self.produced >= self.quota:
            return False
        self.produced += 1
        self.in_flight += 1
        self.pending.append(self.engine.new_group(prio=self.engine.latest_version))
        return True

    def on_group_scored(self, group):
        self.in_flight -= 1
        self.queue.append(group)
        while len(self.queue) > self.max_queue:
            self.engine.drop(self.queue.popleft())
        if self.paused and not self.partial_rollout and self.in_flight == 0:
            self._broadcast()
        self._try_train()

    def _try_train(self):
        engine = self.engine
        if engine.trainer_busy or self.paused or len(self.queue) < engine.batch_size:
            return
        batch = [self.queue.popleft() for _ in range(engine.batch_size)]
        engine.train(batch, self.step, then=self._trained)

    def _trained(self):
        self.step += 1
        if self.step % self.k:
            self._try_train()
            return
        self.paused = True
        if self.partial_rollout or self.in_flight == 0:
            self._broadcast()
        # else: on_group_scored broadcasts once the last response in flight finished

    def _broadcast(self):
        if self.syncing:
            return
        self.syncing = True
        # Work admitted but not yet on an instance is in flight too; it waits out the sync.
        self.engine.broadcast(self.step, then=self._synced, reprefill=True)

    def _synced(self):
        self.syncing = False
        self.paused = False
        self.quota = self.budget - (self.in_flight + len(self.queue))
        self.produced = 0
        self.pump()
        self._try_train()
