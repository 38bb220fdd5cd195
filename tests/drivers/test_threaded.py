"""The threaded driver's watchdog: an instance whose snapshot shows its engine stuck in one
call past the deadline is failed once, by name, and its state no longer reaches the core. How
an instance measures `stalled_s` and what `fail` does: tests/rollout/test_instance.py (local),
tests/distributed/test_remote_instance.py (Ray)."""

import dataclasses

import pytest

from asyncrl.drivers.threaded import BrokenReference, ThreadedDriver, stall_reason
from asyncrl.records import InstanceState
from asyncrl.rewards.pool import RewardOutcome
from asyncrl.servers.trajectory import TrajectoryServer


class Instance:
    def __init__(self, i: int, stalled_s: float):
        self.state = dataclasses.replace(InstanceState.starting(i, 4), version=0, running=2,
                                         stalled_s=stalled_s)
        self.failures = []

    def snapshot(self):
        return self.state

    def fail(self, reason):  # as both kinds do: from now on its snapshot says dead
        self.failures.append(reason)
        self.state = dataclasses.replace(self.state, alive=False)


class NoRewards:
    def poll(self):
        return []


def driver(stall_timeout_s):
    return ThreadedDriver(None, TrajectoryServer(), None, NoRewards(), None, tick_s=0.0,
                          stall_timeout_s=stall_timeout_s)


def test_an_instance_stuck_past_the_deadline_is_failed_once_naming_how_long_and_the_setting():
    d = driver(300.0)
    slow, stuck = Instance(0, 300.0), Instance(1, 312.4)
    d.instances = [slow, stuck]
    assert d._gather() == [slow.state]  # 300 s is the deadline, not past it
    assert slow.failures == [] and stuck.failures == [
        "made no progress for 312 s: its engine is stuck in one prefill or decode step, "
        "compiled already (rollout.stall_timeout_s = 300 s; a compile is not counted); failed, "
        "its work is re-routed"]
    assert d._gather() == [slow.state] and len(stuck.failures) == 1


def test_without_a_deadline_nothing_is_failed():
    d = driver(None)
    d.instances = [Instance(0, 1e9)]
    assert d._gather() == [d.instances[0].state] and d.instances[0].failures == []
    assert stall_reason(1e9, None) is None and stall_reason(0.0, 1.0) is None


class Outcomes:
    def __init__(self, *outcomes):
        self.outcomes = list(outcomes)

    def poll(self):
        polled, self.outcomes = self.outcomes, []
        return polled


def test_a_reward_that_raises_whatever_the_response_stops_the_run_naming_the_prompt():
    # A broken reference answer: retrying its prompt would fail again, without end.
    server = TrajectoryServer()
    (t,) = server.add_group(0, prompt_id=17, prompt=[1, 2], group_size=1, max_new_tokens=4,
                           v_traj=0)
    d = ThreadedDriver(None, server, None, Outcomes(
        (t, RewardOutcome(None, "ValueError: math_verify: the reference answer '\\frac{' could "
                                "not be parsed", raised=True))), None, tick_s=0.0)
    d.instances = []
    with pytest.raises(BrokenReference, match=r"for prompt 17 of the task's train split: "
                                              r"ValueError: math_verify: the reference answer"):
        d._gather()


def test_a_response_the_reward_raised_on_is_scored_as_a_failure_not_a_stop():
    server = TrajectoryServer()
    (t,) = server.add_group(0, prompt_id=3, prompt=[1], group_size=1, max_new_tokens=4, v_traj=0)
    d = ThreadedDriver(None, server, None, Outcomes((t, RewardOutcome(None, "timeout after 5 s"))),
                       None, tick_s=0.0)
    d.instances = []
    (scored,) = d._gather()
    assert scored.trajectory_id == t and scored.reward is None


def test_a_response_the_reward_raised_on_alone_is_scored_0_with_its_reason():
    server = TrajectoryServer()
    (t,) = server.add_group(0, prompt_id=5, prompt=[1], group_size=1, max_new_tokens=4, v_traj=0)
    d = ThreadedDriver(None, server, None, Outcomes((t, RewardOutcome(
        0.0, response_error="TimeoutError: math_verify: parsing the response took over 5 s"))),
        None, tick_s=0.0)
    d.instances = []
    (scored,) = d._gather()
    assert (scored.reward, scored.error) == (0.0, "TimeoutError: math_verify: parsing the "
                                                  "response took over 5 s")
