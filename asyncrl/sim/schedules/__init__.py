"""Schedules: the policies compared by the simulator, each registered by name in SCHEDULES.

Importing this package registers them all; each module documents the system it models.
"""

from asyncrl.sim.schedules import areal, roll, slime, staleflow, synchronous, verl  # noqa: F401
from asyncrl.sim.schedules.base import SCHEDULES, Schedule

__all__ = ["SCHEDULES", "Schedule"]
