"""RolloutInstance on a real engine: what it hands back when the coordinator extracts work."""

import queue

import numpy as np
import pytest

from asyncrl.model import ModelConfig, init_params
from asyncrl.rollout.engine import Engine
from asyncrl.rollout.instance import RolloutInstance
from asyncrl.rollout.messages import Trajectory, Work
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
