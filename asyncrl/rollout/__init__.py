"""Rollout: the JetStream-style slot engine and the instances that drive it."""

from asyncrl.rollout.engine import DecodeState, Engine, Prefix, StepResult, Trajectory
from asyncrl.rollout.sampling import SamplingParams

__all__ = ["DecodeState", "Engine", "Prefix", "SamplingParams", "StepResult", "Trajectory"]
