"""AReaL (arXiv 2505.24298; areal `WorkflowExecutor`): bounded admission, interruptible rollout.

As published:
  * admission: a new rollout is submitted only while
        accepted + running < (max_head_offpolicyness + version + 1) · consumer_batch_size,
    with `accepted` the rollouts accepted into the buffer so far, `running` those in flight,
    `version` the current policy version (η = max_head_offpolicyness, B = consumer batch);
    capacity (max_concurrent_rollouts) is the instances' slots here;
  * the trainer waits until B rollouts have finished, then takes the B submitted earliest
    among the finished ones (`wait_results` sorts them by create_time), trains, and updates
    the weights of every inference server;
  * interruptible rollout: a weight update interrupts the generations in flight; their KV
    cache is discarded, and they continue on the new weights after recomputing it.

The bound counts rollouts, not their versions: trained in submission order no rollout would
be more than η versions old, but the trainer does not wait for a slow one: a long response
finishes after many shorter ones submitted later and is trained when it arrives, so its
staleness can exceed η. The simulator reports it.
"""

from __future__ import annotations

import heapq

from asyncrl.sim.schedules.base import SCHEDULES, Schedule


@SCHEDULES.register("areal")
class AReaL(Schedule):
    def start(self):
        self.buffer: list = []  # scored groups, a heap by id (= submission order)
        self.accepted = 0
        self.in_flight = 0
        self.version = 0  # the policy version instances hold
        self.step = 0
        self.updating = False
        self.pump()

    def admit(self):
        bound = (self.eta + self.version + 1) * self.engine.batch_size
        if self.accepted + self.in_flight >= bound:
            return False
        self.in_flight += 1
        self.pending.append(self.engine.new_group(prio=self.version))
        return True

    def on_group_scored(self, group):
        self.in_flight -= 1
        self.accepted += 1
        heapq.heappush(self.buffer, (group.id, group))
        self._try_train()
        self.pump()

    def _try_train(self):
        engine = self.engine
        if engine.trainer_busy or self.updating or len(self.buffer) < engine.batch_size:
            return
        self.before_consume(self.step)
        if len(self.buffer) < engine.batch_size:
            return
        batch = [heapq.heappop(self.buffer)[1] for _ in range(engine.batch_size)]
        engine.train(batch, self.step, then=self._trained)

    def before_consume(self, step: int) -> None:
        """A hook for ROLL's garbage collection; AReaL keeps everything."""

    def _trained(self):
        self.step += 1
        self.updating = True
        self.engine.broadcast(self.step, then=self._updated, reprefill=True)

    def _updated(self):
        self.updating = False
        self.version = self.step
        self.pump()
        self._try_train()
