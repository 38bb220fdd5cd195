"""Shared by the reward tests: collecting a RewardPool's outcomes."""

import time


def wait_for(pool, n, limit_s=60):
    """Polls until `n` outcomes arrived (keyed as submitted); fails the test after limit_s."""
    outcomes = {}
    deadline = time.monotonic() + limit_s
    while len(outcomes) < n and time.monotonic() < deadline:
        outcomes.update(pool.poll())
        time.sleep(0.02)
    assert len(outcomes) == n, f"only {len(outcomes)} of {n} outcomes arrived"
    return outcomes
