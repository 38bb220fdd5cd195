"""Reward functions that misbehave, registered only by the tests that need them."""

import os
import time

from asyncrl.rewards.registry import REWARDS


@REWARDS.register("test_sleep")
def sleep_then_score(seconds: float, value: float) -> float:
    time.sleep(seconds)
    return value


@REWARDS.register("test_raise")
def always_raise(message: str) -> float:
    raise ValueError(message)


@REWARDS.register("test_exit")
def kill_own_process() -> float:
    os._exit(3)
