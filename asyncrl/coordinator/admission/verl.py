"""verl's fully-async policy as an admission."""

from __future__ import annotations

import collections

from asyncrl.coordinator.admission.base import ADMISSIONS, CollectiveAdmission, CollectiveUpdate


@ADMISSIONS.register("verl")
class Verl(CollectiveAdmission):
    """verl's fully-async policy (`recipe/fully_async_policy`, README of Dec 2025).

    As published: a Rollouter streams samples (entries here) onto free rollout capacity and
    puts each finished one into a MessageQueue; the trainer takes B of them, oldest first,
    and after `trigger_parameter_sync_step` (k) local updates triggers a parameter sync with
    every rollout engine (a collective). Freshness is a ratio of samples, not a version bound:
    between two syncs the Rollouter produces at most
        (1 + staleness_threshold) · k · B − num_stale
    samples, num_stale being those still queued or in flight at the sync; past that it pauses
    until the next one. From a sync's trigger until every instance holds the new weights,
    neither admission nor training goes on. With partial rollout the sync interrupts the
    work in flight, which continues on the new weights; without it, the sync waits until
    nothing is in flight. The queue has a maximum size: a sample arriving at a full queue
    drops the oldest. A response that runs long is trained however old it is, so staleness
    is measured, never prevented.

    `staleness_threshold` None means η (the queue plus in-flight work is then bounded by
    (1 + η) · B, AReaL's bound: the same model as AReaL, so a comparison would count one
    system twice); `trigger_parameter_sync_step` None means η (at least 1), the setting the
    simulator's "verl" system uses with verl's recommended ratio (asyncrl/sim/config.py);
    `max_queue_size` 0 means (1 + threshold) · k · B.
    """

    bounded = False

    def __init__(self, *, eta: int, batch_size: int, staleness_threshold: float | None = None,
                 trigger_parameter_sync_step: int | None = 1, max_queue_size: int = 0):
        threshold = float(eta if staleness_threshold is None else staleness_threshold)
        if trigger_parameter_sync_step is None:
            trigger_parameter_sync_step = max(1, eta)
        if threshold < 0 or trigger_parameter_sync_step < 1 or max_queue_size < 0:
            raise ValueError(
                f"verl: need staleness_threshold ≥ 0, trigger_parameter_sync_step ≥ 1 and "
                f"max_queue_size ≥ 0, got {staleness_threshold!r}, "
                f"{trigger_parameter_sync_step!r}, {max_queue_size!r}")
        self.batch_size, self.k = batch_size, int(trigger_parameter_sync_step)
        self.budget = int((1 + threshold) * self.k * batch_size)
        self.max_queue = max_queue_size or self.budget
        if self.max_queue < batch_size:
            raise ValueError(f"verl: max_queue_size={max_queue_size} holds fewer than a batch "
                             f"({batch_size}): the trainer would wait forever")
        self.queue: collections.deque[int] = collections.deque()  # scored, oldest first
        self.in_flight: set[int] = set()
        self.quota = self.budget  # entries this sync window may admit
        self.produced = 0  # admitted since the last sync
        self.paused = False  # from a sync's trigger until every instance holds the weights
        self.waiting_sync: int | None = None  # no partial rollout: synced once nothing is in flight
        self.update = CollectiveUpdate()
        self._dropped: list[int] = []

    def admits_new(self):
        return not self.paused and self.produced < self.quota

    def on_dispatched(self, entry, v_traj):
        self.produced += 1
        self.in_flight.add(entry)

    def on_scored(self, entry):
        self.in_flight.discard(entry)
        self.queue.append(entry)
        while len(self.queue) > self.max_queue:
            self._dropped.append(self.queue.popleft())
        self._begin_waiting_sync()
        return ()  # a full queue's oldest leave through `take_aborted`

    def on_aborted(self, entry):
        self.in_flight.discard(entry)
        self._begin_waiting_sync()

    def take_aborted(self):
        dropped, self._dropped = self._dropped, []
        return dropped

    def _begin_waiting_sync(self) -> None:
        if self.waiting_sync is not None and not self.in_flight:
            self.update.begin(self.waiting_sync)
            self.waiting_sync = None

    def _check_update(self) -> None:
        if self.update.finish(self.view) is not None:
            self.paused = False
            self.quota = self.budget - (len(self.in_flight) + len(self.queue))
            self.produced = 0

    def ready(self, version):
        self._check_update()
        return not self.paused and len(self.queue) >= self.batch_size

    def consume(self, version):
        return [self.queue.popleft() for _ in range(self.batch_size)]

    def describe(self, version):
        return (f"{len(self.queue)} of {self.batch_size} entries queued, {len(self.in_flight)} "
                f"in flight, {self.produced} of {self.quota} admitted this sync window"
                + ("; paused for a weight sync" if self.paused else ""))

    def on_published(self, version):
        if version % self.k:
            return  # a local update: the instances keep their weights
        self.paused = True
        if self.view.partial_rollout or not self.in_flight:
            self.update.begin(version)
        else:
            self.waiting_sync = version
        self._check_update()

    def on_synced(self, instance, version):
        self._check_update()

    def state_dict(self):
        return {"queue": list(self.queue), "in_flight": sorted(self.in_flight),
                "quota": self.quota, "produced": self.produced, "dropped": list(self._dropped)}

    def load_state_dict(self, state):
        self.queue = collections.deque(state["queue"])
        self.in_flight = set(state["in_flight"])
        self.quota, self.produced = state["quota"], state["produced"]
        self._dropped = list(state["dropped"])
