"""A simulated rollout instance: continuous batching under the step-latency model.

The instance keeps aggregate state only: `num_running` trajectories, `kv_tokens` in the cache, a
decode-step counter, and a heap of the step at which each running trajectory finishes. It
never simulates single tokens: between two events the batch is fixed, so the time of k
steps has a closed form (`LatencyModel.chunk_time`), and the next event of an instance is
the next finish. Anything else that touches the instance (a new request, an interruption, a
migration, a pull) first `settle`s it to the step boundary at or after now (the step in
progress completes with the old batch, as in a real engine), then changes the batch and
re-plans.

`clock` is the time the instance's state describes (≥ now after `settle`): it runs ahead of
now while the instance is stalled by prefill or a weight pull. Decoding resumes at `clock`.

It applies what the core asks, as a live `RolloutInstance` does: it starts queued work in its
free slots (oldest V_traj first) through the TrajectoryServer's `try_start`, reports finished
and interrupted trajectories through `report`, pulls weights between two decode steps (with
partial rollout off, only once its running trajectories have finished, starting nothing new
meanwhile). Its events go to the cluster, the `asyncrl.records.EventSink` a live instance
reports to as well; when its state changed it says so, and the cluster takes its `snapshot()`.

With a KV capacity (the profile's `instance.kv_capacity_tokens`) it behaves as vLLM's
scheduler with recompute preemption: a queued sequence starts only if its prompt and tokens
so far fit (with a 1% watermark); when the running batch would outgrow the cache, the
youngest sequence is evicted, keeps its tokens, and waits at the head of the queue to be
re-prefilled. The engine does this on its own: for the coordinator (and the server) an
evicted sequence is still running on this instance, and the snapshot counts it as queued.
"""

from __future__ import annotations

import collections
import heapq
import math

from asyncrl.coordinator.routing import PendingQueue
from asyncrl.records import InstanceState

# Where a simulated trajectory is (the server's lifecycle has more states, e.g. REWARDED).
# GONE: dropped, its tokens counted as wasted. PREEMPTED: evicted by the engine for KV space,
# started as far as the server knows, waiting on this instance to be re-prefilled.
HELD, QUEUED, RUNNING, DONE, GONE, PREEMPTED = range(6)
_WATERMARK = 0.01  # vLLM keeps 1% of the KV blocks free when it admits a sequence
NO_TOKENS = ()  # a simulated report carries none: tokens are counted, not simulated


class Traj:
    """One response. `gen` counts tokens generated before the current run segment."""

    __slots__ = ("id", "entry", "prompt", "target", "reward", "v_traj", "gen", "inst",
                 "base_step", "finish_step", "state")

    def __init__(self, tid: int, entry: int, prompt: int, target: int, reward: float,
                 v_traj: int):
        self.id = tid
        self.entry = entry
        self.prompt = prompt
        self.target = target  # its full length: it finishes after `target` tokens
        self.reward = reward
        self.v_traj = v_traj  # its entry's; no token of it may come from older weights
        self.gen = 0
        self.inst = None
        self.base_step = 0
        self.finish_step = 0
        self.state = HELD

    def tokens(self) -> int:
        """Tokens generated so far."""
        if self.state == RUNNING:
            return self.gen + self.inst.steps - self.base_step
        return self.gen


class SimInstance:
    def __init__(self, idx: int, cluster):
        self.idx = idx
        self.cluster = cluster
        self.loop = cluster.loop
        self.metrics = cluster.metrics
        self.server = cluster.server
        self.model = cluster.profile.latency
        self.prefill_s = cluster.profile.latency.prefill_s_per_token
        self.slots = cluster.slots
        self.kv_cap = cluster.profile.kv_capacity_tokens or math.inf
        self.kv_admit = self.kv_cap * (1.0 - _WATERMARK)
        self.kv_report = int(cluster.profile.kv_capacity_tokens)  # 0: not limited
        self.front: collections.deque[Traj] = collections.deque()  # served first: evicted work
        self.partial_rollout = cluster.partial_rollout
        self.version = 0
        self.syncing = False  # a pull is asked for, waiting (no partial rollout) or running
        self.waiting_pull = False  # no partial rollout: the pull waits for running work
        self.loading = False  # weights are being transferred
        self.clock = 0.0
        self.steps = 0
        self.num_running = 0
        self.kv_tokens = 0.0
        self.num_queued = 0
        self.heap: list[tuple[int, int, Traj]] = []
        self.running: dict[int, Traj] = {}
        self.queue = PendingQueue()  # oldest V_traj first; stale entries skipped on pop
        # Work routed here while nothing waits and slots are free skips the priority queue
        # (the common case; the order is the same).
        self.direct: list[Traj] = []
        self.plan = 0
        self.planned = 0
        self.pull_id = 0
        self._pushes = 0  # heap tie-breaker: a re-admitted response may repeat a finish step

    # ---------------------------------------------------------------- time

    def settle(self, now: float) -> None:
        """Advances the state to the first step boundary at or after `now`."""
        if self.clock >= now:
            return
        if self.num_running == 0:
            self.clock = now
            return
        elapsed = now - self.clock
        j = min(self.model.steps_within(self.num_running, self.kv_tokens, elapsed), self.planned)
        if j < self.planned and self.model.chunk_time(self.num_running, self.kv_tokens, j) < elapsed:
            j += 1  # the step in progress completes with the batch it started with
        if j:
            self._advance(j)  # the caller commits: freed slots are refilled there

    def _advance(self, j: int) -> None:
        """Runs j decode steps of the current batch, finishing the trajectories due."""
        n = self.num_running
        self.clock += self.model.chunk_time(n, self.kv_tokens, j)
        steps = self.steps = self.steps + j
        self.kv_tokens += n * j
        self.planned -= j
        heap = self.heap
        if not heap or heap[0][0] > steps:
            return
        finished = []
        running = self.running
        pop = heapq.heappop
        while heap and heap[0][0] <= steps:
            fs, _, traj = pop(heap)
            if traj.state != RUNNING or traj.inst is not self or traj.finish_step != fs:
                continue  # left this instance earlier (lazy deletion)
            traj.state = DONE
            traj.gen = traj.target
            traj.inst = None
            del running[traj.id]
            self.kv_tokens -= traj.prompt + traj.target
            finished.append(traj)
        self.num_running -= len(finished)
        ids = []
        report = self.server.report
        for traj in finished:
            self.metrics.generated_tokens += traj.target
            # False: its entry was aborted meanwhile (a Drop is on its way).
            if report(traj.id, NO_TOKENS, NO_TOKENS, NO_TOKENS, NO_TOKENS, "length"):
                ids.append(traj.id)
        self.cluster.finished(self.idx, ids)

    def _on_chunk_end(self, plan: int) -> None:
        if plan != self.plan:
            return  # re-planned since
        self._advance(self.planned)
        self.commit(self.loop.now)

    def replan(self) -> None:
        self.plan += 1
        heap = self.heap
        while heap and (heap[0][2].state != RUNNING or heap[0][2].inst is not self
                        or heap[0][2].finish_step != heap[0][0]):
            heapq.heappop(heap)
        if self.num_running == 0:
            self.planned = 0
            return
        if self.kv_tokens + self.num_running > self.kv_cap:
            self._preempt()
            if self.num_running == 0:
                self.planned = 0
                return
        self.planned = heap[0][0] - self.steps
        if self.kv_cap < math.inf:  # the chunk ends where the cache would overflow
            self.planned = min(self.planned, max(1, int((self.kv_cap - self.kv_tokens) // self.num_running)))
        end = self.clock + self.model.chunk_time(self.num_running, self.kv_tokens, self.planned)
        self.loop.at(end, self._on_chunk_end, self.plan)

    def _preempt(self) -> None:
        """Evicts the youngest running sequences until one more step fits (a lone sequence
        larger than the cache runs on: it would otherwise never finish)."""
        running, front = self.running, self.front
        while self.num_running > 1 and self.kv_tokens + self.num_running > self.kv_cap:
            _, traj = running.popitem()  # the last started: vLLM's lowest priority
            traj.gen += self.steps - traj.base_step
            traj.state = PREEMPTED
            self.num_running -= 1
            self.num_queued += 1
            self.kv_tokens -= traj.prompt + traj.gen
            front.appendleft(traj)
            self.metrics.preemptions += 1
        heap = self.heap
        while heap and (heap[0][2].state != RUNNING or heap[0][2].inst is not self
                        or heap[0][2].finish_step != heap[0][0]):
            heapq.heappop(heap)

    # ---------------------------------------------------------------- work

    def enqueue(self, traj: Traj) -> None:
        """Routes a trajectory here; it waits for a slot (call `commit` after a batch)."""
        traj.state = QUEUED
        traj.inst = self
        if self.num_queued == len(self.direct) and self.num_running + self.num_queued < self.slots:
            self.direct.append(traj)
        else:
            self.queue.push(traj, traj.v_traj)
        self.num_queued += 1

    def _fill(self, now: float) -> None:
        """Moves queued work into free slots, oldest V_traj first, and charges its prefill."""
        if self.num_queued == 0 or self.num_running >= self.slots or self.waiting_pull:
            return
        self.settle(now)
        prefill = 0
        resumed = 0
        prompts_prefilled = set()  # entries: a group's members starting together share one
        version = self.version
        direct, self.direct = self.direct, []
        queue = self.queue
        heap = self.heap
        running = self.running
        front = self.front
        try_start = self.server.try_start
        v_traj_of = self.server.v_traj
        while self.num_running < self.slots and self.num_queued:
            traj = front.popleft() if front else direct.pop() if direct else queue.pop()
            if traj.inst is not self or traj.state not in (QUEUED, PREEMPTED):
                continue
            if self.num_running and self.kv_tokens + traj.prompt + traj.gen + self.num_running + 1 > self.kv_admit:
                front.appendleft(traj)  # first come first served: nothing overtakes it
                break
            self.num_queued -= 1
            if traj.state == PREEMPTED:
                pass  # started before: the server has it running here
            elif not try_start(traj.id, self.steps):
                # Aborted or re-routed since it was queued (a live instance skips it too).
                traj.state, traj.inst = HELD, None
                continue
            if version < traj.v_traj or version < v_traj_of(traj.entry):
                # The server's V_traj, late binding may have moved it forward since dispatch.
                raise AssertionError(f"trajectory {traj.id} (V_traj {v_traj_of(traj.entry)}) "
                                     f"started on instance {self.idx} holding older weights "
                                     f"{version}")
            traj.state = RUNNING
            traj.base_step = self.steps
            traj.finish_step = self.steps + traj.target - traj.gen
            running[traj.id] = traj
            self._pushes += 1
            heapq.heappush(heap, (traj.finish_step, self._pushes, traj))
            self.num_running += 1
            tokens = traj.prompt + traj.gen
            self.kv_tokens += tokens
            if traj.gen:  # a resume prefills its own prompt and tokens so far
                prefill += tokens
            elif traj.entry not in prompts_prefilled:
                # The engine prefills a group's prompt once and fans it out to the members it
                # starts with it (asyncrl/rollout/slots.py: Slots.start).
                prompts_prefilled.add(traj.entry)
                prefill += traj.prompt
            resumed += traj.gen
        for traj in direct:  # cannot happen (direct work fits by construction); kept safe
            if traj.state == QUEUED and traj.inst is self:
                queue.push(traj, traj.v_traj)
        self.clock = max(self.clock, now) + self.prefill_s * prefill
        self.metrics.reprefill_tokens += resumed

    def remove(self, traj: Traj, now: float) -> bool:
        """Takes a queued or running trajectory off this instance, keeping its tokens.

        Returns False if it finished meanwhile (settling can complete its last step).
        Call `commit` after a batch of removals.
        """
        if traj.state == RUNNING:
            self.settle(now)
            if traj.state != RUNNING:
                return False
            traj.gen = self.steps - traj.base_step + traj.gen
            del self.running[traj.id]
            self.num_running -= 1
            self.kv_tokens -= traj.prompt + traj.gen
        elif traj.state == QUEUED:
            self.num_queued -= 1
        elif traj.state == PREEMPTED:
            self.num_queued -= 1
            self.front.remove(traj)
        else:
            return False
        traj.state = HELD
        traj.inst = None
        return True

    # ---------------------------------------------------------------- weights

    def request_pull(self, now: float) -> None:
        """The core asked this instance to sync: pull the newest weights between two decode
        steps, or (partial rollout off) once the running trajectories have finished. The
        caller commits."""
        self.syncing = True
        if self.partial_rollout:
            self._pull(now)
        else:
            self.waiting_pull = True

    def _pull(self, now: float) -> None:
        """Loads the newest weights: decoding stops for the transfer, then running trajectories
        are re-prefilled (their KV came from the old weights) and resume where they were. The
        weights are in place once transferred: the re-prefill is part of resuming."""
        self.waiting_pull = False
        self.settle(now)
        cluster = self.cluster
        version = cluster.latest_version
        if version <= self.version:  # nothing newer: done, or done when the transfer is
            if not self.loading:
                self.syncing = False
                cluster.synced(self.idx, self.version)
            return
        self.version = version
        self.loading = True
        start = max(self.clock, now)
        loaded = start + cluster.transfer_s
        stall = cluster.transfer_s
        if cluster.reprefill and self.num_running:
            stall += self.prefill_s * self.kv_tokens
            self.metrics.reprefill_tokens += self.kv_tokens
        self.clock = start + stall
        self.pull_id += 1
        self.metrics.pulls += 1
        self.loop.at(loaded, self._pull_done, self.pull_id)

    def _pull_done(self, pull_id: int) -> None:
        if pull_id != self.pull_id:
            return  # a later pull extended the stall; its own event ends it
        self.syncing = self.loading = False
        self.cluster.changed(self)
        self.cluster.synced(self.idx, self.version)

    def commit(self, now: float) -> None:
        """After routing, removals or a sync request: start a pull that waited for running
        work to finish, fill free slots, re-plan, and tell the cluster the state changed."""
        if self.waiting_pull:
            self.settle(now)
            if self.num_running == 0:
                self._pull(now)
        if self.num_queued and self.num_running < self.slots:
            self._fill(now)
        self.replan()
        self.cluster.changed(self)

    def snapshot(self) -> InstanceState:
        return InstanceState(instance=self.idx, version=self.version, running=self.num_running,
                             queued=self.num_queued, kv_tokens=self.kv_tokens,
                             num_slots=self.slots, syncing=self.syncing, decode_steps=self.steps,
                             kv_capacity=self.kv_report)

    @property
    def load(self) -> int:
        return self.num_running + self.num_queued
