"""StaleFlow (arXiv 2601.12784): a per-trajectory staleness bound, and every tool it allows.

  * admission = the staleness protocol: a new group is dispatched only to an instance whose
    version v still has a reservable slot (`StalenessManager.can_reserve(v)`); it reserves
    at V_traj = v (worst case), occupies the lowest buffer it may when scored, and the
    trainer consumes buffer `version` as soon as it is READY. Consumed staleness ≤ η, always;
  * per-instance weight sync: the trainer pushes to the parameter server and goes on; each
    instance pulls when its sync policy says so (`asyncrl.coordinator.sync`), no barrier;
  * partial rollout: a pull interrupts the instance's responses in flight, which keep their
    tokens and resume on the new weights (re-prefilled; V_traj stays the oldest version);
  * routing by the coordinator's router (throughput_optimal by default), oldest V_traj first
    on each instance's queue;
  * migration (`asyncrl.coordinator.migration`), checked every `migration_interval_s`;
  * redundancy (`asyncrl.coordinator.redundancy`), off by default.

Everything above is the real code: `asyncrl.staleness.StalenessManager` and the coordinator's
policy objects. The schedule only wires them to the simulated instances, and times every
call into them (`engine.timer`): that is the coordinator's cost per training step.
"""

from __future__ import annotations

import numpy as np

from asyncrl.coordinator.migration import Candidate, build_migration_policy, pick_trajectories
from asyncrl.coordinator.redundancy import build_redundancy
from asyncrl.coordinator.routing import Request, eligible_new
from asyncrl.coordinator.sync import SyncContext, build_sync_policy
from asyncrl.coordinator.view import InstanceView
from asyncrl.sim.instance import QUEUED, RUNNING
from asyncrl.sim.schedules.base import SCHEDULES, Schedule
from asyncrl.staleness import BufferStatus, StalenessManager


@SCHEDULES.register("staleflow")
class StaleFlow(Schedule):
    def __init__(self, engine, eta, router="throughput_optimal", sync="when_idle",
                 sync_params=None, migration="balance", migration_params=None,
                 migration_interval_s=5.0, redundancy="none", redundancy_params=None):
        super().__init__(engine, eta, router)
        # Each *_params maps a policy name to its keyword arguments; a policy without an
        # entry gets its defaults, so switching policies needs no other config change.
        self.redundancy = build_redundancy(redundancy, **_params(redundancy_params, redundancy))
        b = engine.batch_size
        self.sm = StalenessManager(eta, b, self.redundancy.redundant_batch_size(b))
        self.sync = build_sync_policy(sync, **_params(sync_params, sync))
        self.migration = build_migration_policy(migration, **_params(migration_params, migration))
        self.migrate_every = migration_interval_s if migration != "none" else 0.0
        self.ok: frozenset[int] = frozenset()  # instance versions a new entry may land at

    def responses_per_group(self, group_size):
        return self.redundancy.responses_to_launch(group_size)

    def start(self):
        self._refresh()
        self._dispatch()
        if self.migrate_every > 0:
            self.engine.loop.after(self.migrate_every, self._migrate_tick)

    # ---------------------------------------------------------------- staleness protocol

    def _refresh(self):
        """Re-reads which versions can reserve, and drops what the manager aborted."""
        engine = self.engine
        with engine.timer:
            sm = self.sm
            top = min(sm.version, engine.latest_version)
            self.ok = frozenset(v for v in range(sm.min_dispatch_version, top + 1)
                                if sm.can_reserve(v))
            aborted = sm.take_aborted()
        for gid in aborted:  # the abort rule, or redundancy's surplus
            group = engine.groups.get(gid)
            if group is not None:
                engine.drop(group)

    def _can_reserve(self, v: int) -> bool:
        return v in self.ok  # `ok` is re-read from the manager after every change

    def _dispatch(self):
        engine = self.engine
        while engine.n_free > 0 and self.ok:
            with engine.timer:
                mask = eligible_new(engine.cv, self._can_reserve)
            if not mask.any():
                return
            group = engine.new_group(prio=0)
            with engine.timer:
                idx = self.router.choose(engine.cv, mask, Request(len(group.trajs), group.prompt))
                v_traj = int(engine.cv.version[idx])
                self.sm.reserve(group.id, v_traj)
            group.reserved = group.prio = v_traj
            engine.place(group, idx)
            self._refresh()

    def on_group_scored(self, group):
        with self.engine.timer:
            self.sm.occupy(group.id)
        self._refresh()
        self._try_train()
        self._dispatch()

    def _try_train(self):
        engine = self.engine
        if engine.trainer_busy:
            return
        with engine.timer:
            step = self.sm.version
            if self.sm.status(step) is not BufferStatus.READY:
                return
            ids = self.sm.consume()
        self._refresh()
        engine.train([engine.groups[i] for i in ids], step,
                     then=lambda: engine.push(step + 1, then=self._published))

    def _published(self):
        for inst in self.engine.instances:
            self._maybe_sync(inst)
        self._refresh()
        self._try_train()
        self._dispatch()

    # ---------------------------------------------------------------- instances

    def _maybe_sync(self, inst):
        engine = self.engine
        if engine.latest_version <= inst.version or inst.syncing:
            return
        with engine.timer:
            view = InstanceView(inst.idx, inst.version, inst.n, inst.nq, int(inst.kv),
                                inst.slots, inst.syncing)
            go = self.sync.should_sync(view, SyncContext(engine.latest_version,
                                                         inst.version in self.ok))
        if go:
            inst.pull(engine.now, engine.latest_version, engine.transfer_s, engine.reprefill)

    def on_slots_freed(self, inst):
        self._maybe_sync(inst)
        if inst.version in self.ok and inst.n + inst.nq < inst.slots:
            self._dispatch()

    def on_instance_synced(self, inst):
        self._refresh()
        self._dispatch()

    # ---------------------------------------------------------------- migration

    def _migrate_tick(self):
        engine = self.engine
        with engine.timer:
            can = np.isin(engine.cv.version, list(self.ok))
            moves = self.migration.plan(engine.cv, can)
        for move in moves:
            self._move(engine.instances[move.src], engine.instances[move.dst], move.count)
        if moves:
            self._dispatch()
        engine.loop.after(self.migrate_every, self._migrate_tick)

    def _move(self, src, dst, count):
        engine = self.engine
        now = engine.now
        src.settle(now)
        trajs = {t.id: t for t in src.running.values()}
        queued = [t for t in src.queue if t.state == QUEUED and t.inst is src]
        trajs.update((t.id, t) for t in queued)
        cands = [Candidate(t.id, t.prompt + t.tokens(), t.state == QUEUED) for t in trajs.values()]
        with engine.timer:
            picked = pick_trajectories(cands, count)
        for cand in picked:
            traj = trajs[cand.traj_id]
            if traj.state not in (QUEUED, RUNNING) or not src.remove(traj, now):
                continue
            if traj.group.v_traj > dst.version:
                raise AssertionError(f"migration would break staleness: V_traj "
                                     f"{traj.group.v_traj} > target version {dst.version}")
            dst.enqueue(traj, traj.group.prio)
            engine.metrics.migrated += 1
        src.commit(now)
        dst.commit(now)


def _params(table, name: str) -> dict:
    table = dict(table or {})
    return dict(table[name]) if name in table else {}
