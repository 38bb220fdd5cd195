"""The simulated cluster: modelled rollout instances, trainer, weight transfers and rewards,
driven by the coordinator core. Every decision (admission, routing, weight sync, which
trajectories migrate, redundancy, aborts, when to train) is the core's, built from the run
config as the live system builds its own; the cluster applies the commands and reports what
happened, as the live threaded driver (`asyncrl.drivers.threaded`) does with real instances.

    EventLoop ── time point ──► Cluster._step: events ──► Core.step(now, events) ──► commands
        ▲                                                                               │
        └──── SimInstance (decode chunks, prefill, pulls), SimTrainer, reward latency ◄─┘

One core step per time point (every heap event due at one virtual instant): instances, the
trainer and the reward function first record what happened (trajectories finished or
handed back, rewards, syncs, published weights, and an InstanceState for each instance
whose state changed), then the core steps once on all of it and its commands are applied
in order. A command whose consequence is immediate (an Extract's Extracted, a batch taken
by the trainer) leads to another step at the same instant before time moves on.

Trajectories go through the TrajectoryServer's lifecycle like live ones: the core adds and
routes them, the instance `try_start`s them as they enter a slot and `report`s them finished
or interrupted (with no tokens: tokens are not simulated, only counted here). Every call into
the core is timed (`CoordTimer`): that is the coordinator's cost per training step.
"""

from __future__ import annotations

import time

from asyncrl.coordinator.messages import (BatchReady, Dispatch, Drop, Extract, Extracted,
                                          Failed, Finished, Published, Score, Scored, Sync,
                                          Synced)
from asyncrl.coordinator.redundancy import build_redundancy
from asyncrl.sim.build import batch_size, core_from_sim_config, num_slots
from asyncrl.sim.config import label_of, window
from asyncrl.sim.events import EventLoop
from asyncrl.sim.instance import (DONE, GONE, NO_TOKENS, PREEMPTED, QUEUED, RUNNING, SimInstance,
                                  Traj)
from asyncrl.sim.metrics import CoordTimer, Metrics, Result
from asyncrl.sim.profile import Profile
from asyncrl.sim.prompts import SimPrompts
from asyncrl.sim.server import SimTrajectoryServer

_MAX_STEPS_PER_INSTANT = 1000  # commands and events answering each other without end: a bug


class Cluster:
    def __init__(self, config):
        c = self.config = config
        self.profile = Profile.load(c.profile)
        self.loop = EventLoop()
        self.metrics = Metrics()
        self.timer = CoordTimer()
        self.server = SimTrajectoryServer()
        self.slots = num_slots(c, self.profile)
        self.batch_size = batch_size(c)
        self.partial_rollout = c.coordinator.partial_rollout
        self.reprefill = c.reprefill_on_resume
        self.transfer_s = self.profile.transfer_s()
        self.warmup_steps, measure = window(c)
        self.total_steps = self.warmup_steps + measure
        self.group_size = c.group_size
        launch = build_redundancy(c.coordinator.redundancy).responses_to_launch(c.group_size)
        self.prompts = SimPrompts(c, launch)
        self.core = core_from_sim_config(c, self.profile, self.server, self.prompts,
                                         self.prompts.max_new_tokens)
        self.instances = [SimInstance(i, self) for i in range(c.num_instances)]
        self.trainer = SimTrainer(self, c.train_gpus_per_instance * c.num_instances)
        self.latest_version = 0  # the newest weights pushed
        self.trajs: dict[int, Traj] = {}  # every trajectory not yet trained or wasted
        self.members: dict[int, list[Traj]] = {}  # entry -> its trajectories as launched
        self.announced = -1  # the newest batch a BatchReady announced
        self._events: list = []
        self._finished: dict[int, list[int]] = {}  # instance -> trajectories, this instant
        self._changed: dict[int, SimInstance] = {}  # instances whose state changed
        self._touched: dict[int, SimInstance] = {}  # instances to refill once commands are applied
        self._poke = False  # the core must step although nothing was reported
        self._aborts_seen = 0
        self._rewarding: dict[int, list[int]] = {}  # entry -> its responses sent to be scored
        interval = c.coordinator.migration_interval_s
        self._tick_s = interval if self.core.migration.moves_work else 0.0

    # ---------------------------------------------------------------- running

    def run(self) -> Result:
        wall = time.perf_counter()
        self._events.append(Published(0))  # the initial weights, as the live system starts
        if self._tick_s > 0:
            self.loop.at(self._tick_s, self._tick)
        c = self.config
        trained, total = self.metrics.step_end, self.total_steps
        self.loop.run(lambda: len(trained) >= total, max_time=c.max_sim_time_s,
                      after_time_point=self._step)
        m, counters = self.metrics, self.core.counters
        m.migrated, m.dropped_groups = counters.migrated, counters.aborted_entries
        return Result.from_metrics(
            m, warmup=self.warmup_steps, system=label_of(c), instances=c.num_instances,
            eta=c.eta, seed=c.seed, batch_groups=self.batch_size, group_size=c.group_size,
            events=self.loop.processed, wall_s=time.perf_counter() - wall,
            coordinator_s=self.timer.total)

    def _tick(self) -> None:
        """Migration is considered every `migration_interval_s` even when nothing happens."""
        self._poke = True
        if len(self.loop):  # other work is pending: the run goes on, so does the clock
            self.loop.after(self._tick_s, self._tick)

    def _step(self) -> None:
        core, timer, trainer, clock = self.core, self.timer, self.trainer, time.perf_counter
        for _ in range(_MAX_STEPS_PER_INSTANT):
            events = self._events
            if self._finished or self._changed:
                events = self._take_events()
            elif not events and not self._poke:
                return
            self._events = []
            self._poke = False
            start = clock()
            commands = core.step(self.loop.now, events)
            timer.total += clock() - start
            timer.calls += 1
            if commands:
                self._apply(commands)
            if len(core.aborted_ids) > self._aborts_seen:
                self._waste_aborted()
            if not trainer.busy and self.announced >= core.version:
                trainer.maybe_start()
            if self._touched:
                self._commit_touched(self.loop.now)
        raise RuntimeError(f"t={self.loop.now:.3f}s: the core and the cluster answered each "
                           f"other {_MAX_STEPS_PER_INSTANT} times without time moving on")

    def _take_events(self) -> list:
        """What happened this instant: reported events, then finished trajectories per
        instance, then the state of each instance that changed (in instance order)."""
        events = self._events
        finished, changed = self._finished, self._changed
        if finished:
            for i in (finished if len(finished) == 1 else sorted(finished)):
                ids = finished[i]
                if ids:
                    events.append(Finished(i, tuple(ids)))
            self._finished = {}
        if changed:
            for i in (changed if len(changed) == 1 else sorted(changed)):
                events.append(changed[i].snapshot())
            self._changed = {}
        return events

    # ---------------------------------------------------------------- what instances report
    # The cluster is its instances' `asyncrl.records.EventSink`, as the threaded driver's
    # reporter is a live instance's: `finished`, `extracted`, `synced`, `failed`.

    def finished(self, instance: int, trajectory_ids) -> None:
        # Kept even when the server took none of them: the instance's step is still news.
        ids = self._finished.get(instance)
        if ids is None:
            ids = self._finished[instance] = []
        ids.extend(trajectory_ids)

    def extracted(self, instance: int, trajectory_ids) -> None:
        self._events.append(Extracted(instance, tuple(trajectory_ids)))

    def synced(self, instance: int, version: int) -> None:
        self._events.append(Synced(instance, version))

    def failed(self, instance: int, error: BaseException, rejoining: bool = False) -> None:
        # No simulated instance fails today; a fault model would report here, as a live one.
        self._events.append(Failed(instance, f"{type(error).__name__}: {error}", rejoining))

    def changed(self, inst: SimInstance) -> None:
        """Its state changed: the core gets its snapshot with this instant's events."""
        self._changed[inst.idx] = inst

    def consumed(self, batch) -> tuple[int, int]:
        """Forgets a trained batch's trajectories; returns its (tokens, response tokens)."""
        self._poke = True  # consuming frees the admission: the core may dispatch at once
        response_tokens = tokens = 0
        for entry, records in zip(batch.entries, batch.groups):
            self._rewarding.pop(entry, None)
            kept = {r.trajectory_id for r in records}
            for traj in self.members.pop(entry):
                if traj.id in kept:
                    response_tokens += traj.target
                    tokens += traj.prompt + traj.target
                    self.trajs.pop(traj.id, None)
                else:  # group redundancy's surplus, dropped when the group completed
                    self._waste(traj)
        return tokens, response_tokens

    def published(self, version: int) -> None:
        self.latest_version = version
        self._events.append(Published(version))

    def _to_reward(self, ids: list[int], now: float) -> None:
        """The profile's reward model: a group is scored `reward_latency_s` after its N-th
        response finished (the responses before it wait for it; any after it, group
        redundancy's stragglers, are scored on their own)."""
        n = self.group_size
        release = []
        for t in ids:
            traj = self.trajs.get(t)
            if traj is None:
                continue
            waiting = self._rewarding.get(traj.entry)
            if waiting is None:
                waiting = self._rewarding[traj.entry] = []
            waiting.append(t)
            if len(waiting) == n:
                release += waiting
            elif len(waiting) > n:
                release.append(t)
        if release:
            self.loop.at(now + self.profile.reward_latency_s, self._scored, release)

    def _scored(self, ids: list[int]) -> None:
        for t in ids:
            traj = self.trajs.get(t)
            self._events.append(Scored(t, traj.reward if traj is not None else 0.0))

    # ---------------------------------------------------------------- commands

    def _apply(self, commands) -> None:
        """Applies the commands in order; each touched instance then refills its slots and
        re-plans once, after all of them (a Drop later in the list must not find the work it
        drops already started by an earlier command's refill)."""
        now = self.loop.now
        scores = []
        touched = self._touched
        for command in commands:
            kind = type(command)
            if kind is Dispatch:
                self._dispatch(command)
            elif kind is Sync:
                self.instances[command.instance].request_pull(now)
            elif kind is Score:
                scores.append(command.trajectory_id)
                continue
            elif kind is Extract:
                self._extract(command, now)
            elif kind is Drop:
                self._drop(command)
            elif kind is BatchReady:
                self.announced = max(self.announced, command.version)
                continue
            else:
                raise TypeError(f"not a coordinator command: {command!r}")
            touched[command.instance] = self.instances[command.instance]
        if scores:
            self._to_reward(scores, now)
        self._commit_touched(now)

    def _commit_touched(self, now: float) -> None:
        if self._touched:
            for _, inst in sorted(self._touched.items()):
                inst.commit(now)
            self._touched = {}

    def _dispatch(self, command: Dispatch) -> None:
        inst = self.instances[command.instance]
        if command.resume:  # a partial trajectory keeps its tokens and re-prefills them
            for t in command.trajectory_ids:
                inst.enqueue(self.trajs[t])
            return
        server, entry = self.server, command.entry
        v_traj = server.v_traj(entry)
        prompt, lengths, rewards = self.prompts.responses(server.prompt_id(entry))
        # Routed per response, a group arrives in several Dispatches: response k of the
        # group keeps its k-th length wherever it runs.
        position = {t: k for k, t in enumerate(server.members(entry))}
        members = self.members.setdefault(entry, [])
        for t in command.trajectory_ids:
            k = position[t]
            traj = self.trajs[t] = Traj(t, entry, prompt, lengths[k], rewards[k], v_traj)
            members.append(traj)
            inst.enqueue(traj)

    def _extract(self, command: Extract, now: float) -> None:
        """Hands trajectories back, keeping their tokens (a migration, a recycled rollout)."""
        inst = self.instances[command.instance]
        handed = []
        for t in command.trajectory_ids:
            traj = self.trajs.get(t)
            if traj is None or traj.inst is not inst:
                continue
            running = traj.state in (RUNNING, PREEMPTED)  # the server has both running
            if inst.remove(traj, now):  # False: it finished on its last step meanwhile
                if running:  # a queued one never started: the server still has it ROUTED
                    self.server.report(t, NO_TOKENS, NO_TOKENS, NO_TOKENS, NO_TOKENS, None)
                handed.append(t)
        if handed:
            self.extracted(inst.idx, handed)

    def _drop(self, command: Drop) -> None:
        for t in command.trajectory_ids:
            traj = self.trajs.get(t)
            if traj is not None:
                self._waste(traj)

    # ---------------------------------------------------------------- token accounting

    def _waste(self, traj: Traj) -> None:
        """Its tokens will never train: the entry was aborted, or it was a surplus response."""
        if traj.state == GONE:
            return
        if traj.state in (QUEUED, RUNNING, PREEMPTED):  # taken off its instance, which refills later
            inst = traj.inst
            inst.remove(traj, self.loop.now)
            self._touched[inst.idx] = inst
        m = self.metrics
        if traj.state == DONE:
            m.wasted_tokens += traj.target  # generated_tokens counted it when it finished
        else:
            m.generated_tokens += traj.gen
            m.wasted_tokens += traj.gen
        traj.state = GONE
        self.trajs.pop(traj.id, None)

    def _waste_aborted(self) -> None:
        aborted = self.core.aborted_ids
        while self._aborts_seen < len(aborted):
            entry = aborted[self._aborts_seen]
            self._aborts_seen += 1
            self._rewarding.pop(entry, None)
            for traj in self.members.pop(entry, ()):
                self._waste(traj)


class SimTrainer:
    """Takes a batch once the core announced it and the trainer is idle, trains it for the
    profile's train_s, then pushes the weights (busy for the transfer) and publishes them."""

    def __init__(self, cluster: Cluster, gpus: float):
        self.cluster = cluster
        self.gpus = gpus
        self.busy = False

    def maybe_start(self) -> None:
        cl = self.cluster
        core = cl.core
        if self.busy or cl.announced < core.version:
            return
        with cl.timer:
            batch = core.take_batch(core.version) if core.batch_ready(core.version) else None
        if batch is None:
            return
        self.busy = True
        tokens, response_tokens = cl.consumed(batch)
        cl.loop.after(cl.profile.train_s(tokens, self.gpus), self._trained, batch.version,
                      response_tokens, batch.staleness)

    def _trained(self, version: int, response_tokens: int, staleness: list[int]) -> None:
        # Recorded when the step completes, so the metrics cover exactly the trained steps.
        cl = self.cluster
        m = cl.metrics
        m.step_end.append(cl.loop.now)
        m.step_tokens.append(response_tokens)
        m.step_groups.append(len(staleness))
        m.staleness.update(staleness)
        cl.loop.after(cl.transfer_s, self._pushed, version + 1)

    def _pushed(self, version: int) -> None:
        self.cluster.published(version)
        self.busy = False
