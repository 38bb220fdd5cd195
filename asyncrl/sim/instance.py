"""A simulated rollout instance: continuous batching under the step-latency model.

The instance keeps aggregate state only: `n` running trajectories, `kv` KV-cache tokens, a
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
meanwhile), and tells the cluster whenever its state changed, which becomes an InstanceState.
"""

from __future__ import annotations

import heapq

from asyncrl.coordinator.routing import PendingQueue

# Where a simulated trajectory is (the server's lifecycle has more states, e.g. REWARDED).
HELD, QUEUED, RUNNING, DONE, GONE = range(5)  # GONE: dropped, its tokens counted as wasted


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
        self.partial_rollout = cluster.partial_rollout
        self.version = 0
        self.syncing = False  # a pull is asked for, waiting (no partial rollout) or running
        self.waiting_pull = False  # no partial rollout: the pull waits for running work
        self.loading = False  # weights are being transferred
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
        if j:
            self._advance(j)  # the caller commits: freed slots are refilled there

    def _advance(self, j: int) -> None:
        """Runs j decode steps of the current batch, finishing the trajectories due."""
        n = self.n
        self.clock += self.model.chunk_time(n, self.kv, j)
        steps = self.steps = self.steps + j
        self.kv += n * j
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
            self.kv -= traj.prompt + traj.target
            finished.append(traj)
        self.n -= len(finished)
        self.cluster.finished(self, finished)

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
        if self.n == 0:
            self.planned = 0
            return
        self.planned = heap[0][0] - self.steps
        end = self.clock + self.model.chunk_time(self.n, self.kv, self.planned)
        self.loop.at(end, self._on_chunk_end, self.plan)

    # ---------------------------------------------------------------- work

    def enqueue(self, traj: Traj) -> None:
        """Routes a trajectory here; it waits for a slot (call `commit` after a batch)."""
        traj.state = QUEUED
        traj.inst = self
        if self.nq == len(self.direct) and self.n + self.nq < self.slots:
            self.direct.append(traj)
        else:
            self.queue.push(traj, traj.v_traj)
        self.nq += 1

    def _fill(self, now: float) -> None:
        """Moves queued work into free slots, oldest V_traj first, and charges its prefill."""
        if self.nq == 0 or self.n >= self.slots or self.waiting_pull:
            return
        self.settle(now)
        prefill = 0
        resumed = 0
        version = self.version
        direct, self.direct = self.direct, []
        queue = self.queue
        heap = self.heap
        running = self.running
        try_start = self.server.try_start
        while self.n < self.slots and self.nq:
            traj = direct.pop() if direct else queue.pop()
            if traj.state != QUEUED or traj.inst is not self:
                continue
            self.nq -= 1
            if not try_start(traj.id, self.steps):
                # Aborted or re-routed since it was queued (a live instance skips it too).
                traj.state, traj.inst = HELD, None
                continue
            if version < traj.v_traj:
                raise AssertionError(f"trajectory {traj.id} (V_traj {traj.v_traj}) started on "
                                     f"instance {self.idx} holding older weights {version}")
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
            self.n -= 1
            self.kv -= traj.prompt + traj.gen
        elif traj.state == QUEUED:
            self.nq -= 1
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
                cluster.synced(self, self.version)
            return
        self.version = version
        self.loading = True
        start = max(self.clock, now)
        loaded = start + cluster.transfer_s
        stall = cluster.transfer_s
        if cluster.reprefill and self.n:
            stall += self.prefill_s * self.kv
            self.metrics.reprefill_tokens += self.kv
        self.clock = start + stall
        self.pull_id += 1
        self.metrics.pulls += 1
        self.loop.at(loaded, self._pull_done, self.pull_id)

    def _pull_done(self, pull_id: int) -> None:
        if pull_id != self.pull_id:
            return  # a later pull extended the stall; its own event ends it
        self.syncing = self.loading = False
        self.cluster.changed(self)
        self.cluster.synced(self, self.version)

    def commit(self, now: float) -> None:
        """After routing, removals or a sync request: start a pull that waited for running
        work to finish, fill free slots, re-plan, and tell the cluster the state changed."""
        if self.waiting_pull:
            self.settle(now)
            if self.n == 0:
                self._pull(now)
        if self.nq and self.n < self.slots:
            self._fill(now)
        self.replan()
        self.cluster._changed[self.idx] = self

    @property
    def load(self) -> int:
        return self.n + self.nq
