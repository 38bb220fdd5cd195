"""Admission: when new work may start, which scored entries a training step takes, and when
instances load new weights. One registry for the live system and the simulator.

  staleflow     the per-trajectory bound (arXiv 2601.12784): an entry is dispatched only to
                an instance whose version still has a reservable slot in the StalenessManager;
                it occupies the lowest buffer it may once scored; the trainer takes buffer v as
                soon as it is READY. Each instance pulls weights on its own (the sync policy).
  barrier       generate a batch, train it, load the weights on every instance at once
                (slime's `train_async.py` loop): η = 0 is synchronous RL; η ≥ 1 generates the
                next batch while one trains and updates the weights every η steps (η = 1 is
                one-step off-policy). `over_sampling` > 1 launches more than B entries per
                batch and stops the rest once B are scored (slime); with partial rollout their
                tokens are kept and they finish in the next batch, possibly later than η.
  token_bucket  AReaL: admit while accepted + running < (η + policy version + 1)·B, train on the
                B earliest-submitted of the finished, then update every instance at once
                (in-flight work continues on the new weights). The bound counts entries, not
                versions: a long response is trained however late it finishes.
                `drop_stale` adds ROLL's replay-buffer collection: before step v, entries with
                V_traj < v − η are dropped (consumed staleness ≤ η, paid for in wasted work).
  verl          verl's fully-async policy: a per-sync-window sample budget, every instance
                updated together every `trigger_parameter_sync_step` steps (see `Verl`).

Only admissions with `bounded = True` promise V_traj ≤ version ≤ V_traj + η; the core checks
it on every consume of theirs. The others' staleness is measured, never prevented.
"""

from __future__ import annotations

import collections
import heapq
import math
from typing import TYPE_CHECKING

import numpy as np

from asyncrl.coordinator.sync import SyncContext, SyncPolicy
from asyncrl.registry import Registry
from asyncrl.staleness import BufferStatus, StalenessError, StalenessManager

if TYPE_CHECKING:
    from asyncrl.coordinator.core import Core

ADMISSIONS = Registry("admission")


class Admission:
    bounded = True  # consumed entries satisfy V_traj ≤ version ≤ V_traj + η (the core checks)
    core: Core

    def attach(self, core: Core) -> None:
        self.core = core

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

    def on_scored(self, entry: int) -> None:
        """A group is complete and passed the filters: it waits for a training step."""

    def on_aborted(self, entry: int) -> None:
        """The core gave the entry up (failed reward, no-signal group, dropped as stale)."""

    def take_aborted(self) -> list[int]:
        """Entries this admission gave up on its own since the last call."""
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


# ------------------------------------------------------------------------------ staleflow


@ADMISSIONS.register("staleflow")
class StaleFlow(Admission):
    def __init__(self, *, eta: int, batch_size: int, redundant_batch_size: int | None = None,
                 sync: SyncPolicy):
        self.sm = StalenessManager(eta, batch_size, redundant_batch_size)
        self.sync = sync
        # What the core asks at every step (can a version reserve, is a buffer ready, did the
        # abort rule fire), remembered until the manager changes: every change goes through
        # a hook below, which forgets it. At scale most steps change nothing here.
        self._memo: dict = {}
        self._may_have_aborted = False

    def _changing(self) -> None:
        self._memo.clear()
        self._may_have_aborted = True

    def admits_new(self):
        # No version an instance may hold can reserve: no entry is admitted anywhere, and the
        # core need not look at the instances.
        ok = self._memo.get("any")
        if ok is None:
            sm = self.sm
            ok = self._memo["any"] = any(self.version_admits_new(v) for v in
                                         range(sm.min_dispatch_version, sm.version + 1))
        return ok

    def version_admits_new(self, version):
        ok = self._memo.get(version)
        if ok is None:
            ok = self._memo[version] = self.sm.can_reserve(version)
        return ok

    def on_dispatched(self, entry, v_traj):
        self._changing()
        self.sm.reserve(entry, v_traj)

    def on_scored(self, entry):
        self._changing()
        self.sm.occupy(entry)

    def on_aborted(self, entry):
        self._changing()
        try:
            self.sm.abort(entry)
        except StalenessError:
            pass  # the abort rule took it first

    def take_aborted(self):
        if not self._may_have_aborted:
            return []
        self._may_have_aborted = False
        return self.sm.take_aborted()

    def ready(self, version):
        key = ("ready", version)
        ok = self._memo.get(key)
        if ok is None:
            ok = self._memo[key] = (self.sm.version == version
                                    and self.sm.status(version) is BufferStatus.READY)
        return ok

    def consume(self, version):
        if self.sm.version != version:
            raise StalenessError(f"consume of batch {version}: the protocol is at {self.sm.version}")
        self._changing()
        return self.sm.consume()  # checks the invariant of every entry

    def describe(self, version):
        reserved, occupied = self.sm.buffer_counts(version)
        return (f"buffer {version} is {self.sm.status(version).name}: {occupied} of "
                f"{self.sm.batch_size} slots occupied, {reserved} reserved by entries in flight")

    def syncs(self, dirty):
        core, latest = self.core, self.core.latest_version
        cluster, out = core.cluster, []
        for i in dirty:
            # No sync policy pulls weights it holds or is pulling: skip building the view.
            if cluster.version[i] >= latest or cluster.syncing[i]:
                continue
            view = cluster.view(i)
            if self.sync.should_sync(view, SyncContext(latest, self.version_admits_new(view.version))):
                out.append(i)
        return out

    def state_dict(self):
        return {"staleness": self.sm.state_dict()}

    def load_state_dict(self, state):
        sm = StalenessManager.from_state_dict(state["staleness"])
        if (sm.eta, sm.batch_size) != (self.sm.eta, self.sm.batch_size):
            raise ValueError(f"the checkpoint's staleness protocol has η={sm.eta}, B={sm.batch_size}; "
                             f"the config has η={self.sm.eta}, B={self.sm.batch_size}")
        self.sm = sm
        self._changing()


# ------------------------------------------------------------------------------ collective updates


class _CollectiveUpdate:
    """Loads weights on every live instance at once and tells when all of them hold them."""

    def __init__(self):
        self.target: int | None = None  # version being loaded; None when no update runs

    def begin(self, version: int) -> None:
        self.target = version

    def syncs(self, core: Core) -> list[int]:
        """Live instances still below the target and not pulling: asked (again) to pull. An
        instance whose pull began before the target was published ends below it."""
        if self.target is None:
            return []
        cluster = core.cluster
        # Vectorised: asked at every step of an update, and every instance syncs during one.
        below = (cluster.version < self.target) & ~cluster.syncing
        if core.dead:
            below[list(core.dead)] = False
        return np.flatnonzero(below).tolist()

    def finish(self, core: Core) -> int | None:
        """The version loaded, once every live instance holds it (the update is then over)."""
        target, cluster = self.target, core.cluster
        if target is None:
            return None
        held = (cluster.version >= target) & ~cluster.syncing
        if core.dead:
            held[list(core.dead)] = True
        if not held.all():
            return None
        self.target = None
        return target


# ------------------------------------------------------------------------------ barrier


@ADMISSIONS.register("barrier")
class Barrier(Admission):
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
        self.update = _CollectiveUpdate()

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
        if self._complete(b):
            self._stop_surplus(b)
        self._advance()

    def on_aborted(self, entry):
        b = self.owner.pop(entry, None)
        if b is not None:
            self.launched[b] -= 1  # its place is admitted again

    def _stop_surplus(self, b: int) -> None:
        """Batch b has its B entries: the over-sampled rest stop (recycled or aborted)."""
        if self.launching == b:
            self.launching = None
        for entry in sorted(e for e, owner in self.owner.items() if owner == b):
            if self.recycle:
                self.owner[entry] = b + 1
                self.launched[b + 1] = self.launched.get(b + 1, 0) + 1
                self.core.extract_entry(entry)
            else:
                self.owner.pop(entry)
                self.core.abort_entry(entry)

    def _advance(self) -> None:
        """Starts whatever the loop allows now: an update, then the next batch's launch."""
        core = self.core
        if (loaded := self.update.finish(core)) is not None:
            self.updated = loaded
        due = core.latest_version
        if (self.update.target is None and self.updated < due and self._update_due(due)
                and (self.eta == 0 or self._complete(due))):
            self.update.begin(due)
        b = self.next_batch
        if self.update.target is None and self.launching is None and self._may_launch(b):
            self.launching, self.next_batch = b, b + 1
            self.launched.setdefault(b, 0)

    def _may_launch(self, b: int) -> bool:
        if self.eta == 0:  # synchronous: batch b is generated with weights b
            return self.core.version >= b and self.updated >= b
        prev = b - 1  # generated while batch b - 1 trains, once any update it needed is done
        return self._complete(prev) and (not self._update_due(prev) or self.updated >= prev)

    def ready(self, version):
        self._advance()
        return (self._complete(version) and self.core.version == version
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

    def syncs(self, dirty):
        return self.update.syncs(self.core)

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


# ------------------------------------------------------------------------------ token bucket


@ADMISSIONS.register("token_bucket")
class TokenBucket(Admission):
    bounded = False

    def __init__(self, *, eta: int, batch_size: int, drop_stale: bool = False):
        self.eta, self.batch_size, self.drop_stale = eta, batch_size, drop_stale
        self.bounded = drop_stale
        self.accepted = 0  # entries scored into the buffer, ever (AReaL's count)
        self.in_flight: set[int] = set()
        self.buffer: list[int] = []  # scored entries, a heap by id (= submission order)
        self.policy_version = 0  # the weights every instance holds
        self.update = _CollectiveUpdate()
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

    def on_aborted(self, entry):
        self.in_flight.discard(entry)

    def take_aborted(self):
        dropped, self._dropped = self._dropped, []
        return dropped

    def _collect_stale(self, version: int) -> None:
        """ROLL's garbage collection: nothing older than the window trains or keeps running."""
        window = version - self.eta
        v_traj = self.core.server.v_traj
        stale = [e for e in self.buffer if v_traj(e) < window]
        if stale:
            self.buffer = [e for e in self.buffer if v_traj(e) >= window]
            heapq.heapify(self.buffer)
            self.accepted -= len(stale)
        running = sorted(e for e in self.in_flight if v_traj(e) < window)
        self.in_flight.difference_update(running)
        self._dropped += stale + running

    def _check_update(self) -> None:
        if (loaded := self.update.finish(self.core)) is not None:
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

    def syncs(self, dirty):
        return self.update.syncs(self.core)

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


# ------------------------------------------------------------------------------ verl


@ADMISSIONS.register("verl")
class Verl(Admission):
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
    (1 + η) · B, AReaL's bound); `max_queue_size` 0 means (1 + threshold) · k · B.
    """

    bounded = False

    def __init__(self, *, eta: int, batch_size: int, staleness_threshold: float | None = None,
                 trigger_parameter_sync_step: int = 1, max_queue_size: int = 0):
        threshold = float(eta if staleness_threshold is None else staleness_threshold)
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
        self.update = _CollectiveUpdate()
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
        if self.update.finish(self.core) is not None:
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
        if self.core.partial_rollout or not self.in_flight:
            self.update.begin(version)
        else:
            self.waiting_sync = version
        self._check_update()

    def on_synced(self, instance, version):
        self._check_update()

    def syncs(self, dirty):
        return self.update.syncs(self.core)

    def state_dict(self):
        return {"queue": list(self.queue), "in_flight": sorted(self.in_flight),
                "quota": self.quota, "produced": self.produced, "dropped": list(self._dropped)}

    def load_state_dict(self, state):
        self.queue = collections.deque(state["queue"])
        self.in_flight = set(state["in_flight"])
        self.quota, self.produced = state["quota"], state["produced"]
        self._dropped = list(state["dropped"])


def build_admission(name: str, *, eta: int, batch_size: int, redundant_batch_size: int,
                    sync: SyncPolicy, **params) -> Admission:
    """The admission `name` with its own parameters (`params`, e.g. over_sampling)."""
    factory = ADMISSIONS.get(name)
    if factory is StaleFlow:
        return StaleFlow(eta=eta, batch_size=batch_size,
                         redundant_batch_size=redundant_batch_size, sync=sync, **params)
    if redundant_batch_size != batch_size:
        raise ValueError(f"batch redundancy needs the staleflow admission, not {name!r}")
    return factory(eta=eta, batch_size=batch_size, **params)


