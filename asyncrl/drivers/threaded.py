"""The threaded driver: the coordinator core against rollout-instance threads in one process.

A coordinator thread loops: gather what happened (instance events, reward outcomes, a
snapshot of every instance), `core.step(now, events)`, apply the commands (hand work to an
instance, ask it to sync, extract or drop, send a trajectory to the reward pool, wake the
trainer). The trainer thread takes batches with `wait_batch`, which sleeps on a condition the
coordinator signals when the core announces the batch, and publishes weights with `publish`.

Every call into the core holds one lock, so the trainer's consume and a checkpoint's
snapshot of the core, the servers and the protocol see one consistent state.

The watchdog: an instance whose snapshot shows its engine stuck in one call (a compiled
prefill or decode step, `stalled_s`) for longer than `stall_timeout_s` (rollout.stall_timeout_s)
is failed (`instance.fail`), as if it had died: the core re-routes what it held, and a Ray
instance with restarts left is replaced. It still answered polls; it just made no progress.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from typing import Any, Callable, Sequence

from asyncrl.coordinator.core import Core
from asyncrl.coordinator.records import Batch
from asyncrl.coordinator.messages import (BatchReady, Command, Dispatch, Drop, Event, Extract,
                                          Extracted, Failed, Finished, Published,
                                          Rejoined, RejoinFailed, Score, Scored, Sync, Synced)
from asyncrl.errors import UserError
from asyncrl.records import Trajectory
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.rollout.messages import InstanceFailed, Work
from asyncrl.servers.parameters import ParameterServer
from asyncrl.servers.trajectory import TrajectoryServer

log = logging.getLogger(__name__)


class StopRequested(Exception):
    """The run was asked to stop while the trainer waited for a batch."""


class BrokenReference(UserError):
    """A reward that raises whatever the response: the task's reference answer (or the
    reward) is broken, which no retry of the prompt can mend."""


class BatchTimeout(TimeoutError):
    """No batch arrived in time; the message says what it waited for."""


class _Reporter:
    """The threaded driver's `asyncrl.records.EventSink`: what instances tell the coordinator,
    as core events on the driver's queue; and what the driver's Rejoiner tells it of the
    instances it restarts (`rejoined`, `rejoin_failed`)."""

    def __init__(self, events: queue.Queue):
        self._events = events

    def finished(self, instance, trajectory_ids):
        self._events.put(Finished(instance, tuple(trajectory_ids)))

    def extracted(self, instance, trajectory_ids):
        self._events.put(Extracted(instance, tuple(trajectory_ids)))

    def failed(self, instance, error, rejoining=False):
        self._events.put(Failed(instance, f"{type(error).__name__}: {error}", rejoining))

    def rejoined(self, instance, version):
        self._events.put(Rejoined(instance, version))

    def rejoin_failed(self, instance, error):
        self._events.put(RejoinFailed(instance, error))

    def synced(self, instance, version):
        self._events.put(Synced(instance, version))


class ThreadedDriver:
    """Runs `core` against `instances` (built with `reporter` as their reporter)."""

    def __init__(self, core: Core, server: TrajectoryServer, parameters: ParameterServer,
                 rewards: Any, score: Callable[[int], tuple[str, str, dict]], tick_s: float = 0.005,
                 stall_timeout_s: float | None = None):
        """`score(trajectory_id)` gives (reward name, response text, reward kwargs) for the
        reward pool; `rewards` is the pool (`submit`, `poll`). `stall_timeout_s`: the
        watchdog's deadline (None: no watchdog)."""
        self.core, self.server, self.parameters = core, server, parameters
        self.rewards, self._score, self.tick_s = rewards, score, tick_s
        self.stall_timeout_s = stall_timeout_s
        self.events: queue.Queue[Event] = queue.Queue()
        self.reporter = _Reporter(self.events)
        self.instances: list[RolloutInstance] = []
        self._lock = threading.Lock()
        self._batch = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="coordinator", daemon=True)

    # ---------------------------------------------------------------- control

    def start(self) -> None:
        for instance in self.instances:
            instance.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        for instance in self.instances:
            instance.stop()

    def check(self) -> None:
        """Re-raises a failure of the coordinator thread in the caller."""
        if isinstance(self._error, UserError):
            raise self._error
        if self._error is not None:
            raise RuntimeError("the coordinator thread failed") from self._error

    @contextlib.contextmanager
    def paused(self):
        """No coordinator step runs inside: core, servers and protocol agree with each other."""
        with self._lock:
            yield

    # ---------------------------------------------------------------- the trainer's side

    def wait_batch(self, version: int, timeout_s: float,
                   stop_requested: Callable[[], bool]) -> Batch:
        """Sleeps until the core announces batch `version`, then takes it."""
        deadline = time.monotonic() + timeout_s
        with self._batch:
            while not self.core.batch_ready(version):
                self.check()
                if stop_requested():
                    raise StopRequested(f"stop requested while waiting for batch {version}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise BatchTimeout(f"waited {timeout_s:.0f} s for training batch {version}: "
                                       f"{self.core.describe_wait(version)}")
                # Woken by BatchReady; the timeout only bounds how late a stop is noticed.
                self._batch.wait(min(left, 0.5))
            return self.core.take_batch(version)

    def publish(self, version: int, params) -> None:
        """Pushes weights `version` to the parameter server and tells the core."""
        self.parameters.push(version, params)
        self.events.put(Published(version))

    # ---------------------------------------------------------------- the coordinator thread

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                events = self._gather()
                with self._lock:
                    commands = self.core.step(time.monotonic(), events)
                    self._apply(commands)
        except BaseException as error:
            if not isinstance(error, UserError):  # a user's error is its one line, no traceback
                log.exception("coordinator failed")
            self._error = error
            with self._batch:
                self._batch.notify_all()

    def _gather(self) -> list[Event]:
        events: list[Event] = []
        try:
            events.append(self.events.get(timeout=self.tick_s))
            while True:
                events.append(self.events.get_nowait())
        except queue.Empty:
            pass
        for t, outcome in self.rewards.poll():
            if outcome.raised:
                # It raised on an empty response too (asyncrl/rewards/pool.py): the reference
                # answer or the reward is at fault, and re-dispatching the prompt would loop.
                raise BrokenReference(
                    f"the reward raised whatever the response (an empty one too) for prompt "
                    f"{self.server.prompt_id(self.server.entry_of(t))} of the task's train "
                    f"split: {outcome.error}. Its reference answer (config.task's data) or the "
                    f"reward (config.task.reward) is broken")
            events.append(Scored(t, outcome.reward if outcome.ok else None,
                                 outcome.response_error or "" if outcome.ok else str(outcome.error)))
        for instance in self.instances:
            state = instance.snapshot()
            if state.alive and not self._stalled(instance, state):
                events.append(state)
        return events

    def _stalled(self, instance, state) -> bool:
        """The watchdog: fails `instance` if its engine call has run past the deadline."""
        reason = stall_reason(state.stalled_s, self.stall_timeout_s)
        if reason is not None:
            instance.fail(reason)
        return reason is not None

    def _apply(self, commands: Sequence[Command]) -> None:
        for command in commands:
            if isinstance(command, Dispatch):
                self._dispatch(command)
            elif isinstance(command, Sync):
                self.instances[command.instance].request_sync()
            elif isinstance(command, Extract):
                self.instances[command.instance].request_extract(command.trajectory_ids)
            elif isinstance(command, Drop):
                self.instances[command.instance].request_drop(command.trajectory_ids)
            elif isinstance(command, Score):
                name, response, kwargs = self._score(command.trajectory_id)
                self.rewards.submit(command.trajectory_id, name, response=response, **kwargs)
            elif isinstance(command, BatchReady):
                self._batch.notify_all()
            else:
                raise TypeError(f"not a coordinator command: {command!r}")

    def _dispatch(self, command: Dispatch) -> None:
        work = Work([Trajectory.of(self.server.record(t)) for t in command.trajectory_ids])
        try:
            self.instances[command.instance].submit(work)
        except InstanceFailed as error:
            # Died since its snapshot: its "failed" event re-routes this work with the rest.
            log.warning("%s", error)
            self.events.put(Failed(command.instance, str(error)))


def stall_reason(stalled_s: float, deadline_s: float | None) -> str | None:
    """Why an instance whose engine call has run `stalled_s` has failed (it follows the
    instance's name), or None while within `deadline_s` (None: no deadline)."""
    if deadline_s is None or not stalled_s > deadline_s:
        return None
    return (f"made no progress for {stalled_s:.0f} s: its engine is stuck in one prefill or "
            f"decode step, compiled already (rollout.stall_timeout_s = {deadline_s:g} s; a "
            f"compile is not counted); failed, its work is re-routed")
