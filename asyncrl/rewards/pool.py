"""Reward worker pool: every reward call runs in a worker process under a timeout.

A reward function that raises, crashes its process or hangs never stalls the run; hung or
dead workers are killed and replaced. Workers are separate processes (spawned, so they never
inherit the parent's JAX threads) because a hung thread cannot be stopped.

What a failure means (asyncrl/rewards/math.py, "Failure semantics"): a reward that raises on
a response is called again on an empty response with the same other arguments. If that
succeeds, the response caused the failure (math-verify past its time limit on a power tower,
a user's grader choking on odd text): it scores 0.0, like any other unusable answer, and the
outcome says why (`response_error`, counted in `response_errors`). If it raises again, the
reference or the reward is broken: a failed call (`raised`), as are a timeout and a dead
worker, which the caller re-dispatches (training) or reports (evaluation).

Non-blocking: `submit` queues a call, `poll` returns the outcomes that are in; a thread of
the pool feeds idle workers and enforces deadlines in between. `map` is the blocking form.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib
import multiprocessing
import multiprocessing.connection
import threading
import time
import traceback
from typing import Any, Hashable


@dataclasses.dataclass(frozen=True)
class RewardOutcome:
    reward: float | None  # None when the call failed
    error: str | None = None  # "timeout after 5.0 s", "ValueError: …", "worker died (exit -9)"
    seconds: float = 0.0
    # The reward raised on this response alone (so `reward` is 0.0): why, in one line.
    response_error: str | None = None
    raised: bool = False  # the failure is the reward's own exception (not a timeout or death)

    @property
    def ok(self) -> bool:
        return self.error is None


def _worker_main(connection: multiprocessing.connection.Connection, plugins: tuple[str, ...]) -> None:
    from asyncrl.rewards.registry import REWARDS

    for module in plugins:
        importlib.import_module(module)

    while True:
        try:
            message = connection.recv()
        except EOFError:  # the pool's process ended without closing it (killed, or os._exit)
            return
        if message is None:
            return
        name, kwargs = message
        reward = None
        try:
            reward = REWARDS.get(name)
            connection.send((True, float(reward(**kwargs)), None))
        except Exception as e:  # the reward's own failure, reported back as data
            why = traceback.format_exception_only(type(e), e)[-1].strip()
            at_fault = reward is not None and _response_at_fault(reward, kwargs)
            connection.send((True, 0.0, why) if at_fault else (False, why, None))


def _response_at_fault(reward, kwargs: dict[str, Any]) -> bool:
    """Whether the reward, which raised on `kwargs`, succeeds on an empty response."""
    if not kwargs.get("response"):
        return False
    try:
        reward(**{**kwargs, "response": ""})
    except Exception:
        return False
    return True


class _Worker:
    def __init__(self, context, plugins: tuple[str, ...]):
        self.connection, child = context.Pipe()
        self.process = context.Process(target=_worker_main, args=(child, plugins), daemon=True)
        self.process.start()
        child.close()
        self.job: tuple[Hashable, float] | None = None  # (key, start time)

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.connection.close()


class RewardPool:
    def __init__(self, num_workers: int = 2, timeout_s: float = 10.0,
                 plugins: tuple[str, ...] = ()):
        """`plugins`: modules each worker imports first, to register rewards of the user's own."""
        if num_workers < 1:
            raise ValueError(f"reward pool: num_workers must be ≥ 1, got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"reward pool: timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        for module in plugins:
            importlib.import_module(module)  # fails here, clearly, rather than in every worker
        self._plugins = tuple(plugins)
        self._context = multiprocessing.get_context("spawn")
        self._workers = [_Worker(self._context, self._plugins) for _ in range(num_workers)]
        self._queue: collections.deque[tuple[Hashable, str, dict[str, Any]]] = collections.deque()
        self._done: list[tuple[Hashable, RewardOutcome]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self.failures = 0  # failed calls: timeouts, dead workers, rewards that raised
        self.response_errors = 0  # responses a reward raised on, scored 0.0
        self._thread = threading.Thread(target=self._serve, name="reward-pool", daemon=True)
        self._thread.start()

    def submit(self, key: Hashable, reward_name: str, **kwargs: Any) -> None:
        """Queues `REWARDS[reward_name](**kwargs)`; its outcome comes back from `poll` under `key`."""
        with self._lock:
            if self._closed:
                raise RuntimeError("reward pool is closed")
            self._queue.append((key, reward_name, kwargs))
        self._wake.set()

    def poll(self) -> list[tuple[Hashable, RewardOutcome]]:
        with self._lock:
            done, self._done = self._done, []
            return done

    def map(self, reward_name: str, calls: list[dict[str, Any]]) -> list[RewardOutcome]:
        """Every `REWARDS[reward_name](**kwargs)` of `calls`, in order, blocking until all are
        in (each ends within the timeout). For a pool nothing else submits to."""
        for i, kwargs in enumerate(calls):
            self.submit(i, reward_name, **kwargs)
        outcomes: dict[Hashable, RewardOutcome] = {}
        while len(outcomes) < len(calls):
            outcomes.update(self.poll())
            if len(outcomes) < len(calls):
                time.sleep(0.002)
        return [outcomes[i] for i in range(len(calls))]

    def pending(self) -> int:
        with self._lock:
            return len(self._queue) + sum(w.job is not None for w in self._workers)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wake.set()
        self._thread.join(timeout=10)
        for worker in self._workers:
            worker.kill()

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------- the serving thread

    def _serve(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                for worker in self._workers:
                    if worker.job is None and self._queue:
                        key, name, kwargs = self._queue.popleft()
                        worker.connection.send((name, kwargs))
                        worker.job = (key, time.monotonic())
            busy = [w for w in self._workers if w.job is not None]
            if not busy:
                self._wake.wait(timeout=0.5)
                self._wake.clear()
                continue
            ready = multiprocessing.connection.wait(
                [w.connection for w in busy] + [w.process.sentinel for w in busy], timeout=0.05)
            now = time.monotonic()
            for i, worker in enumerate(self._workers):
                if worker.job is None:
                    continue
                key, started = worker.job
                if worker.connection in ready:
                    try:
                        ok, value, response_error = worker.connection.recv()
                    except (EOFError, OSError):
                        self._replace(i, key, f"worker died (exit {worker.process.exitcode})", now - started)
                        continue
                    outcome = RewardOutcome(value, None, now - started, response_error) if ok \
                        else RewardOutcome(None, value, now - started, raised=True)
                    self._finish(key, outcome)
                    worker.job = None
                elif worker.process.sentinel in ready:
                    self._replace(i, key, f"worker died (exit {worker.process.exitcode})", now - started)
                elif now - started > self.timeout_s:
                    self._replace(i, key, f"timeout after {self.timeout_s:g} s", now - started)

    def _finish(self, key: Hashable, outcome: RewardOutcome) -> None:
        with self._lock:
            self.failures += not outcome.ok
            self.response_errors += outcome.response_error is not None
            self._done.append((key, outcome))

    def _replace(self, index: int, key: Hashable, error: str, seconds: float) -> None:
        self._workers[index].kill()
        self._workers[index] = _Worker(self._context, self._plugins)
        self._finish(key, RewardOutcome(None, error, seconds))
