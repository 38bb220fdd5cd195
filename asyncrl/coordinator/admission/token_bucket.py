"""AReaL's admission (and ROLL's, with `drop_stale`)."""

from __future__ import annotations

import heapq

from asyncrl.coordinator.admission.base import ADMISSIONS, CollectiveAdmission, CollectiveUpdate


@ADMISSIONS.register("token_bucket")
class TokenBucket(CollectiveAdmission):
    bounded = False

    def __init__(self, *, eta: int, batch_size: int, drop_stale: bool = False):
        self.eta, self.batch_size, self.drop_stale = eta, batch_size, drop_stale
        self.bounded = drop_stale
        self.accepted = 0  # entries scored into the buffer, ever (AReaL's count)
        self.in_flight: set[int] = set()
        self.buffer: list[int] = []  # scored entries, a heap by id (= submission order)
        self.policy_version = 0  # the weights every instance holds
        self.update = CollectiveUpdate()
        self._dropped: list[int] = []
        self._collected = -1  # the batch stale entries were last collected for

    def admits_new(self):
        bound = (self.eta + self.policy_version + 1) * self.batch_size
        return self.accepted + len(self.in_flight) < bound

    def on_dispatched(self, entry, v_traj):
        self.in_flight.add(entry)
        if v_traj < self._collected - self.eta:
            self._collected = -1  # stale on arrival: the next batch collects it

    def on_scored(self, entry):
        self.in_flight.discard(entry)
        self.accepted += 1
        heapq.heappush(self.buffer, entry)
        return ()

    def on_aborted(self, entry):
        self.in_flight.discard(entry)

    def take_aborted(self):
        dropped, self._dropped = self._dropped, []
        return dropped

    def _collect_stale(self, version: int) -> None:
        """ROLL's garbage collection: nothing older than the window trains or keeps running."""
        window = version - self.eta
        v_traj = self.view.v_traj
        stale = [e for e in self.buffer if v_traj(e) < window]
        if stale:
            self.buffer = [e for e in self.buffer if v_traj(e) >= window]
            heapq.heapify(self.buffer)
            self.accepted -= len(stale)
        running = sorted(e for e in self.in_flight if v_traj(e) < window)
        self.in_flight.difference_update(running)
        self._dropped += stale + running

    def _check_update(self) -> None:
        if (loaded := self.update.finish(self.view)) is not None:
            self.policy_version = loaded

    def ready(self, version):
        self._check_update()
        # AReaL trains step v once every instance holds weights v.
        if self.update.target is not None or self.policy_version < version:
            return False
        if self.drop_stale and self._collected < version:
            # Once per batch, unless an entry below the window was dispatched since (every
            # instance holds weights ≥ version by now, so none should be).
            self._collected = version
            self._collect_stale(version)
        return len(self.buffer) >= self.batch_size

    def consume(self, version):
        return [heapq.heappop(self.buffer) for _ in range(self.batch_size)]

    def describe(self, version):
        return (f"{len(self.buffer)} of {self.batch_size} entries scored, "
                f"{len(self.in_flight)} in flight")

    def on_published(self, version):
        self.update.begin(version)
        self._check_update()

    def on_synced(self, instance, version):
        self._check_update()

    def state_dict(self):
        # `dropped`: given up but not yet taken by the core; a checkpoint between the two
        # must not bring them back.
        return {"accepted": self.accepted, "in_flight": sorted(self.in_flight),
                "buffer": sorted(self.buffer), "policy_version": self.policy_version,
                "dropped": list(self._dropped)}

    def load_state_dict(self, state):
        self.accepted = state["accepted"]
        self.in_flight = set(state["in_flight"])
        self.buffer = list(state["buffer"])
        self.policy_version = state["policy_version"]
        self._dropped = list(state.get("dropped", []))
