"""Late binding (PSRL): an entry's V_traj follows its instances' weights until it starts."""

from __future__ import annotations

import numpy as np

from asyncrl.coordinator.view import ClusterView
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import TrajectoryState


def late_bind(cluster: ClusterView, server: TrajectoryServer, admission, bound_at: np.ndarray,
              dead: set[int]) -> int:
    """Entries none of whose responses has started take the newest V_traj their instances
    allow: every token will come from the weights an instance holds from now on. `bound_at`
    (the versions seen so far, per instance) is updated; returns how many entries moved."""
    moved = np.flatnonzero(cluster.version > bound_at)
    if len(moved) == 0:
        return 0
    bound_at[moved] = cluster.version[moved]
    entries = set()
    for i in moved.tolist():
        if i in dead:
            continue
        for t in server.held_by(i):
            if server.state(t) is TrajectoryState.ROUTED:
                entries.add(server.entry_of(t))
    rebound = 0
    for entry in sorted(entries):
        members = server.members(entry)
        if any(server.state(m) is not TrajectoryState.ROUTED for m in members):
            continue  # a response started (or finished): its tokens pin V_traj
        v = int(min(cluster.version[server.instance_of(m)] for m in members))
        if v > server.v_traj(entry) and admission.rebind(entry, v):
            server.rebind(entry, v)
            rebound += 1
    return rebound
