"""Reward functions by name. Each takes keyword arguments and returns a float.

Reward functions run in worker processes (asyncrl/rewards/pool.py), so they must be importable
module-level functions registered here; the worker looks them up by name.
"""

import re

from asyncrl.registry import Registry

REWARDS = Registry("reward function")

_LAST_INTEGER = re.compile(r"-?\d+")


@REWARDS.register("exact_answer")
def exact_answer(response: str, answer: str) -> float:
    """1.0 when the last integer in the response equals the expected answer, else 0.0.

    Taking the last integer lets a model show its working before the result.
    """
    found = _LAST_INTEGER.findall(response.replace(",", ""))
    return 1.0 if found and found[-1] == str(answer).strip() else 0.0


@REWARDS.register("integer_format")
def integer_format(response: str, answer: str | None = None) -> float:
    """1.0 when the response holds an integer at all: the arithmetic tasks' answer format (the
    format check of evaluation; `answer` is accepted and ignored)."""
    del answer
    return 1.0 if _LAST_INTEGER.search(response) else 0.0


@REWARDS.register("answer_first")
def answer_first(response: str, answer: str) -> float:
    """1.0 when the response starts with the expected answer (what follows is ignored).

    A dense enough signal for a randomly initialised model to learn from in a few dozen
    steps (the `:tiny` experiments); real runs use `exact_answer`.
    """
    return 1.0 if response.lstrip().startswith(str(answer).strip()) else 0.0
