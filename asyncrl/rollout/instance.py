"""RolloutInstance: one engine on one rollout mesh, driven by its own thread.

The thread loops: apply the coordinator's commands (pull newer weights, drop aborted work,
hand trajectories over for migration), fill free slots from its queue, run one decode step,
and hand finished trajectories to the TrajectoryServer. New weights are swapped in between
two decode steps without draining the slots (partial rollout: tokens so far are kept and the
rest come from the new version, each token tagged with its version).

Talking to the coordinator goes both ways through thread-safe structures: `submit` and the
`request_*` methods queue work and commands; events (finished, extracted, synced, failed) go
out through the `on_event` callback, which must be cheap and thread-safe (a queue put).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable


from asyncrl.rollout.engine import Engine
from asyncrl.rollout.messages import Event, InstanceFailed, Snapshot, Trajectory, Work
from asyncrl.servers.parameters import ParameterServer
from asyncrl.servers.trajectory import TrajectoryServer

log = logging.getLogger(__name__)


class RolloutInstance:
    def __init__(self, instance_id: int, engine: Engine, parameter_server: ParameterServer,
                 shardings: Any, trajectory_server: TrajectoryServer,
                 on_event: Callable[[Event], None]):
        self.id = instance_id
        self.engine = engine
        self._parameters = parameter_server
        self._shardings = shardings
        self._trajectories = trajectory_server
        self._on_event = on_event
        self._params = None
        self._version = -1
        self._queue: collections.deque[Work] = collections.deque()
        self._commands: collections.deque[tuple] = collections.deque()
        self._entry_of: dict[int, int] = {}  # trajectory id -> entry id, for slots and queue
        self._reported: dict[int, int] = {}  # trajectory id -> tokens already in the server
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._syncing = False
        self._alive = True
        self._busy_s = 0.0
        self._idle_s = 0.0
        self._snapshot = Snapshot(-1, 0, 0, 0, engine.num_slots, False, True, 0.0, 0.0)
        self._thread = threading.Thread(target=self._run, name=f"rollout-{instance_id}", daemon=True)

    # ---------------------------------------------------------------- coordinator side

    def start(self) -> None:
        """Pulls the newest weights, then starts the thread."""
        self._pull()
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def version(self) -> int:
        """The version new work would be generated with (the weights applied now)."""
        return self._version

    def snapshot(self) -> Snapshot:
        with self._lock:
            return self._snapshot

    def rebind(self, trajectory_server: TrajectoryServer) -> None:
        """Reports to a restored TrajectoryServer (before `start`)."""
        self._trajectories = trajectory_server

    def submit(self, work: Work) -> None:
        with self._lock:
            if not self._alive:
                raise InstanceFailed(f"rollout instance {self.id} has failed; route elsewhere")
            self._queue.append(work)
            for t in work.trajectories:
                self._entry_of[t.trajectory_id] = work.entry_id
            self._refresh_snapshot()
        self._wake.set()

    def request_sync(self) -> None:
        self._command("sync")

    def request_drop(self, trajectory_ids: set[int]) -> None:
        """Forgets these trajectories (their entry was aborted), queued or running."""
        self._command("drop", frozenset(trajectory_ids))

    def request_extract(self, count: int) -> None:
        """Hands `count` trajectories back (queued first, then the cheapest to re-prefill)."""
        self._command("extract", count)

    def _command(self, *command) -> None:
        with self._lock:
            self._commands.append(command)
            if command[0] == "sync":
                self._syncing = True
                self._refresh_snapshot()
        self._wake.set()

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        try:
            state = self.engine.init_decode_state()
            while not self._stop.is_set():
                self._apply_commands()
                state = self._fill_slots(state)
                if len(self.engine.free_slots()) < self.engine.num_slots:
                    start = time.perf_counter()
                    state, _ = self.engine.generate(self._params, state, version=self._version)
                    self._report_finished()
                    self._busy_s += time.perf_counter() - start
                else:
                    start = time.perf_counter()
                    self._wake.wait(timeout=0.05)
                    self._wake.clear()
                    self._idle_s += time.perf_counter() - start
                with self._lock:
                    self._refresh_snapshot()
        except BaseException as error:  # the coordinator re-routes this instance's work
            log.exception("rollout instance %d failed", self.id)
            with self._lock:
                self._alive = False
                held = [t.trajectory_id for w in self._queue for t in w.trajectories]
                self._queue.clear()
                self._refresh_snapshot()
            held += [r.trajectory_id for r in self.engine.slot_records() if r is not None]
            self._on_event(Event("failed", self.id, lost_ids=tuple(held), error=error))

    def _apply_commands(self) -> None:
        while True:
            with self._lock:
                if not self._commands:
                    return
                command = self._commands.popleft()
            if command[0] == "sync":
                self._pull()
                with self._lock:
                    self._syncing = False
                self._on_event(Event("synced", self.id, version=self._version))
            elif command[0] == "drop":
                self._drop(command[1])
            elif command[0] == "extract":
                self._extract(command[1])

    def _pull(self) -> None:
        pulled = self._parameters.pull(self.id, self._shardings, newer_than=self._version)
        if pulled is not None:
            self._version, self._params = pulled

    def _fill_slots(self, state):
        while True:
            free = self.engine.free_slots()
            with self._lock:
                if not self._queue or len(self._queue[0].trajectories) > len(free):
                    return state
                work = self._queue.popleft()
            live = [t for t in work.trajectories if self._trajectories.try_start(t.trajectory_id)]
            if not live:
                continue
            start = time.perf_counter()
            if work.resume:
                prefix, _ = self.engine.resume(self._params, live[0], version=self._version)
            else:
                prefix, _ = self.engine.prefill(
                    self._params, live[0].prompt, trajectory_id=[t.trajectory_id for t in live],
                    version=self._version, max_new_tokens=live[0].max_new_tokens)
            state = self.engine.insert(prefix, state, free[:len(live)])
            self._busy_s += time.perf_counter() - start
            for t in live:
                self._reported[t.trajectory_id] = len(t.tokens)

    def _report(self, record: Trajectory, finish_reason: str | None) -> bool:
        done = self._reported.pop(record.trajectory_id, 0)
        self._entry_of.pop(record.trajectory_id, None)
        return self._trajectories.report(
            record.trajectory_id, record.tokens[done:], record.logprobs[done:],
            record.policy_logprobs[done:], record.versions[done:], finish_reason)

    def _report_finished(self) -> None:
        finished = self.engine.pop_finished()
        if not finished:
            return
        entries = [self._entry_of.get(r.trajectory_id, -1) for r in finished]
        kept = [(r, e) for r, e in zip(finished, entries) if self._report(r, r.finish_reason)]
        if kept:
            self._on_event(Event("finished", self.id, tuple(r for r, _ in kept),
                                 tuple(e for _, e in kept)))

    def _drop(self, trajectory_ids: frozenset[int]) -> None:
        with self._lock:
            kept = collections.deque()
            for work in self._queue:
                work.trajectories = [t for t in work.trajectories if t.trajectory_id not in trajectory_ids]
                if work.trajectories:
                    kept.append(work)
            self._queue = kept
        for slot, record in enumerate(self.engine.slot_records()):
            if record is not None and record.trajectory_id in trajectory_ids:
                self.engine.free(slot)
        for t in trajectory_ids:
            self._reported.pop(t, None)
            self._entry_of.pop(t, None)

    def _extract(self, count: int) -> None:
        handed: list[tuple[Trajectory, int]] = []
        with self._lock:
            while self._queue and len(handed) < count:
                work = self._queue.pop()  # the newest queued work waited least
                handed += [(t, work.entry_id) for t in work.trajectories]
        running = sorted(self.engine.running().items(),
                         key=lambda item: len(item[1].prompt) + len(item[1].tokens))
        for slot, _ in running[:max(0, count - len(handed))]:
            record = self.engine.extract(slot)
            entry = self._entry_of.get(record.trajectory_id, -1)
            if self._report(record, None):
                handed.append((record, entry))
        for t, _ in handed:
            self._entry_of.pop(t.trajectory_id, None)
        if handed:
            self._on_event(Event("extracted", self.id, tuple(t for t, _ in handed),
                                 tuple(e for _, e in handed)))

    def _refresh_snapshot(self) -> None:
        slots = [r for r in self.engine.slot_records() if r is not None]
        kv = sum(len(r.prompt) + len(r.tokens) for r in slots)
        self._snapshot = Snapshot(
            self._version, len(slots), sum(len(w.trajectories) for w in self._queue), kv,
            self.engine.num_slots, self._syncing, self._alive, self._busy_s, self._idle_s)
