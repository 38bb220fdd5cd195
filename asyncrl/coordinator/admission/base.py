"""The admission interface every schedule implements, its registry, the decisions it hands
back to the core, and the collective weight update the baselines share. The schedules
themselves are this package's modules."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from asyncrl.coordinator.view import CoreView
from asyncrl.registry import Registry

ADMISSIONS = Registry("admission")


@dataclasses.dataclass(frozen=True, slots=True)
class Abort:
    """Give the entry up: its work stops wherever it runs, its place is freed."""

    entry: int


@dataclasses.dataclass(frozen=True, slots=True)
class Recycle:
    """Hand the entry's unfinished trajectories back, tokens kept: they finish in a later batch."""

    entry: int


Decision = Abort | Recycle


class Admission:
    bounded = True  # consumed entries satisfy V_traj ≤ version ≤ V_traj + η (the core checks)
    view: CoreView

    def attach(self, view: CoreView) -> None:
        self.view = view

    # ---------------------------------------------------------------- dispatch

    def may_dispatch(self) -> bool:
        """Whether any work (new or resumed) may be routed now."""
        return True

    def admits_new(self) -> bool:
        """Whether one more new entry may be admitted now (counts, not instances)."""
        return True

    def version_admits_new(self, version: int) -> bool:
        """Whether a new entry may land on an instance of this version (V_traj = version)."""
        return True

    def on_dispatched(self, entry: int, v_traj: int) -> None: ...

    def rebind(self, entry: int, v_traj: int) -> bool:
        """Late binding: whether the entry may take the newer V_traj (no admission but
        StaleFlow's tracks V_traj, so the default is no)."""
        return False

    def on_scored(self, entry: int) -> Sequence[Decision]:
        """A group is complete and passed the filters: it waits for a training step. Returns
        what must happen to other entries now (the barrier stops a full batch's surplus)."""
        return ()

    def on_aborted(self, entry: int) -> None:
        """The core gave the entry up (failed reward, no-signal group, dropped as stale)."""

    def take_aborted(self) -> list[int]:
        """Entries this admission gave up on its own since the last call (in any hook; the
        core carries each out as an `Abort` before the next event)."""
        return []

    # ---------------------------------------------------------------- training

    def ready(self, version: int) -> bool:
        raise NotImplementedError

    def consume(self, version: int) -> list[int]:
        raise NotImplementedError

    def describe(self, version: int) -> str:
        """What batch `version` waits for, for a timeout's message."""
        return ""

    # ---------------------------------------------------------------- weights

    def on_published(self, version: int) -> None: ...

    def on_synced(self, instance: int, version: int) -> None: ...

    def syncs(self, dirty: list[int]) -> list[int]:
        """Instances that should pull the newest weights now (`dirty`: those whose state
        changed since the last call)."""
        return []

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None: ...


class CollectiveUpdate:
    """Loads weights on every live instance at once and tells when all of them hold them."""

    def __init__(self):
        self.target: int | None = None  # version being loaded; None when no update runs

    def begin(self, version: int) -> None:
        self.target = version

    def syncs(self, view: CoreView) -> list[int]:
        """Live instances still below the target and not pulling: asked (again) to pull. An
        instance whose pull began before the target was published ends below it."""
        if self.target is None:
            return []
        cluster = view.cluster
        # Vectorised: asked at every step of an update, and every instance syncs during one.
        below = (cluster.version < self.target) & ~cluster.syncing
        if view.dead:
            below[list(view.dead)] = False
        return np.flatnonzero(below).tolist()

    def finish(self, view: CoreView) -> int | None:
        """The version loaded, once every live instance holds it (the update is then over)."""
        target, cluster = self.target, view.cluster
        if target is None:
            return None
        held = (cluster.version >= target) & ~cluster.syncing
        if view.dead:
            held[list(view.dead)] = True
        if not held.all():
            return None
        self.target = None
        return target


class CollectiveAdmission(Admission):
    """An admission whose weight updates are collective: its `update` says who pulls."""

    update: CollectiveUpdate

    def syncs(self, dirty: list[int]) -> list[int]:
        return self.update.syncs(self.view)
