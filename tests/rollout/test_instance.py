"""RolloutInstance on a real engine: what it hands back when the coordinator extracts work."""

import queue
import threading

import numpy as np
import pytest

from asyncrl.model import ModelConfig, init_params
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.rollout.messages import InstanceFailed, Trajectory, Work
from asyncrl.model.sampling import SamplingParams

CONFIG = ModelConfig.tiny()
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def model():
    return init_params(CONFIG, seed=0)


@pytest.fixture(scope="module")
def engine(model):
    """One engine (one set of compiles) for the module: each instance resets its records."""
    return Engine(model[0], CONFIG, num_slots=2, max_len=32, prompt_buckets=(8,),
                  sampling=SamplingParams(temperature=1.0), stop_tokens=(),
                  max_new_tokens=NEW_TOKENS, seed=0)


class ExtractOnStart:
    """A sink that asks for its trajectory back the moment the instance starts it: the race of
    a migration decided while the trajectory was queued, reaching the instance once it runs."""

    def __init__(self):
        self.instance = None
        self.reports = queue.Queue()

    def try_start(self, trajectory_id, at_step):
        self.instance.request_extract([trajectory_id])
        return True

    def report(self, trajectory_id, tokens, logprobs, policy_logprobs, versions, finish_reason):
        self.reports.put((trajectory_id, list(tokens), list(versions), finish_reason))
        return True


class Events:
    def __init__(self, reports: queue.Queue):
        self.extracted_ids = []
        self._reports = reports  # a failure ends the test's wait at once, with the error

    def finished(self, instance, trajectory_ids): ...
    def synced(self, instance, version): ...

    def failed(self, instance, error):
        self._reports.put(("failed", error, None, None))

    def extracted(self, instance, trajectory_ids):
        self.extracted_ids += trajectory_ids


@pytest.mark.parametrize("partial_rollout", [True, False])
def test_a_started_trajectory_is_handed_back_only_with_partial_rollout(model, engine,
                                                                       partial_rollout):
    params = model[1]
    sink = ExtractOnStart()
    events = Events(sink.reports)
    instance = RolloutInstance(0, engine, lambda newer: (0, params) if newer < 0 else None, sink,
                               events, partial_rollout=partial_rollout)
    sink.instance = instance
    instance.start()
    try:
        instance.submit(Work([Trajectory(7, np.array([1, 5, 9, 2], np.int32), NEW_TOKENS)]))
        trajectory_id, tokens, versions, finish_reason = sink.reports.get(timeout=120)
    finally:
        instance.stop()
    assert trajectory_id == 7, f"instance failed: {tokens!r}"
    if partial_rollout:  # handed back part-way, to resume on whatever weights it meets next
        assert finish_reason is None and len(tokens) < NEW_TOKENS and events.extracted_ids == [7]
    else:  # finished where it started, on the weights it started with
        assert finish_reason == "length" and len(tokens) == NEW_TOKENS
        assert set(versions) == {0} and events.extracted_ids == []


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Sink:
    def __init__(self):
        self.reports = []

    def try_start(self, trajectory_id, at_step):
        return True

    def report(self, trajectory_id, *payload):
        self.reports.append(trajectory_id)
        return True


def test_a_stuck_engine_call_shows_after_its_compile_and_a_failed_instance_reports_nothing(
        model, engine):
    """What the driver's watchdog reads (`stalled_s`, on the instance's clock) and what its
    verdict does (`fail`); the threaded driver's side is tests/drivers/test_threaded.py."""
    params, clock, sink = model[1], Clock(), Sink()
    events = Events(queue.Queue())
    instance = RolloutInstance(0, engine, lambda newer: (0, params) if newer < 0 else None, sink,
                               events, clock=clock)
    entered, go, calls = queue.Queue(), [threading.Event(), threading.Event()], []
    real_step = instance.slots.step

    def step(*args, **kwargs):  # the first two decode steps wait for the test
        calls.append(clock())
        entered.put(clock())
        if len(calls) <= 2:
            go[len(calls) - 1].wait(120)
        return real_step(*args, **kwargs)

    instance.slots.step = step
    instance.start()
    try:
        instance.submit(Work([Trajectory(7, np.array([1, 5, 9, 2], np.int32), NEW_TOKENS)]))
        assert entered.get(timeout=120) == 0.0  # the first decode step: its compile
        clock.t = 1000.0
        assert instance.snapshot().stalled_s == 0.0  # not counted, however long
        go[0].set()
        assert entered.get(timeout=120) == 1000.0  # the second: compiled, and stuck
        clock.t = 1042.5
        assert instance.snapshot().stalled_s == 42.5
        instance.fail("made no progress (the test says so)")
        state = instance.snapshot()
        assert not state.alive and state.stalled_s == 0.0
        kind, error, _, _ = events._reports.get_nowait()
        assert kind == "failed" and str(error) == \
            "rollout instance 0 made no progress (the test says so)"
        instance.fail("again")  # once
        assert events._reports.empty()
        with pytest.raises(InstanceFailed):
            instance.submit(Work([Trajectory(8, np.array([1, 5], np.int32), NEW_TOKENS)]))
        go[1].set()  # the stuck call returns: the thread ends, reporting nothing
        instance._thread.join(120)
        assert not instance._thread.is_alive()
        record = instance.slots.records()[0] or Trajectory(7, np.array([1], np.int32), 1)
        assert not instance._report(record, "stop")
        assert sink.reports == [] and events._reports.empty()
    finally:
        go[0].set(), go[1].set()
        instance.stop()
