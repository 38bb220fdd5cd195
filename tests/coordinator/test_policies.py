"""Sync, migration and redundancy policies."""

import numpy as np
import pytest

from asyncrl.coordinator import (
    Candidate,
    ClusterView,
    InstanceView,
    Move,
    SyncContext,
    build_migration_policy,
    build_redundancy,
    build_sync_policy,
    pick_trajectories,
)


def inst(version=0, running=0, queued=0, slots=100, syncing=False):
    return InstanceView(0, version, running, queued, 0, slots, syncing)


def test_greedy_syncs_whenever_newer_weights_exist():
    greedy = build_sync_policy("greedy")
    assert greedy.should_sync(inst(version=1, running=90), SyncContext(2, True))
    assert not greedy.should_sync(inst(version=2), SyncContext(2, True))
    assert not greedy.should_sync(inst(version=1, syncing=True), SyncContext(2, True))


def test_when_idle_waits_until_the_instance_would_starve():
    idle = build_sync_policy("when_idle", low_watermark=0.5)
    ctx_can, ctx_cannot = SyncContext(3, True), SyncContext(3, False)
    assert idle.should_sync(inst(version=1), ctx_can)  # nothing running: free to pull
    assert not idle.should_sync(inst(version=1, running=10), ctx_can)  # still fed
    assert not idle.should_sync(inst(version=1, running=60), ctx_cannot)  # still busy
    assert idle.should_sync(inst(version=1, running=40, queued=5), ctx_cannot)
    assert not idle.should_sync(inst(version=3), ctx_cannot)
    with pytest.raises(ValueError, match="low_watermark"):
        build_sync_policy("when_idle", low_watermark=2.0)


def test_balance_moves_from_the_busiest_older_instance_to_a_starving_one():
    views = [InstanceView(0, 2, 90, 0, 0, 100), InstanceView(1, 3, 5, 0, 0, 100),
             InstanceView(2, 4, 80, 10, 0, 100), InstanceView(3, 3, 0, 0, 0, 100)]
    cv = ClusterView.from_views(views)
    can = np.array([False, False, True, False])
    moves = build_migration_policy("balance", starve_fraction=0.25, min_gap=8).plan(cv, can)
    # Instance 2 (version 4) is newer than both starving instances: it is never a source.
    # The emptiest (3) takes half the gap first; then 1 takes half of what is left.
    assert moves == [Move(0, 3, 45), Move(0, 1, 20)]
    for m in moves:
        assert cv.version[m.src] <= cv.version[m.dst]
    # An instance that may still take new entries is fed by routing, not migration.
    assert build_migration_policy("balance").plan(cv, np.ones(4, bool)) == []
    assert build_migration_policy("none").plan(cv, can) == []


def test_pick_trajectories_prefers_queued_then_fewest_tokens():
    cands = [Candidate(1, 900, False), Candidate(2, 100, False), Candidate(3, 5000, True),
             Candidate(4, 100, False)]
    assert [c.traj_id for c in pick_trajectories(cands, 3)] == [3, 2, 4]


def test_redundancy():
    none = build_redundancy("none")
    assert none.redundant_batch_size(8) == 8 and none.responses_to_launch(16) == 16
    assert not none.enabled
    both = build_redundancy("both", batch_ratio=1.25, extra_responses=4)
    assert both.redundant_batch_size(8) == 10 and both.responses_to_launch(16) == 20
    assert both.group_complete(16, 16) and not both.group_complete(15, 16)
    with pytest.raises(ValueError, match="batch_ratio"):
        build_redundancy("batch", batch_ratio=0.5)
    with pytest.raises(ValueError, match="extra_responses"):
        build_redundancy("group", extra_responses=-1)


def test_kv_aware_syncs_a_light_instance_with_an_empty_queue():
    kv_aware = build_sync_policy("kv_aware")
    light = InstanceView(0, 1, 20, 0, 10_000, 256, kv_capacity=190_000)
    heavy = InstanceView(0, 1, 60, 0, 150_000, 256, kv_capacity=190_000)
    waiting = InstanceView(0, 1, 20, 5, 10_000, 256, kv_capacity=190_000)
    assert kv_aware.should_sync(light, SyncContext(2, True))
    assert not kv_aware.should_sync(heavy, SyncContext(2, True))
    assert not kv_aware.should_sync(waiting, SyncContext(2, True))
    assert not kv_aware.should_sync(light, SyncContext(1, True))  # nothing newer
    # Unlimited cache: as when_idle (an idle instance pulls, a busy one that can still take
    # work at its version stays).
    assert kv_aware.should_sync(InstanceView(0, 1, 0, 0, 0, 8), SyncContext(2, True))
    assert not kv_aware.should_sync(InstanceView(0, 1, 6, 0, 600, 8), SyncContext(2, True))
    with pytest.raises(ValueError, match="kv_threshold"):
        build_sync_policy("kv_aware", kv_threshold=2.0)
