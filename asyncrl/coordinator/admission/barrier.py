"""slime's training loop as an admission: η = 0 synchronous RL, η = 1 one-step off-policy."""

from __future__ import annotations

import math

from asyncrl.coordinator.admission.base import (ADMISSIONS, Abort, CollectiveAdmission,
                                                CollectiveUpdate, Decision, Recycle)


@ADMISSIONS.register("barrier")
class Barrier(CollectiveAdmission):
    def __init__(self, *, eta: int, batch_size: int, over_sampling: float = 1.0,
                 recycle: bool = True):
        if not over_sampling >= 1.0:
            raise ValueError(f"barrier: over_sampling must be ≥ 1, got {over_sampling!r}")
        self.eta, self.batch_size = eta, batch_size
        self.quota = math.ceil(batch_size * over_sampling - 1e-9)
        self.recycle = recycle
        # Recycled partial rollouts finish in a later batch than they were launched for.
        self.bounded = self.quota == batch_size or not recycle
        self.launching: int | None = 0  # the batch new entries are admitted for
        self.next_batch = 1  # batches below it have been launched
        self.launched: dict[int, int] = {0: 0}  # batch -> entries admitted for it
        self.owner: dict[int, int] = {}  # entry in flight -> its batch
        self.scored: dict[int, list[int]] = {}  # batch -> scored entries, in order
        self.updated = 0  # the version every instance holds after the last update
        self.update = CollectiveUpdate()

    def _update_due(self, b: int) -> bool:
        """Whether every instance must hold version b before batch b trains (slime updates
        every η steps; η = 0 updates every step, before the next batch is generated)."""
        return b > 0 and (self.eta == 0 or b % self.eta == 0)

    def _complete(self, b: int) -> bool:
        return len(self.scored.get(b, ())) >= self.batch_size

    def may_dispatch(self):
        return self.update.target is None

    def admits_new(self):
        return (self.launching is not None and self.update.target is None
                and self.launched[self.launching] < self.quota)

    def on_dispatched(self, entry, v_traj):
        self.owner[entry] = self.launching
        self.launched[self.launching] += 1

    def on_scored(self, entry):
        b = self.owner.pop(entry)
        while self._complete(b):  # scored after its batch was complete: the next one takes it
            b += 1
            self.launched[b] = self.launched.get(b, 0) + 1
        self.scored.setdefault(b, []).append(entry)
        stopped = self._stop_surplus(b) if self._complete(b) else []
        self._advance()
        return stopped

    def on_aborted(self, entry):
        b = self.owner.pop(entry, None)
        if b is not None:
            self.launched[b] -= 1  # its place is admitted again

    def _stop_surplus(self, b: int) -> list[Decision]:
        """Batch b has its B entries: the over-sampled rest stop (recycled or aborted)."""
        if self.launching == b:
            self.launching = None
        stopped: list[Decision] = []
        for entry in sorted(e for e, owner in self.owner.items() if owner == b):
            if self.recycle:
                self.owner[entry] = b + 1
                self.launched[b + 1] = self.launched.get(b + 1, 0) + 1
                stopped.append(Recycle(entry))
            else:
                self.owner.pop(entry)
                stopped.append(Abort(entry))
        return stopped

    def _advance(self) -> None:
        """Starts whatever the loop allows now: an update, then the next batch's launch."""
        if (loaded := self.update.finish(self.view)) is not None:
            self.updated = loaded
        due = self.view.latest_version
        if (self.update.target is None and self.updated < due and self._update_due(due)
                and (self.eta == 0 or self._complete(due))):
            self.update.begin(due)
        b = self.next_batch
        while self.update.target is None and self.launching is None and self._may_launch(b):
            self.launching, self.next_batch = b, b + 1
            self.launched.setdefault(b, 0)
            if not self._complete(b):
                break
            # Recycled partial rollouts filled it before its launch: its surplus was never
            # stopped, so admitting for it would wait forever; the next batch launches.
            self.launching = None
            b = self.next_batch

    def _may_launch(self, b: int) -> bool:
        if self.eta == 0:  # synchronous: batch b is generated with weights b
            return self.view.version >= b and self.updated >= b
        prev = b - 1  # generated while batch b - 1 trains, once any update it needed is done
        return self._complete(prev) and (not self._update_due(prev) or self.updated >= prev)

    def ready(self, version):
        self._advance()
        return (self._complete(version) and self.view.version == version
                and (not self._update_due(version) or self.updated >= version))

    def consume(self, version):
        entries = self.scored.pop(version)
        self._advance()
        return entries

    def describe(self, version):
        waiting = sum(1 for b in self.owner.values() if b == version)
        return (f"batch {version}: {len(self.scored.get(version, ()))} of {self.batch_size} "
                f"entries scored, {waiting} in flight; weights updated to {self.updated}")

    def on_published(self, version):
        self._advance()

    def on_synced(self, instance, version):
        self._advance()

    def state_dict(self):
        # Pairs as lists: a checkpoint's JSON gives lists back, and must give back equal data.
        return {"launching": self.launching, "next_batch": self.next_batch,
                "launched": [[b, n] for b, n in sorted(self.launched.items())],
                "owner": [[e, b] for e, b in sorted(self.owner.items())],
                "scored": [[b, es] for b, es in sorted(self.scored.items())],
                "updated": self.updated}

    def load_state_dict(self, state):
        self.launching, self.next_batch = state["launching"], state["next_batch"]
        self.launched = {int(b): n for b, n in state["launched"]}
        self.owner = {int(e): b for e, b in state["owner"]}
        self.scored = {int(b): list(es) for b, es in state["scored"]}
        self.updated = state["updated"]
