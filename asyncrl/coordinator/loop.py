"""The coordinator: a thread that dispatches, routes, syncs, migrates and scores.

Each tick, in this order:
  1. events from instances: finished trajectories go to the reward pool; extracted ones
     (migration) are re-routed; a failed instance's trajectories are re-routed;
  2. reward outcomes: a failed call aborts its group and re-dispatches the prompt; a fully
     scored group is filtered (dynamic sampling, optional) and occupied;
  3. the abort rule: entries the StalenessManager aborted are dropped everywhere;
  4. weight sync per instance (the sync policy), or all together under the barrier schedule;
  5. migration moves (the migration policy);
  6. dispatch: resumed trajectories first, oldest V_traj first, then new entries, each
     reserved at the chosen instance's version before it is queued there.

The coordinator imports no model code: it sees instances through `submit` / `request_*` /
`snapshot` and tokens as ints; the system injects the prompt source and the detokenizer.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import queue
import threading
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from asyncrl.coordinator.migration import MigrationPolicy
from asyncrl.coordinator.redundancy import Redundancy
from asyncrl.registry import Registry
from asyncrl.coordinator.routing import PendingQueue, Request, Router, eligible_new, eligible_resume
from asyncrl.coordinator.sync import SyncContext, SyncPolicy
from asyncrl.coordinator.view import ClusterView, InstanceView
from asyncrl.rollout.messages import Event, InstanceFailed, Snapshot, Trajectory, Work
from asyncrl.rewards import RewardPool
from asyncrl.servers.parameters import ParameterServer
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import StalenessError, StalenessManager, TrajectoryState

log = logging.getLogger(__name__)

SCHEDULES = Registry("schedule")
for _name in ("staleflow", "barrier", "token_bucket"):
    SCHEDULES.register(_name)(_name)


@dataclasses.dataclass(frozen=True)
class Prompt:
    prompt_id: int
    tokens: tuple[int, ...]
    reward_kwargs: dict[str, Any]  # e.g. {"answer": "42"}; the response text is added


class Instance(Protocol):
    id: int

    def submit(self, work: Work) -> None: ...  # raises InstanceFailed once it has died
    def request_sync(self) -> None: ...
    def request_drop(self, trajectory_ids: set[int]) -> None: ...
    def request_extract(self, count: int) -> None: ...
    def snapshot(self) -> Snapshot: ...


@dataclasses.dataclass
class Counters:
    dispatched: int = 0
    migrated: int = 0
    aborted_entries: int = 0
    reward_failures: int = 0
    filtered_groups: int = 0
    rerouted_after_failure: int = 0
    failed_instances: int = 0


class Coordinator:
    def __init__(self, *, staleness: StalenessManager, trajectories: TrajectoryServer,
                 parameters: ParameterServer, instances: list[Instance], rewards: RewardPool,
                 prompts: Iterator[Prompt], decode: Callable[[list[int]], str], reward_name: str,
                 group_size: int, max_new_tokens: int, router: Router, sync: SyncPolicy,
                 migration: MigrationPolicy, redundancy: Redundancy, schedule: str = "staleflow",
                 eta: int = 0, dynamic_sampling: bool = False, next_entry_id: int = 0):
        SCHEDULES.get(schedule)
        self.sm, self.server, self.parameters = staleness, trajectories, parameters
        self.instances = instances
        self.rewards, self.prompts, self.decode, self.reward_name = rewards, prompts, decode, reward_name
        self.group_size, self.max_new_tokens = group_size, max_new_tokens
        self.router, self.sync, self.migration, self.redundancy = router, sync, migration, redundancy
        self.schedule, self.eta, self.dynamic_sampling = schedule, eta, dynamic_sampling
        self.events: queue.Queue[Event] = queue.Queue()
        self.counters = Counters()
        self.next_entry_id = next_entry_id
        self._retry: collections.deque[Prompt] = collections.deque()  # prompts to re-dispatch
        self._prompt_of: dict[int, Prompt] = {}  # live entry -> its prompt
        self._resume = PendingQueue()  # (entry id, Trajectory) waiting for an instance
        self._migrate_to: dict[int, collections.deque[int]] = collections.defaultdict(collections.deque)
        self._dead: set[int] = set()
        self.aborted_ids: list[int] = []  # every entry given up, for the run's accounting
        self._stop = threading.Event()
        # Held for a whole tick: the trainer takes it to consume or snapshot a consistent state.
        self._tick_lock = threading.Lock()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="coordinator", daemon=True)

    # ---------------------------------------------------------------- control

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)

    def check(self) -> None:
        """Re-raises a failure of the coordinator thread in the caller (the trainer loop)."""
        if self._error is not None:
            raise RuntimeError("the coordinator thread failed") from self._error

    @contextlib.contextmanager
    def paused(self):
        """No tick runs inside: the protocol, the servers and the queues agree with each other."""
        with self._tick_lock:
            yield

    def prompt_of(self) -> dict[int, Prompt]:
        """The prompt of every entry not yet consumed (a checkpoint stores them)."""
        return dict(self._prompt_of)

    def retry_prompts(self) -> list[Prompt]:
        """Prompts waiting to be re-dispatched after a failed reward."""
        return list(self._retry)

    def restore(self, *, staleness: StalenessManager, trajectories: TrajectoryServer,
                next_entry_id: int, live: dict[int, Prompt], retry: list[Prompt]) -> None:
        """Takes over a checkpoint's state before `start`, and queues the work it held:
        partial and never-started trajectories are re-routed (they resume from their saved
        tokens), generated ones are scored again, fully scored groups occupied."""
        self.sm, self.server = staleness, trajectories
        self.next_entry_id = next_entry_id
        self._prompt_of = dict(live)
        self._retry = collections.deque(retry)
        S = TrajectoryState
        for entry in self.server.entries():
            for t in self.server.members(entry):
                state = self.server.state(t)
                if state in (S.PENDING, S.INTERRUPTED):
                    self._queue_resume(entry, to_engine_record(self.server.record(t)))
                elif state is S.GENERATED:
                    record = self.server.record(t)
                    self.rewards.submit(t, self.reward_name, response=self.decode(record.tokens),
                                        **self._prompt_of[entry].reward_kwargs)
            if self.server.group_rewarded(entry):
                self._maybe_occupy(entry)

    def forget_consumed(self, entry_ids: list[int]) -> None:
        for e in entry_ids:
            self._prompt_of.pop(e, None)

    # ---------------------------------------------------------------- the tick loop

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    event = self.events.get(timeout=0.005)
                except queue.Empty:
                    event = None
                with self._tick_lock:
                    if event is not None:
                        self._handle(event)
                    self.tick()
        except BaseException as error:
            log.exception("coordinator failed")
            self._error = error

    def tick(self) -> None:
        while True:
            try:
                self._handle(self.events.get_nowait())
            except queue.Empty:
                break
        self._score()
        self._apply_aborts()
        snapshots = [i.snapshot() for i in self.instances]
        cluster = self._cluster(snapshots)
        self._sync(cluster)
        self._migrate(cluster)
        self._dispatch_resumes(cluster)
        self._dispatch_new(cluster)

    def _cluster(self, snapshots: list[Snapshot]) -> ClusterView:
        cluster = ClusterView.from_views([
            InstanceView(i, max(s.version, 0), s.running, s.queued, s.kv_tokens, s.num_slots,
                         s.syncing) for i, s in enumerate(snapshots)])
        # A failed instance is never eligible: it looks permanently full.
        for i in self._dead:
            cluster.queued[i] = cluster.num_slots[i]
        return cluster

    # ---------------------------------------------------------------- events

    def _handle(self, event: Event) -> None:
        if event.kind == "finished":
            for record, entry in zip(event.trajectories, event.entry_ids):
                prompt = self._prompt_of.get(entry)
                if prompt is None:
                    continue  # aborted meanwhile
                self.rewards.submit(record.trajectory_id, self.reward_name,
                                    response=self.decode(record.tokens), **prompt.reward_kwargs)
        elif event.kind == "extracted":
            dst = self._migrate_to[event.instance].popleft() if self._migrate_to[event.instance] else None
            for record, entry in zip(event.trajectories, event.entry_ids):
                if entry in self._prompt_of:
                    self._queue_resume(entry, record, prefer=dst)
                    self.counters.migrated += 1
        elif event.kind == "failed":
            log.error("rollout instance %d failed (%r); re-routing its %d trajectories",
                      event.instance, event.error, len(event.lost_ids))
            self._mark_dead(event.instance, event.error)
            self._reroute(event.lost_ids)

    def _mark_dead(self, instance: int, error: BaseException | None) -> None:
        if instance in self._dead:
            return
        self._dead.add(instance)
        self.counters.failed_instances += 1
        if len(self._dead) == len(self.instances):
            raise RuntimeError("every rollout instance has failed") from error

    def _reroute(self, trajectory_ids) -> None:
        for t in trajectory_ids:
            try:
                if self.server.state(t) in (TrajectoryState.ROUTED, TrajectoryState.RUNNING):
                    self.server.interrupt(t)
                record = self.server.record(t)
            except (StalenessError, KeyError):
                continue  # aborted meanwhile
            self._queue_resume(record.entry_id, to_engine_record(record))
            self.counters.rerouted_after_failure += 1

    def _submit(self, target: int, work: Work, cluster: ClusterView) -> None:
        """Hands work to an instance; if it died since its snapshot, the work is re-routed."""
        try:
            self.instances[target].submit(work)
        except InstanceFailed as error:
            # Its "failed" event is still in flight; it holds none of this work.
            log.warning("%s; re-routing %d trajectories", error, len(work.trajectories))
            self._mark_dead(target, error)
            cluster.queued[target] = cluster.num_slots[target]
            self._reroute([t.trajectory_id for t in work.trajectories])
            return
        cluster.queued[target] += len(work.trajectories)

    def _queue_resume(self, entry: int, record: Trajectory, prefer: int | None = None) -> None:
        self._resume.push((entry, record, prefer), self.server.v_traj(entry))

    # ---------------------------------------------------------------- rewards and occupy

    def _score(self) -> None:
        for trajectory_id, outcome in self.rewards.poll():
            try:
                entry = self.server.record(trajectory_id).entry_id
            except KeyError:
                continue  # its group was aborted while it was being scored
            if not outcome.ok:
                log.warning("reward of trajectory %d failed: %s; re-dispatching its prompt",
                            trajectory_id, outcome.error)
                self.counters.reward_failures += 1
                self._retry.append(self._prompt_of[entry])
                self._abort_entry(entry)
                continue
            self.server.set_reward(trajectory_id, outcome.reward)
            self._maybe_occupy(entry)

    def _maybe_occupy(self, entry: int) -> None:
        members = self.server.members(entry)
        scored = [t for t in members if self.server.state(t) is TrajectoryState.REWARDED]
        if not self.redundancy.group_complete(len(scored), self.group_size):
            return
        surplus = [t for t in members if t not in scored[:self.group_size]]
        if surplus:  # group redundancy: the slowest responses are dropped
            self._drop_everywhere(set(self.server.drop_members(entry, surplus)))
        rewards = [self.server.record(t).reward for t in scored[:self.group_size]]
        if self.dynamic_sampling and len(set(rewards)) == 1:
            self.counters.filtered_groups += 1
            self._abort_entry(entry)  # no GRPO signal; a fresh prompt takes its place
            return
        self.sm.occupy(entry)
        self.server.occupy(entry)

    def _abort_entry(self, entry: int) -> None:
        try:
            self.sm.abort(entry)
        except StalenessError:
            pass  # already aborted by the abort rule
        self._finish_abort(entry)

    def _finish_abort(self, entry: int) -> None:
        self.counters.aborted_entries += 1
        self.aborted_ids.append(entry)
        self._prompt_of.pop(entry, None)
        self._resume.remove_if(lambda item: item[0] == entry)
        self._drop_everywhere(set(self.server.abort(entry)))

    def _drop_everywhere(self, trajectory_ids: set[int]) -> None:
        if trajectory_ids:
            for i, instance in enumerate(self.instances):
                if i not in self._dead:
                    instance.request_drop(trajectory_ids)

    def _apply_aborts(self) -> None:
        for entry in self.sm.take_aborted():
            if entry in self.server.entries():
                self._finish_abort(entry)

    # ---------------------------------------------------------------- sync and migration

    def _sync(self, cluster: ClusterView) -> None:
        latest = self.parameters.latest_version
        alive = [i for i in range(len(cluster)) if i not in self._dead]
        if self.schedule == "barrier":
            # All instances pull together, once every one of them has drained.
            if any(cluster.version[i] < latest for i in alive) and all(
                    cluster.load[i] == 0 and not cluster.syncing[i] for i in alive):
                for i in alive:
                    self.instances[i].request_sync()
            return
        for i in alive:
            view = cluster.view(i)
            ctx = SyncContext(latest, self.sm.can_reserve(view.version))
            if self.sync.should_sync(view, ctx):
                self.instances[i].request_sync()

    def _migrate(self, cluster: ClusterView) -> None:
        can_new = np.array([self.sm.can_reserve(int(v)) for v in cluster.version])
        for move in self.migration.plan(cluster, can_new):
            if move.src in self._dead or move.dst in self._dead:
                continue
            self._migrate_to[move.src].append(move.dst)
            self.instances[move.src].request_extract(move.count)

    # ---------------------------------------------------------------- dispatch

    def _dispatch_resumes(self, cluster: ClusterView) -> None:
        waiting = []
        while len(self._resume):
            v_traj = self._resume.peek_v_traj()
            entry, record, prefer = self._resume.pop()
            eligible = eligible_resume(cluster, v_traj)
            if prefer is not None and eligible[prefer]:
                target = prefer
            else:
                request = Request(1, len(record.prompt) + len(record.tokens), v_traj)
                target = self.router.choose(cluster, eligible, request)
            if target is None:
                waiting.append((entry, record, v_traj))
                continue
            self.server.route(record.trajectory_id, target)
            self._submit(target, Work(entry, [record]), cluster)
        for entry, record, v_traj in waiting:
            self._resume.push((entry, record, None), v_traj)

    def _admits_new(self, cluster: ClusterView) -> bool:
        if self.schedule == "barrier":
            latest = self.parameters.latest_version
            return not any(cluster.version[i] < latest for i in range(len(cluster)) if i not in self._dead)
        if self.schedule == "token_bucket":
            # AReaL: accepted + running ≤ (η + version + 1)·B, i.e. unconsumed work ≤ (η+1)·B.
            consumed = self.sm.version * self.sm.batch_size
            live = self.counters.dispatched - self.counters.aborted_entries - consumed
            return live < (self.eta + 1) * self.sm.batch_size
        return True

    def _dispatch_new(self, cluster: ClusterView) -> None:
        responses = self.redundancy.responses_to_launch(self.group_size)
        while self._admits_new(cluster):
            eligible = eligible_new(cluster, self.sm.can_reserve)
            prompt = self._retry[0] if self._retry else None
            length = len(prompt.tokens) if prompt else 0
            target = self.router.choose(cluster, eligible, Request(responses, length))
            if target is None:
                return
            if prompt is None:
                try:
                    prompt = next(self.prompts)
                except StopIteration:
                    return
            else:
                self._retry.popleft()
            version = int(cluster.version[target])
            entry = self.next_entry_id
            self.next_entry_id += 1
            self.sm.reserve(entry, version)
            ids = self.server.add_group(entry, prompt.prompt_id, prompt.tokens, responses,
                                        self.max_new_tokens, v_traj=version)
            self._prompt_of[entry] = prompt
            prompt_array = np.asarray(prompt.tokens, np.int32)
            for t in ids:
                self.server.route(t, target)
            self.counters.dispatched += 1
            self._submit(target, Work(entry, [Trajectory(t, prompt_array, self.max_new_tokens)
                                              for t in ids]), cluster)


def to_engine_record(record) -> Trajectory:
    """The engine's view of a saved trajectory: enough to resume it by re-prefilling."""
    return Trajectory(record.trajectory_id, record.prompt, record.max_new_tokens,
                      list(record.tokens), list(record.logprobs), list(record.policy_logprobs),
                      list(record.versions), None)
