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


@REWARDS.register("test_chokes_on_tower")
def chokes_on_tower(response: str, answer: str) -> float:
    """A grader a response can break (as math-verify breaks on a power tower)."""
    if "^{9^{9" in response:
        raise TimeoutError("verifying took too long")
    return float(response == answer)


@REWARDS.register("test_reference_unreadable")
def reference_unreadable(response: str, answer: str) -> float:
    """A grader that fails on its reference, whatever the response."""
    raise ValueError(f"the reference answer {answer!r} could not be parsed")
