"""The coordinator core: events in, commands out; no threads, no clock, no JAX.

A driver feeds it what happened and applies what it returns:

    commands = core.step(now, events)   # e.g. [Dispatch(0, 7, (28, 29), False), Sync(1)]

The threaded driver (`asyncrl.drivers.threaded`) does this with real rollout instances, the
simulator (`asyncrl.sim`) with modelled ones, so a simulated schedule is the system's
schedule: one control flow, every decision taken here. Each step, in this order:

  1. events: instance snapshots, finished / extracted trajectories, rewards, failures and
     rejoins (`asyncrl.coordinator.membership`), completed syncs and published weights;
  2. aborts: entries the admission gave up (the abort rule, redundancy's surplus) are dropped
     on the instances that hold them;
  3. weight sync: the instances the admission says should pull (per instance for StaleFlow,
     all at once for the barrier and the token bucket);
  4. migration, every `migration_interval_s` of the `now` the driver passes: which
     trajectories move from an overloaded instance to a starving one is chosen here;
  5. dispatch: partial trajectories first (oldest V_traj first), then new entries, each
     admitted at the version of the instance the router picks;
  6. the next training batch, once the admission says it is ready.

The TrajectoryServer is the one record of every trajectory: its tokens, state, entry, V_traj
and the instance holding it. Commands carry ids; the driver reads the server for the rest.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import AbstractSet, Iterable, Iterator

import numpy as np

from asyncrl.coordinator.admission import Abort, Admission, Decision, Recycle
from asyncrl.coordinator.membership import Membership
from asyncrl.coordinator.messages import (BatchReady, Command, Dispatch, Drop, Event, Extract,
                                          Extracted, Failed, Finished, InstanceState, Prompt,
                                          Published, Rejoined, RejoinFailed, Score, Scored, Sync,
                                          Synced)
from asyncrl.coordinator.binding import late_bind
from asyncrl.coordinator.migration import MigrationPolicy, NoMigration, movable, pick_trajectories
from asyncrl.coordinator.redundancy import Redundancy
from asyncrl.coordinator.routing import (BINDINGS, DISPATCH_MODES, PendingQueue, Request, Router,
                                         eligible_new, eligible_resume, place_each_response)
from asyncrl.coordinator.records import AllInstancesFailed, Batch, Counters, PromptSource
from asyncrl.coordinator.view import ClusterView
from asyncrl.errors import UserError
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import StalenessError, TrajectoryState

_S = TrajectoryState
_UNSEEN_BY_ADMISSION = (InstanceState, Finished)


class AdmissionMismatch(UserError):
    """A checkpoint's coordinator state was written under another admission policy."""


class Core:
    def __init__(self, *, admission: Admission, server: TrajectoryServer, prompts: PromptSource,
                 num_instances: int, num_slots: int, eta: int, group_size: int,
                 max_new_tokens: int, router: Router, redundancy: Redundancy = Redundancy(),
                 migration: MigrationPolicy = NoMigration(), migration_interval_s: float = 0.0,
                 partial_rollout: bool = True, dynamic_sampling: bool = False,
                 dispatch: str = "group", binding: str = "dispatch"):
        self.admission, self.server, self.prompts = admission, server, prompts
        self.eta, self.group_size, self.max_new_tokens = eta, group_size, max_new_tokens
        self.router, self.redundancy, self.migration = router, redundancy, migration
        self.migration_interval_s = migration_interval_s
        self.partial_rollout, self.dynamic_sampling = partial_rollout, dynamic_sampling
        self.per_response = DISPATCH_MODES.get(dispatch)
        self.late_binding = BINDINGS.get(binding)
        self._bound_at = np.zeros(num_instances, np.int64)  # versions late binding has seen
        self.rebound = 0  # entries whose V_traj moved forward
        self.cluster = ClusterView.empty(num_instances, num_slots)
        self.decode_steps = np.zeros(num_instances, np.int64)
        self.members = Membership()
        self.dead = self.members.dead  # failed instances (the policies read it)
        self.now = 0.0  # the driver's clock at the current (or last) step
        self.latest_version = 0  # newest published weights (version 0: the initial policy)
        self.version = 0  # the next batch the trainer takes
        self.next_entry_id = 0
        self.counters = Counters()
        self.aborted_ids: list[int] = []  # every entry given up, for the run's accounting
        self._retry: collections.deque[int] = collections.deque()  # prompt ids to re-dispatch
        self._peeked: Prompt | None = None  # a fresh prompt drawn for routing, not yet used
        self._resume = PendingQueue()  # trajectory ids waiting for an instance, by V_traj
        self._moving: dict[int, int] = {}  # extracted for migration -> the instance to take it
        self._rewarded: dict[int, int] = {}  # entry -> responses scored so far
        self._dirty: set[int] = set()  # instances whose state changed since the last step
        self._announced = -1  # the last batch a BatchReady went out for
        self._last_migration = float("-inf")
        self._out: list[Command] = []
        admission.attach(_AdmissionView(self))

    # ---------------------------------------------------------------- the step

    def step(self, now: float, events: Iterable[Event] = ()) -> list[Command]:
        self.now = now
        self._forget_given_up()
        for event in events:
            self._handle(event)
            # Before the next event: one may complete an entry this one's abort rule gave up
            # (snapshots and finished trajectories never reach the admission).
            if type(event) not in _UNSEEN_BY_ADMISSION:
                self._forget_given_up()
        if self.late_binding:
            self.rebound += late_bind(self.cluster, self.server, self.admission, self._bound_at,
                                      self.dead)
        for i in self.admission.syncs(sorted(self._dirty - self.dead)):
            self._out.append(Sync(i))
            self.cluster.syncing[i] = True
        self._dirty.clear()
        if self.migration.moves_work and now - self._last_migration >= self.migration_interval_s:
            self._last_migration = now
            self._migrate()
        if self.admission.may_dispatch():
            self._dispatch_resumes()
            self._dispatch_new()
        if self._announced < self.version and self.admission.ready(self.version):
            self._announced = self.version
            self._out.append(BatchReady(self.version))
        out, self._out = self._out, []
        return out

    def batch_ready(self, version: int) -> bool:
        return version == self.version and self.admission.ready(version)

    def take_batch(self, version: int) -> Batch:
        """The trainer's batch `version` (entries sorted, so it does not depend on timing)."""
        if not self.batch_ready(version):
            raise StalenessError(f"batch {version} is not ready: {self.describe_wait(version)}")
        entries = sorted(self.admission.consume(version))
        v_traj = [self.server.v_traj(e) for e in entries]
        if self.admission.bounded:  # the invariant, checked on every consume
            for entry, v in zip(entries, v_traj):
                if not v <= version <= v + self.eta:
                    raise StalenessError(f"entry {entry}: V_traj {v} consumed at version "
                                         f"{version} breaks the bound η = {self.eta}")
        groups = [self.server.consume(e) for e in entries]
        self.version = version + 1
        return Batch(version, entries, v_traj, groups)

    def describe_wait(self, version: int) -> str:
        alive = len(self.cluster) - len(self.dead)
        restarting = len(self.members.rejoining)
        return (f"{self.admission.describe(version)}; {alive} of {len(self.cluster)} instances "
                f"alive{f' ({restarting} restarting)' if restarting else ''}, "
                f"{int(self.cluster.load.sum())} trajectories on them, "
                f"{len(self._resume)} waiting to resume")

    def alive_instances(self) -> list[int]:
        return [i for i in range(len(self.cluster)) if i not in self.dead]

    # ---------------------------------------------------------------- events

    def _handle(self, event: Event) -> None:
        cluster = self.cluster
        if isinstance(event, InstanceState):
            i = event.instance
            if i in self.dead:
                return
            # An instance's version never falls: a snapshot older than a Synced event is stale.
            cluster.version[i] = max(event.version, int(cluster.version[i]))
            cluster.running[i] = event.running
            cluster.queued[i], cluster.kv_tokens[i] = event.queued, event.kv_tokens
            cluster.num_slots[i], cluster.syncing[i] = event.num_slots, event.syncing
            cluster.kv_capacity[i] = event.kv_capacity or np.inf
            self.decode_steps[i] = event.decode_steps
            self.members.hold_back(cluster, i)
            self._dirty.add(i)
        elif isinstance(event, Finished):
            for t in event.trajectory_ids:
                self._moving.pop(t, None)  # started before its extraction reached the instance
                if self.server.has(t) and self.server.state(t) is _S.GENERATED:
                    self._out.append(Score(t))
        elif isinstance(event, Scored):
            self._scored(event)
        elif isinstance(event, Extracted):
            for t in event.trajectory_ids:
                dst = self._moving.pop(t, None)
                if not self.server.has(t):
                    continue  # aborted meanwhile
                if (self.server.state(t) is _S.ROUTED
                        and self.server.instance_of(t) == event.instance):
                    self.server.interrupt(t)  # handed back from the queue, never started
                if self.server.state(t) is _S.INTERRUPTED:
                    self._queue_resume(t, prefer=dst)
                    self.counters.migrated += dst is not None
        elif isinstance(event, Failed):
            self._instance_failed(event.instance, event.error, event.rejoining)
        elif isinstance(event, Rejoined):
            self._instance_rejoined(event.instance, event.version)
        elif isinstance(event, RejoinFailed):
            self.members.give_up(event.instance)
            self._check_any_left(event.error)
        elif isinstance(event, Synced):
            if event.instance not in self.dead:
                cluster.version[event.instance] = max(cluster.version[event.instance], event.version)
                cluster.syncing[event.instance] = False
                self.members.hold_back(cluster, event.instance)
                self._dirty.add(event.instance)
            self.admission.on_synced(event.instance, event.version)
        elif isinstance(event, Published):
            self.latest_version = max(self.latest_version, event.version)
            self._dirty.update(self.alive_instances())
            self.admission.on_published(event.version)
        else:
            raise TypeError(f"not a coordinator event: {event!r}")

    def _scored(self, event: Scored) -> None:
        t = event.trajectory_id
        if not self.server.has(t):
            return  # its group was aborted while it was being scored
        entry = self.server.entry_of(t)
        if event.reward is None:
            self.counters.reward_failures += 1
            self._retry.append(self.server.prompt_id(entry))
            self.abort_entry(entry)
            return
        self.counters.reward_errors += bool(event.error)
        self.server.set_reward(t, event.reward)
        # Counted (from the server the first time, e.g. after a restore), so that a group is
        # scanned once it may be complete, not at every reward.
        scored = self._rewarded.get(entry)
        scored = self._rewarded[entry] = (
            sum(self.server.state(m) is _S.REWARDED for m in self.server.members(entry))
            if scored is None else scored + 1)
        if self.redundancy.group_complete(scored, self.group_size):
            self._group_progress(entry)

    def _group_progress(self, entry: int) -> None:
        """Once N responses are scored the group waits for training (or is filtered out)."""
        members = self.server.members(entry)
        scored = [t for t in members if self.server.state(t) is _S.REWARDED]
        if not self.redundancy.group_complete(len(scored), self.group_size):
            return
        self._rewarded.pop(entry, None)
        kept = scored[:self.group_size]
        kept_ids = set(kept)
        surplus = [t for t in members if t not in kept_ids]
        if surplus:  # group redundancy: the slowest responses are dropped
            # One handed back (a recycled or migrated partial rollout) waits in the resume
            # queue, not on an instance: it leaves the queue with the rest.
            dropped = set(surplus)
            self._resume.remove_if(lambda item: item[0] in dropped)
            self._drop(self.server.drop_members(entry, surplus))
        rewards = {self.server.reward(t) for t in kept}
        if self.dynamic_sampling and len(rewards) == 1:
            self.counters.filtered_groups += 1
            self.abort_entry(entry)  # no GRPO signal; a fresh prompt takes its place
            return
        self.counters.kept_groups += 1
        self.server.occupy(entry)
        self._carry_out(self.admission.on_scored(entry))

    def _instance_failed(self, instance: int, error: str, rejoining: bool) -> None:
        if not self.members.fail(self.cluster, instance, rejoining):
            return
        self.counters.failed_instances += 1
        self._check_any_left(error)
        for t in self.server.held_by(instance):
            # An extraction asked of the dead instance will never be answered: a later,
            # unrelated one must not take it for a migration.
            self._moving.pop(t, None)
            self.server.interrupt(t)
            self._queue_resume(t)
            self.counters.rerouted_after_failure += 1

    def _check_any_left(self, error: str) -> None:
        if self.members.none_left(len(self.cluster)):
            raise AllInstancesFailed(f"every rollout instance has failed and none is restarting; "
                                     f"the last: {error}")

    def _instance_rejoined(self, instance: int, version: int) -> None:
        """A fresh instance in a failed one's place: nothing of the old one's is on it (that
        was re-routed at the failure), and it takes work once it holds the newest weights."""
        if self.members.rejoin(self.cluster, instance, version, self.latest_version):
            self._out.append(Sync(instance))
            self.cluster.syncing[instance] = True
        self.counters.rejoined_instances += 1
        self._dirty.add(instance)
        self.admission.on_synced(instance, version)  # a collective update may now count it

    # ---------------------------------------------------------------- aborts and extraction

    def _forget_given_up(self) -> None:
        self._carry_out(map(Abort, self.admission.take_aborted()))

    def _carry_out(self, decisions: Iterable[Decision]) -> None:
        """Does what the admission decided, in its order. It only reads the core (a
        `CoreView`), so every change its decisions make to the run is made here."""
        for decision in decisions:
            if isinstance(decision, Recycle):
                self.extract_entry(decision.entry)
            # The admission already freed the entry's place: not called back (`on_aborted`).
            # The entry may have gone meanwhile (trained, or given up by the core itself).
            elif self.server.has_entry(decision.entry):
                self._forget_entry(decision.entry)

    def abort_entry(self, entry: int) -> None:
        """Gives an entry up: the admission frees its place, the instances drop its work."""
        self.admission.on_aborted(entry)
        self._forget_entry(entry)

    def _forget_entry(self, entry: int) -> None:
        self.counters.aborted_entries += 1
        self.aborted_ids.append(entry)
        self._rewarded.pop(entry, None)
        members = self.server.members(entry)
        if self.server.state(members[0]) is _S.OCCUPIED:
            # Scored and buffered (a replay buffer's collection, a full queue): the lifecycle
            # lets an occupied entry only be consumed, and nothing of it runs anywhere.
            self.server.consume(entry)
            return
        members = set(members)
        for t in members:
            self._moving.pop(t, None)
        self._resume.remove_if(lambda item: item[0] in members)
        self._drop(self.server.abort(entry))

    def _drop(self, held: list[tuple[int, int]]) -> None:
        for instance, ids in _by_instance(held):
            if instance not in self.dead:
                self._out.append(Drop(instance, ids))

    def extract_entry(self, entry: int) -> None:
        """Asks the instances holding the entry's unfinished trajectories to hand them back."""
        held = [(t, self.server.instance_of(t)) for t in self.server.members(entry)
                if self.server.state(t) in (_S.ROUTED, _S.RUNNING)]
        for instance, ids in _by_instance(held):
            if instance not in self.dead:
                self._out.append(Extract(instance, ids))

    # ---------------------------------------------------------------- migration

    def _migrate(self) -> None:
        cluster = self.cluster
        admits = [v for v in np.unique(cluster.version).tolist() if self.admission.version_admits_new(v)]
        can_new = np.isin(cluster.version, admits)
        for move in self.migration.plan(cluster, can_new):
            if move.src in self.dead or move.dst in self.dead:
                continue
            candidates = movable(self.server, move.src, int(self.decode_steps[move.src]),
                                 self.partial_rollout)
            picked = tuple(c.traj_id for c in pick_trajectories(candidates, move.count))
            if picked:
                self._moving.update((t, move.dst) for t in picked)
                self._out.append(Extract(move.src, picked))

    # ---------------------------------------------------------------- dispatch

    def _queue_resume(self, t: int, prefer: int | None = None) -> None:
        self._resume.push((t, prefer), self.server.v_traj(self.server.entry_of(t)))

    def _dispatch_resumes(self) -> None:
        cluster, waiting = self.cluster, []
        while len(self._resume):
            v_traj = self._resume.peek_v_traj()
            t, prefer = self._resume.pop()
            eligible = eligible_resume(cluster, v_traj)
            if prefer is not None and eligible[prefer]:
                target = prefer
            else:
                _, prompt, tokens, _ = self.server.progress(t)
                target = self.router.choose(cluster, eligible, Request(1, prompt + tokens, v_traj))
            if target is None:
                waiting.append((t, v_traj))
                continue
            self.server.route(t, target)
            self._out.append(Dispatch(target, self.server.entry_of(t), (t,), resume=True))
            cluster.queued[target] += 1
        for t, v_traj in waiting:
            self._resume.push((t, None), v_traj)

    def _next_prompt(self) -> Prompt | None:
        if self._retry:
            return self.prompts.get(self._retry[0])
        if self._peeked is None:
            self._peeked = next(self.prompts, None)
        return self._peeked

    def _dispatch_new(self) -> None:
        cluster = self.cluster
        launch = self.redundancy.responses_to_launch(self.group_size)
        while self.admission.admits_new():
            prompt = self._next_prompt()
            if prompt is None:
                return
            eligible = eligible_new(cluster, self.admission.version_admits_new)
            if not eligible.any():  # most steps at scale: the router need not be asked
                return
            if self.per_response:
                targets = place_each_response(self.router, cluster, eligible, launch,
                                              len(prompt.tokens))
                if targets is None:
                    return
            else:
                target = self.router.choose(cluster, eligible, Request(launch, len(prompt.tokens)))
                if target is None:
                    return
                targets = [target] * launch
                cluster.queued[target] += launch
            if self._retry:
                self._retry.popleft()
            else:
                self._peeked = None
            # Every response runs on weights at least as new as the oldest instance chosen,
            # and that instance was eligible: its version can reserve.
            entry, version = self.next_entry_id, int(cluster.version[targets].min())
            self.next_entry_id += 1
            self.admission.on_dispatched(entry, version)
            ids = self.server.add_group(entry, prompt.prompt_id, prompt.tokens, launch,
                                        self.max_new_tokens, v_traj=version)
            for t, target in zip(ids, targets):
                self.server.route(t, target)
            self.counters.dispatched += 1
            for target, tids in _by_instance(zip(ids, targets)):
                self._out.append(Dispatch(target, entry, tids, resume=False))

    # ---------------------------------------------------------------- checkpoints

    def state_dict(self) -> dict:
        """Plain JSON: with the server's and the admission's state, all a resume needs."""
        return {"next_entry_id": self.next_entry_id, "version": self.version,
                "retry": list(self._retry), "aborted": list(self.aborted_ids),
                "counters": dataclasses.asdict(self.counters),
                "admission": self.admission.state_dict(),
                "admission_kind": type(self.admission).__name__}

    def load_state_dict(self, state: dict) -> None:
        """Takes over a checkpoint's state (the server restored first) and re-queues its work:
        partial and never-started trajectories resume from their saved tokens, generated
        ones are scored again, fully scored groups wait for training."""
        self.next_entry_id, self.version = state["next_entry_id"], state["version"]
        self.latest_version = max(self.latest_version, self.version)
        self._retry = collections.deque(state["retry"])
        self.aborted_ids = list(state["aborted"])
        self.counters = Counters(**state["counters"])
        kind = state.get("admission_kind")  # absent from checkpoints older than the field
        if kind is not None and kind != type(self.admission).__name__:
            # One schedule's bookkeeping means nothing to another (a run resumed anyway
            # under another coordinator.admission).
            raise AdmissionMismatch(
                f"the checkpoint's coordinator state was written by {kind}, this config's "
                f"coordinator.admission runs {type(self.admission).__name__}: resume with the "
                f"admission the run started with (its run.json), or use a fresh --workdir")
        self.admission.load_state_dict(state["admission"])
        for entry in self.server.entries():
            for t in self.server.members(entry):
                s = self.server.state(t)
                if s in (_S.PENDING, _S.INTERRUPTED):
                    self._queue_resume(t)
                elif s is _S.GENERATED:
                    self._out.append(Score(t))
            if self.server.group_rewarded(entry):
                self._group_progress(entry)


class _AdmissionView:
    """The core as its admission reads it (`CoreView`): properties only, so the admission
    cannot act on the run except through the decisions the core carries out."""

    __slots__ = ("_core",)

    def __init__(self, core: Core):
        self._core = core

    @property
    def cluster(self) -> ClusterView:
        return self._core.cluster

    @property
    def dead(self) -> AbstractSet[int]:
        return self._core.dead

    @property
    def version(self) -> int:
        return self._core.version

    @property
    def latest_version(self) -> int:
        return self._core.latest_version

    @property
    def now(self) -> float:
        return self._core.now

    @property
    def partial_rollout(self) -> bool:
        return self._core.partial_rollout

    def v_traj(self, entry: int) -> int:
        return self._core.server.v_traj(entry)


def _by_instance(held: Iterable[tuple[int, int]]) -> Iterator[tuple[int, tuple[int, ...]]]:
    """(trajectory, instance) pairs grouped as (instance, trajectory ids), both sorted."""
    by: dict[int, list[int]] = {}
    for t, instance in held:
        by.setdefault(instance, []).append(t)
    for instance in sorted(by):
        yield instance, tuple(sorted(by[instance]))
