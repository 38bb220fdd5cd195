"""The coordinator's policies: pure Python (numpy), no model or JAX code.

The real coordinator thread and the cluster simulator (`asyncrl.sim`) drive the same policy
objects, so a simulated schedule is the system's schedule. Each family has a registry; a
config picks a policy by name, and an unknown name fails listing the registered ones.
"""

from asyncrl.coordinator.latency import LatencyModel
from asyncrl.coordinator.migration import (
    MIGRATION_POLICIES,
    Candidate,
    MigrationPolicy,
    Move,
    build_migration_policy,
    pick_trajectories,
)
from asyncrl.coordinator.redundancy import REDUNDANCY_POLICIES, Redundancy, build_redundancy
from asyncrl.registry import Registry
from asyncrl.coordinator.routing import (
    ROUTERS,
    DISPATCH_MODES,
    BINDINGS,
    PendingQueue,
    Request,
    Router,
    build_router,
    eligible_new,
    eligible_resume,
)
from asyncrl.coordinator.sync import SYNC_POLICIES, SyncContext, SyncPolicy, build_sync_policy
from asyncrl.coordinator.view import ClusterView, InstanceView

__all__ = [
    "Candidate",
    "ClusterView",
    "InstanceView",
    "LatencyModel",
    "MIGRATION_POLICIES",
    "MigrationPolicy",
    "Move",
    "PendingQueue",
    "REDUNDANCY_POLICIES",
    "ROUTERS",
    "DISPATCH_MODES",
    "BINDINGS",
    "Redundancy",
    "Registry",
    "Request",
    "Router",
    "SYNC_POLICIES",
    "SyncContext",
    "SyncPolicy",
    "build_migration_policy",
    "build_redundancy",
    "build_router",
    "build_sync_policy",
    "eligible_new",
    "eligible_resume",
    "pick_trajectories",
]
