"""Barrier baselines: synchronous RL and one-step off-policy.

synchronous (η = 0)
    Every step: generate B groups with weights v, wait for the slowest response and its
    reward, train, broadcast v+1 to every instance, repeat. Rollout idles while the trainer
    works and the trainer idles while the slowest response decodes. This is the on-policy
    mode of verl/OpenRLHF (their `trigger_parameter_sync_step=1, staleness_threshold=0`
    pipeline, run on separate rollout and trainer GPUs here, like every schedule).
    Staleness: always 0.

one_step (verl `recipe/one_step_off_policy`)
    Batch k+1 is generated with weights v_k while batch k trains; once both are done the new
    weights are broadcast and the next pair starts. Generation and training overlap, but each
    batch still waits for its slowest response (no partial rollout). Staleness: 1 (0 for the
    first batch). It takes no η.
"""

from __future__ import annotations

from asyncrl.sim.schedules.base import SCHEDULES, Batch, Schedule


@SCHEDULES.register("sync")
class Synchronous(Schedule):
    def start(self):
        self.step = 0
        self.batch: list = []
        self.quota = 0
        self._generate()

    def _generate(self):
        self.batch = []
        self.quota = self.engine.batch_size
        self.pump()

    def admit(self):
        if self.quota == 0:
            return False
        self.quota -= 1
        self.pending.append(self.engine.new_group(prio=self.step))
        return True

    def on_group_scored(self, group):
        self.batch.append(group)
        if len(self.batch) == self.engine.batch_size:
            self.engine.train(self.batch, self.step, then=self._trained)

    def _trained(self):
        self.step += 1
        # Nothing is in flight at the barrier, so nothing needs re-prefill.
        self.engine.broadcast(self.step, then=self._generate, reprefill=False)


@SCHEDULES.register("one_step")
class OneStepOffPolicy(Schedule):
    def start(self):
        self.batches: dict[int, Batch] = {}
        self.owner: dict[int, Batch] = {}  # group id → the batch it was launched for
        self.launching: Batch | None = None
        self.busy = False  # training or broadcasting
        self.drive()

    def _launch(self, k: int) -> Batch:
        batch = Batch(self.engine.batch_size)
        self.batches[k] = batch
        self.launching = batch
        self.pump()
        return batch

    def admit(self):
        batch = self.launching
        if batch is None or len(batch.groups) >= batch.target:
            return False
        group = self.engine.new_group(prio=self.engine.latest_version)
        batch.groups.append(group)
        self.owner[group.id] = batch
        self.pending.append(group)
        return True

    def on_group_scored(self, group):
        self.owner.pop(group.id).scored.append(group)
        self.drive()

    def _done(self):
        self.busy = False
        self.drive()

    def process(self):
        engine = self.engine
        self._launch(0)
        k = 0
        while True:
            yield lambda: self.batches[k].complete
            self._launch(k + 1)  # generated with the weights instances hold now (v_k)
            self.busy = True
            engine.train(self.batches.pop(k).scored, k, then=self._done)
            yield lambda: not self.busy
            yield lambda: self.batches[k + 1].complete
            self.busy = True
            engine.broadcast(k + 1, then=self._done, reprefill=False)
            yield lambda: not self.busy
            k += 1
