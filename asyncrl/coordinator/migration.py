"""Migration: a starving instance takes trajectories from an overloaded one.

Long-tail responses pile up unevenly: late in a version window some instances still run many
long trajectories while others have nothing they may take (no reservable slot at their
version). Moving work from the first to the second shortens the tail, because a lighter
batch decodes each sequence faster (fewer KV tokens read per step).

Staleness is kept: a trajectory of an entry with V_traj only moves to an instance of version
≥ the source's version ≥ V_traj. A moved trajectory keeps its tokens and log-probs and is
re-prefilled on the target (prompt + tokens so far), so queued work is moved first (free),
then the running trajectories with the fewest tokens (cheapest to re-prefill).

  none     never migrate;
  balance  pair each starving instance (load ≤ starve_fraction of its slots, and no new entry
           may land at its version) with the most loaded instance of version ≤ its own, and
           move half the difference when the source holds ≥ min_gap more trajectories.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from asyncrl.registry import Registry
from asyncrl.coordinator.view import ClusterView
from asyncrl.servers.trajectory import TrajectoryServer
from asyncrl.staleness import TrajectoryState

MIGRATION_POLICIES = Registry("migration policy")


@dataclasses.dataclass(frozen=True, slots=True)
class Move:
    src: int
    dst: int
    count: int


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """A trajectory on the source instance that could move."""

    traj_id: int | str
    tokens: int  # prompt + generated so far: what the target must re-prefill
    queued: bool  # waiting for a slot on the source: nothing to re-prefill yet


def pick_trajectories(candidates: Sequence[Candidate], count: int) -> list[Candidate]:
    """The `count` cheapest to move: queued ones first, then fewest tokens; ties by order."""
    order = sorted(range(len(candidates)),
                   key=lambda i: (not candidates[i].queued, candidates[i].tokens, i))
    return [candidates[i] for i in order[:count]]


class MigrationPolicy:
    moves_work = True  # False: the core never asks for a plan

    def plan(self, cluster: ClusterView, can_dispatch_new: np.ndarray) -> list[Move]:
        """Moves to make now. `can_dispatch_new[i]`: a new entry may land at instance i."""
        raise NotImplementedError


@MIGRATION_POLICIES.register("none")
class NoMigration(MigrationPolicy):
    moves_work = False

    def plan(self, cluster, can_dispatch_new):
        return []


@MIGRATION_POLICIES.register("balance")
class Balance(MigrationPolicy):
    def __init__(self, starve_fraction: float = 0.25, min_gap: int = 8, max_moves: int = 64):
        if not 0.0 <= starve_fraction < 1.0:
            raise ValueError(f"balance: starve_fraction must be in [0, 1), got {starve_fraction}")
        if min_gap < 2 or max_moves < 1:
            raise ValueError(
                f"balance: need min_gap ≥ 2 and max_moves ≥ 1, got {min_gap}, {max_moves}")
        self.starve_fraction = starve_fraction
        self.min_gap = min_gap
        self.max_moves = max_moves

    def plan(self, cluster, can_dispatch_new):
        load = (cluster.running + cluster.queued).astype(np.int64)
        busy = cluster.syncing
        starving = (load <= self.starve_fraction * cluster.num_slots) & ~can_dispatch_new & ~busy
        if not starving.any():
            return []
        load = load.copy()
        moves: list[Move] = []
        sources = ~busy & ~starving
        # The most any source holds; it only falls as moves drain sources. Targets come
        # emptiest first, so once even it is within min_gap of one, it is of every later one.
        most = int(load[sources].max()) if sources.any() else 0
        # The emptiest first; each pick updates `load`, so one source is not drained twice.
        for dst in np.flatnonzero(starving)[np.argsort(load[starving], kind="stable")]:
            if most - load[dst] < self.min_gap:
                break
            ok = (cluster.version <= cluster.version[dst]) & sources
            if not ok.any():
                continue
            src = int(np.flatnonzero(ok)[np.argmax(load[ok])])
            gap = int(load[src] - load[dst])
            if gap < self.min_gap:
                continue
            count = gap // 2
            moves.append(Move(src, int(dst), count))
            load[src] -= count
            load[dst] += count
            most = int(load[sources].max())
            if len(moves) >= self.max_moves:
                break
        return moves


def build_migration_policy(name: str, **kwargs) -> MigrationPolicy:
    return MIGRATION_POLICIES.build(name, **kwargs)


def movable(server: TrajectoryServer, instance: int, decode_steps: int,
            partial_rollout: bool) -> list[Candidate]:
    """What migration may take from `instance`: queued work, and running work when partial
    rollout lets a trajectory go on elsewhere (`decode_steps`: the instance's count, which
    dates how many tokens a running one has)."""
    candidates = []
    for t in server.held_by(instance):
        state, prompt, tokens, started = server.progress(t)
        if state is TrajectoryState.RUNNING:
            if not partial_rollout:
                continue  # resumed on other weights it would mix versions
            tokens += decode_steps - started
        candidates.append(Candidate(t, prompt + tokens, state is TrajectoryState.ROUTED))
    return candidates

