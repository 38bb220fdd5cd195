"""A simulated rollout instance: continuous batching under the step-latency model.

The instance keeps aggregate state only: `n` running trajectories, `kv` KV-cache tokens, a
decode-step counter, and a heap of the step at which each running trajectory finishes. It
never simulates single tokens: between two events the batch is fixed, so the time of k
steps has a closed form (`LatencyModel.chunk_time`), and the next event of an instance is
the next finish. Anything else that touches the instance (a new request, an interruption, a
migration) first `settle`s it to the step boundary at or after now (the step in progress
completes with the old batch, as in a real engine), then changes the batch and re-plans.

`clock` is the time the instance's state describes (≥ now after `settle`): it runs ahead of
now while the instance is stalled by prefill or a weight pull. Decoding resumes at `clock`.
"""

from __future__ import annotations

import heapq

from asyncrl.coordinator.routing import PendingQueue

# Trajectory states in the simulator (the live system's lifecycle has more, e.g. REWARDED).
HELD, QUEUED, RUNNING, DONE, ABORTED = range(5)


class Traj:
    """One response. `gen` counts tokens generated before the current run segment."""

    __slots__ = ("id", "group", "prompt", "target", "gen", "inst", "base_step", "finish_step",
                 "state")

    def __init__(self, tid: int, group, prompt: int, target: int):
        self.id = tid
        self.group = group
        self.prompt = prompt
        self.target = target  # its full length: it finishes after `target` tokens
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
    def __init__(self, idx: int, engine):
        self.idx = idx
        self.engine = engine
        self.model = engine.profile.latency
        self.prefill_s = engine.profile.latency.prefill_s_per_token
        self.slots = engine.slots
        self.version = 0
        self.syncing = False
        self.clock = 0.0
        self.steps = 0
        self.n = 0
        self.kv = 0.0
        self.nq = 0
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
        self._was_free = True

    # ---------------------------------------------------------------- time

    def settle(self, now: float) -> None:
        """Advances the state to the first step boundary at or after `now`."""
        if self.clock >= now:
            return
        if self.n == 0:
            self.clock = now
            return
        elapsed = now - self.clock
        j = min(self.model.steps_within(self.n, self.kv, elapsed), self.planned)
        if j < self.planned and self.model.chunk_time(self.n, self.kv, j) < elapsed:
            j += 1  # the step in progress completes with the batch it started with
        if j and self._advance(j):
            # Slots freed mid-operation: refill them and tell the schedule after the current
            # event, so no dispatch loop is re-entered.
            self.engine.loop.at(now, self._freed)

    def _advance(self, j: int) -> bool:
        """Runs j decode steps of the current batch; returns whether any trajectory finished."""
        n = self.n
        self.clock += self.model.chunk_time(n, self.kv, j)
        steps = self.steps = self.steps + j
        self.kv += n * j
        self.planned -= j
        heap = self.heap
        if not heap or heap[0][0] > steps:
            return False
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
            self.kv -= traj.prompt + traj.target
            finished.append(traj)
        self.n -= len(finished)
        done = self.engine.on_traj_done
        clock = self.clock
        for traj in finished:
            done(traj, clock)
        return bool(finished)

    def _freed(self) -> None:
        self.commit(self.engine.loop.now)
        self.engine.on_slots_freed(self)

    def _on_chunk_end(self, plan: int) -> None:
        if plan != self.plan:
            return  # re-planned since
        self._advance(self.planned)
        self.commit(self.engine.loop.now)
        self.engine.on_slots_freed(self)

    def replan(self) -> None:
        self.plan += 1
        heap = self.heap
        while heap and (heap[0][2].state != RUNNING or heap[0][2].inst is not self
                        or heap[0][2].finish_step != heap[0][0]):
            heapq.heappop(heap)
        if self.n == 0:
            self.planned = 0
            return
        self.planned = heap[0][0] - self.steps
        end = self.clock + self.model.chunk_time(self.n, self.kv, self.planned)
        self.engine.loop.at(end, self._on_chunk_end, self.plan)

    # ---------------------------------------------------------------- work

    def enqueue(self, traj: Traj, priority: int) -> None:
        """Routes a trajectory here; it waits for a slot (call `commit` after a batch)."""
        traj.state = QUEUED
        traj.inst = self
        if self.nq == len(self.direct) and self.n + self.nq < self.slots:
            self.direct.append(traj)
        else:
            self.queue.push(traj, priority)
        self.nq += 1

    def _fill(self, now: float) -> None:
        """Moves queued work into free slots, oldest V_traj first, and charges its prefill."""
        if self.nq == 0 or self.n >= self.slots:
            return
        self.settle(now)
        prefill = 0
        resumed = 0
        version = self.version
        direct, self.direct = self.direct, []
        queue = self.queue
        heap = self.heap
        running = self.running
        while self.n < self.slots and self.nq:
            traj = direct.pop() if direct else queue.pop()
            if traj.state != QUEUED or traj.inst is not self:
                continue
            self.nq -= 1
            traj.state = RUNNING
            traj.base_step = self.steps
            traj.finish_step = self.steps + traj.target - traj.gen
            running[traj.id] = traj
            self._pushes += 1
            heapq.heappush(heap, (traj.finish_step, self._pushes, traj))
            self.n += 1
            tokens = traj.prompt + traj.gen
            self.kv += tokens
            prefill += tokens
            resumed += traj.gen
            group = traj.group
            if version < group.min_start:
                group.min_start = version
        for traj in direct:  # cannot happen (direct work fits by construction); kept safe
            if traj.state == QUEUED and traj.inst is self:
                queue.push(traj, traj.group.prio)
        self.clock = max(self.clock, now) + self.prefill_s * prefill
        self.engine.metrics.reprefill_tokens += resumed

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
            self.n -= 1
            self.kv -= traj.prompt + traj.gen
        elif traj.state == QUEUED:
            self.nq -= 1
        else:
            return False
        traj.state = HELD
        traj.inst = None
        return True

    def pull(self, now: float, version: int, transfer_s: float, reprefill: bool) -> None:
        """Loads weights `version`: decoding stops for the transfer, then running trajectories
        are re-prefilled (their KV came from the old weights) and resume where they were."""
        self.settle(now)
        self.version = version
        stall = transfer_s
        if reprefill and self.n:
            stall += self.prefill_s * self.kv
            self.engine.metrics.reprefill_tokens += self.kv
        self.clock = max(self.clock, now) + stall
        self.syncing = True
        self.pull_id += 1
        self.engine.metrics.pulls += 1
        self.engine.loop.at(self.clock, self._pull_done, self.pull_id)
        # Settling may have finished the last running responses: queued work takes their
        # slots now, and starts (prefilled with the new weights) once the pull is done.
        self.commit(now)

    def _pull_done(self, pull_id: int) -> None:
        if pull_id != self.pull_id:
            return  # a later pull extended the stall; its own event ends it
        self.syncing = False
        self.publish()
        self.engine.on_instance_synced(self)

    def commit(self, now: float) -> None:
        """After routing or removals: fill free slots, re-plan, publish the new view."""
        self._fill(now)
        self.replan()
        self.publish()

    def publish(self) -> None:
        """Writes this instance's state into the shared ClusterView the policies read."""
        cv = self.engine.cv
        i = self.idx
        cv.running[i] = self.n
        cv.queued[i] = self.nq
        cv.kv_tokens[i] = self.kv
        cv.version[i] = self.version
        cv.syncing[i] = self.syncing
        free = self.n + self.nq < self.slots
        if free != self._was_free:
            self.engine.n_free += 1 if free else -1
            self._was_free = free

    @property
    def load(self) -> int:
        return self.n + self.nq
