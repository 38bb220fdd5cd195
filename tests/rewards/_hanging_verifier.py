"""The real `math_verify` reward with a verifier that hangs, registered only for the tests.

Imported by the reward workers as a plugin (RewardPool(plugins=...)), so the hang happens
inside a spawned worker, where the real reward runs in production. Two kinds of hang:

  * `test_math_verify_hangs`: sympy's comparison never returns. math-verify's own SIGALRM
    limit (set low here) must interrupt it and the call fail with TimeoutError: this proves
    the signal-based timeout works in our spawned workers.
  * `test_math_verify_hangs_unguarded`: the library's `parse` itself never returns, outside
    math-verify's limit; only the pool's per-call timeout can end it (by killing the worker).
"""

import time
from unittest import mock

import asyncrl.rewards.math as math_rewards
from asyncrl.rewards.registry import REWARDS


def _forever(*args, **kwargs):
    while True:
        time.sleep(0.05)


@REWARDS.register("test_math_verify_hangs")
def hanging_comparison(response: str, answer: str) -> float:
    # sympy_expr_eq runs inside verify's SIGALRM-guarded comparison.
    with mock.patch("math_verify.grader.sympy_expr_eq", _forever), \
            mock.patch.object(math_rewards, "VERIFY_TIMEOUT_S", 1):
        return math_rewards.math_verify(response=response, answer=answer)


@REWARDS.register("test_math_verify_hangs_unguarded")
def hanging_parse(response: str, answer: str) -> float:
    with mock.patch("math_verify.parse", _forever):
        return math_rewards.math_verify(response=response, answer=answer)
