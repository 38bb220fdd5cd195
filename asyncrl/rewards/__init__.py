"""Reward functions (a registry) and the worker pool that runs them under a timeout."""

from asyncrl.rewards.pool import RewardOutcome, RewardPool
from asyncrl.rewards.registry import REWARDS

__all__ = ["REWARDS", "RewardOutcome", "RewardPool"]
