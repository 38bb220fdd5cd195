"""The trainer group's watchdog: process 0 notices a follower that went silent, and ends the job
with one line naming it, instead of waiting in a collective forever.

A collective of the group (asyncrl/distributed/trainer_ops.py) waits for every process and
cannot be given a deadline: a follower that is stopped (SIGSTOP), hung, or cut off from the
network without its connections closing leaves process 0 waiting inside it. (A follower that
dies closes its connections: the collective then fails at once, `TrainerGroupError`.) So,
beside the collectives:

    every process > 0 beats:  a thread writes a counter to its key in jax.distributed's
                              key-value store (held by process 0's coordination service)
                              every `interval_s(deadline)`;
    process 0 watches:        a thread reads those keys; a follower whose counter has not
                              moved for `distributed.heartbeat_timeout_s` has failed.

Then process 0 logs the error (which process, how long, the setting, and what process 0 was
waiting on: `Watch.doing`, set by TrainerGroup around each collective), prints it as an
`error:` line and exits with status 75 (`EXIT_STATUS`). At once, even between two collectives:
the group cannot go on without the follower (its next collective would wait inside), no
checkpoint can be saved (a save is a collective of every process), and a thread cannot end a
collective the main thread waits in. Every process is then restarted together and resumes
from the last checkpoint.

JAX's own heartbeat (`heartbeat_timeout_seconds` of jax.distributed.initialize) is set to
`backstop_s(deadline)`, longer, so this watch speaks first: JAX's ends the process with a C++
fatal error that names neither the operation nor a setting.

    start(process_id, num_processes, deadline_s)   # trainer_group.initialize, after joining
    current()                                      # process 0's Watch (None elsewhere)
    stop()                                         # before the group leaves jax.distributed
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import time
from typing import Callable, Sequence

log = logging.getLogger(__name__)

EXIT_STATUS = 75  # EX_TEMPFAIL: restart every process of the group; it resumes
PREFIX = "asyncrl/trainer_group/heartbeat/"
FIELD = "distributed.heartbeat_timeout_s"


def interval_s(deadline_s: float) -> float:
    """How often followers beat and process 0 looks: ten looks per deadline, at most every 5 s."""
    return min(max(deadline_s / 10, 0.05), 5.0)


def backstop_s(deadline_s: float) -> int:
    """JAX's own heartbeat timeout: its default (100 s), or twice this watch's deadline."""
    return int(max(100, 2 * deadline_s))


def exit_process(message: str) -> None:
    """The end of process 0 when a follower failed: the error, logged and printed, status 75."""
    log.critical("%s", message)
    print(f"error: {message}", file=sys.stderr, flush=True)
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):
            handler.flush()
    os._exit(EXIT_STATUS)


class Watch:
    """Process 0's view of the followers' heartbeats. `read()` gives {process: counter} as
    stored now; `poll()` is one look (the thread calls it every `interval_s`); `fail(message)`
    runs once, when a follower has been silent longer than `deadline_s`."""

    def __init__(self, followers: Sequence[int], num_processes: int, deadline_s: float,
                 read: Callable[[], dict[int, str]], *, clock: Callable[[], float] = time.monotonic,
                 fail: Callable[[str], None] = exit_process):
        self.followers, self.num_processes, self.deadline_s = tuple(followers), num_processes, deadline_s
        self._read, self._clock, self._fail = read, clock, fail
        self._lock = threading.Lock()
        self._doing: str | None = None  # the collective process 0 waits in, if any
        self._done = "none yet"  # the last one it began
        now = clock()
        self._polled = now
        self._seen: dict[int, tuple[str | None, float]] = {p: (None, now) for p in self.followers}
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def doing(self, what: str):
        """Process 0 is inside the collective `what` ("the train step 7") for the duration."""
        with self._lock:
            self._doing = what
        try:
            yield
        finally:
            with self._lock:
                self._doing, self._done = None, what

    def poll(self) -> str | None:
        """One look at the heartbeats; the failure's message if a follower has failed (then
        `fail` was called and the watch stops)."""
        if self._stopped.is_set():
            return None
        beats, now = self._read(), self._clock()
        if now - self._polled > self.deadline_s / 2:
            # This thread itself did not run for that long (process 0 or its host stalled): it
            # saw nothing in between, so it can judge no one. Every follower starts afresh.
            self._seen = {p: (beats.get(p), now) for p in self.followers}
        self._polled = now
        for process in self.followers:
            beat, since = self._seen[process]
            if beats.get(process) != beat:
                self._seen[process] = (beats.get(process), now)
            elif now - since > self.deadline_s:
                message = self.message(process, now - since, beat is not None)
                self._stopped.set()
                self._fail(message)
                return message
        return None

    def message(self, process: int, silent_s: float, beat_before: bool) -> str:
        with self._lock:
            doing, done = self._doing, self._done
        where = (f"process 0 waits for it in {doing}, a collective that cannot time out"
                 if doing else f"the last operation of the group process 0 began: {done}; "
                 f"the next would wait for it")
        return (f"trainer group: process {process} of {self.num_processes} sent "
                f"{'no heartbeat' if beat_before else 'not one heartbeat'} for {silent_s:.1f} s "
                f"({FIELD} = {self.deadline_s:g}): it is stopped (SIGSTOP), hung, dead, or cut "
                f"off from process 0; {where}. Process 0 exits now (status {EXIT_STATUS}) "
                f"without a checkpoint, which every process must write; restart every process "
                f"of the group together: they resume from the last checkpoint")

    def start(self) -> "Watch":
        self._thread = threading.Thread(target=self._loop, name="trainer-group-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        interval, warned = interval_s(self.deadline_s), False
        while not self._stopped.wait(interval):
            try:
                self.poll()
            except Exception as error:  # noqa: BLE001 - a watchdog must not die of a bad look
                if not warned:  # JAX's own heartbeat remains (`backstop_s`)
                    log.warning("trainer group watch: %s: %s", type(error).__name__, error)
                    warned = True


class Beat:
    """A follower's heartbeat: `write(counter)` every `interval_s`, on a thread, until stopped.
    A write that fails (process 0's service unreachable for now) is retried at the next beat."""

    def __init__(self, write: Callable[[str], None], interval: float):
        self._write, self.interval = write, interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainer-group-beat", daemon=True)

    def start(self) -> "Beat":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        count, warned = 0, False
        while not self._stopped.is_set():
            try:
                self._write(str(count))
                count += 1
            except Exception as error:  # noqa: BLE001 - process 0 notices the silence
                if not warned:
                    log.warning("trainer group heartbeat: %s: %s", type(error).__name__, error)
                    warned = True
            self._stopped.wait(self.interval)


# ---------------------------------------------------------------------------- this process's

_running: list = []  # this process's Watch or Beat, while the group is joined


def start(process_id: int, num_processes: int, deadline_s: float) -> None:
    """After this process joined its group: process 0 watches, every other process beats."""
    from jax._src import distributed

    client = distributed.global_state.client
    stop()
    if process_id == 0:
        def read() -> dict[int, str]:
            return {int(key.rpartition("/")[2]): value
                    for key, value in client.key_value_dir_get(PREFIX)}

        _running.append(Watch(range(1, num_processes), num_processes, deadline_s, read).start())
    else:
        key = f"{PREFIX}{process_id}"
        _running.append(Beat(lambda count: client.key_value_set(key, count, allow_overwrite=True),
                             interval_s(deadline_s)).start())
    # Registered after jax.distributed's own exit handler, so run before it: no beat or look
    # reaches a client that is shutting down.
    atexit.register(stop)


def current() -> Watch | None:
    """Process 0's watch while it runs; None in a follower, or with no group."""
    return next((w for w in _running if isinstance(w, Watch)), None)


def stop() -> None:
    """Ends this process's watch or beat: before the group leaves jax.distributed, and before
    a normal end stops the followers (their silence is then no failure)."""
    while _running:
        _running.pop().stop()
