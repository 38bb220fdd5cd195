"""The staleness protocol (pure Python, no JAX): virtual buffers and trajectory lifecycles."""

from asyncrl.staleness.errors import StalenessError
from asyncrl.staleness.lifecycle import (
    LEGAL_TRANSITIONS,
    IllegalTransition,
    LifecycleTracker,
    TrajectoryState,
)
from asyncrl.staleness.manager import BufferStatus, StalenessManager

__all__ = [
    "BufferStatus",
    "IllegalTransition",
    "LEGAL_TRANSITIONS",
    "LifecycleTracker",
    "StalenessError",
    "StalenessManager",
    "TrajectoryState",
]
