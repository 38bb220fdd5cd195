"""The simulator's engine: instances, groups, the trainer and the weight transfers.

The engine is the mechanism every schedule shares; a schedule (`asyncrl/sim/schedules/`) is
the policy: when to admit a new group, which finished groups a training step consumes, when
instances pull weights and what happens to trajectories in flight. Costs come from the
profile, the workload from the config, and the i-th group gets the same prompt and response
lengths under every schedule, so schedules are compared on the same work.

One group = one prompt with N responses (an entry of the staleness protocol). Its
responses are routed together (one request with n = N, as engines serve GRPO groups) and
run in the slots of that instance; a migration may later move single ones.
"""

from __future__ import annotations

import time

import numpy as np

from asyncrl.coordinator.routing import Request
from asyncrl.coordinator.view import ClusterView
from asyncrl.sim.events import EventLoop
from asyncrl.sim.instance import ABORTED, DONE, HELD, QUEUED, RUNNING, SimInstance, Traj
from asyncrl.sim.metrics import CoordTimer, Metrics, Result
from asyncrl.sim.profile import Profile
from asyncrl.sim.workload import build_lengths

LIVE, GENERATED, SCORED, CONSUMED, DROPPED = range(5)
_POOL_BLOCK = 1024  # groups whose lengths are drawn at once


class Group:
    __slots__ = ("id", "trajs", "need", "done", "reserved", "min_start", "prio", "prompt",
                 "resp_tokens", "state")

    def __init__(self, gid: int, need: int, prompt: int, prio: int):
        self.id = gid
        self.trajs: list[Traj] = []
        self.need = need  # responses that must finish (N); more may be launched (N')
        self.done = 0
        self.reserved: int | None = None  # V_traj reserved with the StalenessManager
        self.min_start = 1 << 62  # oldest version any of its responses started on
        self.prio = prio  # queue order on an instance: oldest first
        self.prompt = prompt
        self.resp_tokens = 0
        self.state = LIVE

    @property
    def v_traj(self) -> int:
        return self.reserved if self.reserved is not None else self.min_start


class Engine:
    def __init__(self, config):
        c = config
        self.config = c
        self.profile = Profile.load(c.profile)
        self.loop = EventLoop()
        self.metrics = Metrics()
        self.timer = CoordTimer()
        n = c.num_instances
        self.slots = c.num_slots or self.profile.num_slots
        self.cv = ClusterView.empty(n, self.slots)
        self.n_free = n  # instances with running + queued < slots
        self.instances = [SimInstance(i, self) for i in range(n)]
        self.group_size = c.group_size
        self.batch_size = c.batch_size or max(1, round(c.groups_per_instance * n))
        self.train_gpus = c.train_gpus_per_instance * n
        self.reprefill = c.reprefill_on_resume
        self.transfer_s = self.profile.transfer_s()
        self.total_steps = c.warmup_steps + c.measure_steps
        self._prompts = build_lengths(c.prompt_lengths)
        self._responses = build_lengths(c.response_lengths)
        self._pool: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._next_gid = 0
        self._next_tid = 0
        self.groups: dict[int, Group] = {}  # live and scored, not yet consumed or dropped
        self.latest_version = 0  # newest weights instances can pull
        self.trainer_busy = False
        from asyncrl.sim.schedules import SCHEDULES  # schedules import the engine's names

        params = dict(c.schedules[c.schedule]) if c.schedule in c.schedules else {}
        self.schedule = SCHEDULES.build(c.schedule, engine=self, eta=c.eta, **params)
        self.launch = self.schedule.responses_per_group(self.group_size)

    # ---------------------------------------------------------------- running

    def run(self) -> Result:
        wall = time.perf_counter()
        self.schedule.start()
        self.loop.run(lambda: self.metrics.steps_done >= self.total_steps,
                      max_time=self.config.max_sim_time_s)
        c = self.config
        return Result.from_metrics(
            self.metrics, warmup=c.warmup_steps, schedule=c.schedule, instances=c.num_instances,
            eta=c.eta, seed=c.seed, batch_groups=self.batch_size, group_size=self.group_size,
            events=self.loop.processed, wall_s=time.perf_counter() - wall,
            coordinator_s=self.timer.total)

    @property
    def now(self) -> float:
        return self.loop.now

    # ---------------------------------------------------------------- groups

    def _lengths(self, gid: int) -> tuple[int, np.ndarray]:
        block, row = divmod(gid, _POOL_BLOCK)
        if block not in self._pool:
            # One generator per block, seeded by (seed, block): group g's lengths do not depend
            # on how many groups a schedule created before it, only on g.
            rng = np.random.default_rng([self.config.seed, block])
            prompts = self._prompts.sample(rng, _POOL_BLOCK)
            responses = self._responses.sample(rng, _POOL_BLOCK * self.launch)
            self._pool = {block: (prompts, responses.reshape(_POOL_BLOCK, self.launch))}
        prompts, responses = self._pool[block]
        return int(prompts[row]), responses[row]

    def new_group(self, prio: int) -> Group:
        gid = self._next_gid
        self._next_gid += 1
        prompt, targets = self._lengths(gid)
        g = Group(gid, self.group_size, prompt, prio)
        tid = self._next_tid
        g.trajs = [Traj(tid + k, g, prompt, t) for k, t in enumerate(targets.tolist())]
        self._next_tid += len(targets)
        self.groups[gid] = g
        return g

    def free_mask(self) -> np.ndarray:
        cv = self.cv
        return cv.running + cv.queued < cv.num_slots

    def place(self, group: Group, idx: int) -> None:
        """Queues the group's held responses on instance `idx` (they start as slots free)."""
        inst = self.instances[idx]
        for traj in group.trajs:
            if traj.state == HELD:
                inst.enqueue(traj, group.prio)
        inst.commit(self.now)

    def route(self, group: Group, router, mask: np.ndarray | None = None) -> int | None:
        """Routes a group with `router` among `mask` (default: instances with a free slot)."""
        if mask is None:
            mask = self.free_mask()
        held = sum(1 for t in group.trajs if t.state == HELD)
        with self.timer:
            idx = router.choose(self.cv, mask, Request(held, group.prompt))
        if idx is not None:
            self.place(group, idx)
        return idx

    def on_traj_done(self, traj: Traj, t: float) -> None:
        group = traj.group
        self.metrics.generated_tokens += traj.target
        if group.state != LIVE:
            self.metrics.wasted_tokens += traj.target
            return
        group.done += 1
        group.resp_tokens += traj.target
        if group.done == group.need:
            group.state = GENERATED
            if len(group.trajs) > group.need:  # redundant responses: drop the stragglers
                self._kill_trajs(group)
            self.loop.at(t + self.profile.reward_latency_s, self._scored, group)

    def _scored(self, group: Group) -> None:
        if group.state == GENERATED:
            group.state = SCORED
            self.schedule.on_group_scored(group)

    def on_slots_freed(self, inst: SimInstance) -> None:
        self.schedule.on_slots_freed(inst)

    def on_instance_synced(self, inst: SimInstance) -> None:
        self.schedule.on_instance_synced(inst)

    def _kill_trajs(self, group: Group) -> dict[int, SimInstance]:
        touched: dict[int, SimInstance] = {}  # a dict, not a set: deterministic order
        now = self.now
        for traj in group.trajs:
            if traj.state in (QUEUED, RUNNING):
                inst = traj.inst
                inst.remove(traj, now)
                touched[inst.idx] = inst
            if traj.state == HELD:
                self.metrics.generated_tokens += traj.gen
                self.metrics.wasted_tokens += traj.gen
                traj.state = ABORTED
        for inst in touched.values():
            inst.commit(now)
        return touched

    def drop(self, group: Group) -> None:
        """Gives a group up: its running responses stop, all its tokens are wasted."""
        if group.state in (CONSUMED, DROPPED):
            return
        self._kill_trajs(group)
        self.metrics.wasted_tokens += sum(t.target for t in group.trajs if t.state == DONE)
        group.state = DROPPED
        self.metrics.dropped_groups += 1
        self.groups.pop(group.id, None)

    def hold(self, traj: Traj) -> bool:
        """Takes a response off its instance, keeping its tokens (a partial rollout)."""
        if traj.state not in (QUEUED, RUNNING):
            return False
        inst = traj.inst
        ok = inst.remove(traj, self.now)
        inst.commit(self.now)
        return ok

    # ---------------------------------------------------------------- trainer

    def train(self, groups: list[Group], step: int, then) -> None:
        """Trains step `step` on `groups`; `then()` runs when the step's compute is done."""
        if self.trainer_busy:
            raise RuntimeError(f"step {step}: the trainer is already busy")
        self.trainer_busy = True
        tokens = 0
        resp = 0
        stale = []
        for g in groups:
            if g.reserved is not None and g.min_start < g.reserved:
                raise AssertionError(f"group {g.id}: a response started on version "
                                     f"{g.min_start} < its V_traj {g.reserved}")
            stale.append(step - g.v_traj)
            g.state = CONSUMED
            self.groups.pop(g.id, None)
            resp += g.resp_tokens
            tokens += g.resp_tokens + g.prompt * g.need
        self.loop.after(self.profile.train_s(tokens, self.train_gpus), self._trained,
                        resp, stale, then)

    def _trained(self, resp: int, stale: list[int], then) -> None:
        # Recorded when the step completes, so the metrics cover exactly the trained steps.
        self.trainer_busy = False
        m = self.metrics
        m.step_end.append(self.now)
        m.step_tokens.append(resp)
        m.step_groups.append(len(stale))
        m.staleness.update(stale)
        then()

    def push(self, version: int, then) -> None:
        """Trainer → parameter server; instances pull later, each on its own."""
        self.trainer_busy = True

        def pushed():
            self.trainer_busy = False
            self.latest_version = version
            then()

        self.loop.after(self.transfer_s, pushed)

    def broadcast(self, version: int, then, *, reprefill: bool | None = None) -> None:
        """Trainer → every instance at once (a collective): all of them pause to load."""
        self.trainer_busy = True
        self.latest_version = version
        reprefill = self.reprefill if reprefill is None else reprefill
        for inst in self.instances:
            inst.pull(self.now, version, self.transfer_s, reprefill)

        def sent():
            self.trainer_busy = False
            then()

        self.loop.after(self.transfer_s, sent)
