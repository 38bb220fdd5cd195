"""Reward functions (a registry) and the worker pool that runs them under a timeout."""

from asyncrl.rewards import math as _math  # noqa: F401 - registers math_verify, gsm8k, format
from asyncrl.rewards.pool import RewardOutcome, RewardPool
from asyncrl.rewards.registry import REWARDS

__all__ = ["REWARDS", "RewardOutcome", "RewardPool"]
