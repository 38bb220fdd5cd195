"""The driver's stand-in for a rollout instance that lives in a Ray actor.

It offers what the threaded driver calls on a local RolloutInstance (`start`, `stop`,
`snapshot`, `submit`, `request_sync`, `request_extract`, `request_drop`), so the same driver
and the same coordinator core run remote instances: the core sees the same events and sends
the same commands.

    coordinator thread ──submit / sync / extract / drop──► actor.command(seq, ...)  (no wait)
    poll thread ◄──(items, snapshot, applied seq)── actor.poll(wait_s)  (long poll, timed)
        items in order: start / report → TrajectoryServer;  finished / extracted / synced /
        failed → the driver's event queue;  want → a weights offer back to the actor

Timeouts, each naming the instance: the start (`start_timeout_s`: the actor's process, JAX,
engine and first weights), every poll after it (`poll_wait_s + heartbeat_timeout_s`: an actor
that stops answering is failed), the stop. An actor that answers while its engine is stuck in
one call is failed by the driver's watchdog (`fail`; rollout.stall_timeout_s).
A failed instance (dead actor, silent actor, an error it reported, a stuck engine) is killed,
so nothing it still sends can reach the server, and the core gets `Failed`: it re-routes what
it held. With a `Rejoiner` (`distributed.max_instance_restarts` > 0) a fresh actor and a fresh
stand-in then take its place; this one stays failed, and its late reports are never applied.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from typing import Any

from asyncrl.distributed.code_version import CodeVersionError
from asyncrl.records import InstanceState
from asyncrl.rollout.messages import InstanceFailed, Work
from asyncrl.servers.trajectory import TrajectoryServer

log = logging.getLogger(__name__)


class InstanceLost(RuntimeError):
    """A remote instance died, went silent or could not start; the message says which."""


@dataclasses.dataclass(frozen=True)
class Timeouts:
    poll_wait_s: float
    heartbeat_timeout_s: float
    start_timeout_s: float
    stop_timeout_s: float


class RemoteInstance:
    def __init__(self, instance_id: int, actor, server: TrajectoryServer, reporter,
                 publisher, timeouts: Timeouts, num_slots: int, rejoin=None):
        """`publisher` answers the actor's weight requests (`offer`, `pull_seconds`);
        `rejoin` (an `asyncrl.distributed.rejoin.Rejoiner`, or None: a failure is final)
        restarts the instance once this stand-in has failed."""
        self.id, self.actor, self.name = instance_id, actor, f"rollout instance {instance_id}"
        self._server, self._reporter, self._publisher = server, reporter, publisher
        self.timeouts = timeouts
        self.info: dict[str, Any] = {}  # the actor's pid and devices, once started
        self._lock = threading.Lock()
        self._seq = 0
        self._unacked: dict[int, tuple[str, int]] = {}  # seq -> (command, trajectories)
        self._snapshot = InstanceState.starting(instance_id, num_slots)
        self._failed = False
        self._rejoin = rejoin
        self.finished = 0  # trajectories this actor finished that the server took
        self._refused: set[int] = set()  # trajectories whose start or report the server refused
        self._closing = threading.Event()
        self._started_at: float | None = None
        self._thread = threading.Thread(target=self._poll_loop, name=f"poll-{instance_id}",
                                        daemon=True)

    # ---------------------------------------------------------------- what the driver calls

    def start(self) -> None:
        """Starts polling (the actor's first pull asks through it), then waits for the actor
        to hold its first weights."""
        import ray

        self._thread.start()
        try:
            self.info = ray.get(self.actor.start.remote(), timeout=self.timeouts.start_timeout_s)
        except CodeVersionError as error:  # other code on its host: no restart helps
            self._closing.set()
            with self._lock:
                self._failed = True
            raise CodeVersionError(str(getattr(error, "cause", error))) from None
        except Exception as error:  # ray.exceptions.* or the actor's own error
            self._fail(f"did not start within {self.timeouts.start_timeout_s:.0f} s "
                       f"(distributed.start_timeout_s): {type(error).__name__}: {error}")
            return
        # From here on the heartbeat applies: a started actor answers every poll promptly.
        self._started_at = time.monotonic()
        # Where it runs, on the console (which host, and where its weights arrive).
        server = self.info.get("transfer_server")
        print(f"{self.name}: Ray actor pid {self.info.get('pid')} on {self.info.get('node')}"
              + (f", its jax_transfer server at {server}" if server else ""),
              file=sys.stderr, flush=True)

    def stop(self) -> None:
        import ray

        self._closing.set()
        with self._lock:
            failed = self._failed
        if not failed:
            try:
                ray.get(self.actor.stop.remote(), timeout=self.timeouts.stop_timeout_s)
            except Exception as error:
                log.warning("%s: stop: %s: %s", self.name, type(error).__name__, error)
        self._thread.join(self.timeouts.poll_wait_s + self.timeouts.heartbeat_timeout_s)
        ray.kill(self.actor, no_restart=True)

    @property
    def version(self) -> int:
        return self.snapshot().version

    def unless_failed(self, action) -> bool:
        """`action()`'s answer, run unless this instance has failed (then False). A failure
        reports after whatever `action` sent: its report is made under the same lock."""
        with self._lock:
            return not self._failed and action()

    def snapshot(self) -> InstanceState:
        """The actor's last snapshot, with the commands it has not applied yet counted in (as
        a local instance counts work the moment it is submitted)."""
        with self._lock:
            s = self._snapshot
            queued = sum(n for name, n in self._unacked.values() if name == "submit")
            syncing = any(name == "sync" for name, _ in self._unacked.values())
        return dataclasses.replace(s, queued=s.queued + queued, syncing=s.syncing or syncing)

    def submit(self, work: Work) -> None:
        with self._lock:
            if self._failed:
                raise InstanceFailed(f"{self.name} has failed; route elsewhere")
        self._command("submit", work, len(work.trajectories))

    def request_sync(self) -> None:
        self._command("sync", None)

    def request_extract(self, trajectory_ids) -> None:
        self._command("extract", tuple(trajectory_ids))

    def request_drop(self, trajectory_ids) -> None:
        self._command("drop", tuple(trajectory_ids))

    def fail(self, reason: str) -> None:
        """The driver gave up on this instance (`reason`, after its name, says why: its engine
        stuck, say): failed as when its actor dies, killed, its work re-routed, a fresh actor
        in its place if restarts are left."""
        self._fail(reason)

    def _command(self, name: str, args: Any, trajectories: int = 0) -> None:
        with self._lock:
            if self._failed:
                return
            self._seq += 1
            self._unacked[self._seq] = (name, trajectories)
            # Sent under the lock: numbers leave in order (the actor re-orders by them anyway).
            self.actor.command.remote(self._seq, name, args)

    # ---------------------------------------------------------------- the poll thread

    def _poll_loop(self) -> None:
        from ray.exceptions import RayError

        while not self._closing.is_set():
            try:
                answer = self._poll()
            except RayError as error:
                if not self._closing.is_set():
                    self._fail(f"its actor is gone: {type(error).__name__}: {error}")
                return
            if answer is None:  # timed out (failed) or closing
                return
            items, snapshot, applied = answer
            with self._lock:
                if self._failed:
                    return  # nothing from a failed instance reaches the server
            try:
                self._apply(items)
            except Exception as error:  # a bug here must not leave the instance silent
                log.exception("%s: applying what its actor sent failed", self.name)
                self._fail(f"sent what the driver could not apply: {type(error).__name__}: {error}")
                return
            with self._lock:
                self._snapshot = snapshot
                for seq in [s for s in self._unacked if s <= applied]:
                    del self._unacked[seq]

    def _poll(self):
        """One poll's answer, or None once it is overdue (the instance then failed) or the
        stand-in closes. Overdue: no answer `poll_wait_s + heartbeat_timeout_s` after it was
        asked, or after the start finished; until then the start's own allowance applies (an
        actor builds its engine before it can answer)."""
        import ray

        t = self.timeouts
        ref, asked = self.actor.poll.remote(t.poll_wait_s), time.monotonic()
        while not self._closing.is_set():
            ready, _ = ray.wait([ref], timeout=min(t.poll_wait_s, 0.5))
            if ready:
                return ray.get(ready[0])
            started = self._started_at
            since = asked if started is None else max(asked, started)
            allowance = t.poll_wait_s + (t.start_timeout_s if started is None else t.heartbeat_timeout_s)
            if time.monotonic() - since > allowance:
                if started is None:
                    self._fail(f"did not answer while starting for {allowance:.0f} s "
                               f"(distributed.start_timeout_s = {t.start_timeout_s})")
                else:
                    self._fail(f"sent no snapshot for {time.monotonic() - since:.1f} s "
                               f"(distributed.heartbeat_timeout_s = {t.heartbeat_timeout_s})")
                return None
        return None

    def _apply(self, items: list[tuple]) -> None:
        server = self._server
        for item in items:
            kind = item[0]
            if kind == "start":
                _, t, at_step = item
                if not server.try_start(t, at_step):  # aborted or moved meanwhile
                    self._refused.add(t)
                    self._command("drop", (t,))
            elif kind == "report":
                t = item[1]
                # Only while the server still has it running here: after an abort or a
                # re-route its id may be running elsewhere.
                if t in self._refused or not server.has(t) or server.instance_of(t) != self.id \
                        or not server.report(t, *item[2:]):
                    self._refused.add(t)
            elif kind in ("finished", "extracted"):
                ids = tuple(t for t in item[1] if t not in self._refused)
                self._refused.difference_update(item[1])
                if ids:
                    self.finished += len(ids) if kind == "finished" else 0
                    getattr(self._reporter, kind)(self.id, ids)
            elif kind == "synced":
                self._reporter.synced(self.id, item[1])
            elif kind == "want":
                _, request, newer_than = item
                handle = self._publisher.offer(self.id, newer_than)
                self._command("offer", (request, handle))
            elif kind == "pulled":
                self._publisher.pulled(item[2])
                self._publisher.pull_seconds.append(item[3])
            elif kind == "failed":
                self._fail(f"reported an error: {item[1]}")
                return
            else:
                raise ValueError(f"{self.name}: unknown item {kind!r} from its actor")

    def _fail(self, reason: str) -> None:
        import ray

        with self._lock:
            if self._failed:
                return
            self._failed = True
            self._snapshot = dataclasses.replace(self._snapshot, alive=False)
            pid = self.info.get("pid", "?")
            message = f"{self.name} (Ray actor, pid {pid}) {reason}"
            log.error("%s", message)
            # Killed, not trusted: a silent actor may wake up and report work re-routed
            # elsewhere. Before the report: whoever hears of the failure finds it dead.
            try:
                ray.kill(self.actor, no_restart=True)
            except Exception as error:
                log.warning("%s: kill: %s", self.name, error)
            rejoining = self._rejoin is not None and self._rejoin.claim(self.id)
            # Under the lock: a submit refused from here on (the driver reports that too)
            # comes after this report, so the core learns first whether a restart is coming.
            self._reporter.failed(self.id, InstanceLost(message), rejoining=rejoining)
        if rejoining:
            self._rejoin.respawn(self)
