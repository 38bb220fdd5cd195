"""Routers choose only among eligible instances; eligibility is the staleness rule."""

import numpy as np
import pytest

from asyncrl.coordinator import (
    ClusterView,
    InstanceView,
    LatencyModel,
    PendingQueue,
    Request,
    build_router,
    eligible_new,
    eligible_resume,
)

LAT = LatencyModel(a=0.003, b=2.7e-9, c=0.0057, d=0.0, e=3.8e-6)


def cluster(rows, slots=8):
    """rows: (version, running, queued, kv_tokens)."""
    return ClusterView.from_views([InstanceView(i, v, r, q, kv, slots)
                                   for i, (v, r, q, kv) in enumerate(rows)])


def test_eligible_new_asks_once_per_version_and_needs_a_free_slot():
    cv = cluster([(3, 0, 0, 0), (3, 8, 0, 0), (2, 1, 0, 0), (2, 0, 0, 0), (4, 2, 6, 0)])
    asked = []

    def can_reserve(v):
        asked.append(v)
        return v >= 3

    mask = eligible_new(cv, can_reserve)
    np.testing.assert_array_equal(mask, [True, False, False, False, False])
    assert sorted(asked) == [2, 3]  # instance 4 is full (running + queued = slots)


def test_eligible_resume_needs_version_at_least_v_traj():
    cv = cluster([(1, 0, 0, 0), (2, 0, 0, 0), (3, 8, 0, 0), (3, 0, 0, 0)])
    np.testing.assert_array_equal(eligible_resume(cv, 2), [False, True, False, True])


def test_round_robin_cycles_over_eligible():
    rr = build_router("round_robin", LAT)
    cv = cluster([(0, 0, 0, 0)] * 4)
    mask = np.array([True, False, True, True])
    picks = [rr.choose(cv, mask, Request()) for _ in range(5)]
    assert picks == [0, 2, 3, 0, 2]
    assert rr.choose(cv, np.zeros(4, bool), Request()) is None


def test_least_loaded_picks_fewest_per_slot():
    ll = build_router("least_loaded", None)
    cv = cluster([(0, 5, 0, 0), (0, 2, 2, 0), (0, 1, 0, 0), (0, 0, 0, 0)])
    assert ll.choose(cv, np.array([True, True, True, False]), Request()) == 2
    assert ll.choose(cv, np.array([True, True, False, False]), Request()) == 1


def test_throughput_optimal_prefers_light_and_short_kv():
    to = build_router("throughput_optimal", LAT)
    # Same batch size, one with a heavy KV cache: adding there gains less.
    cv = cluster([(0, 4, 0, 4_000_000), (0, 4, 0, 4_000), (0, 8, 0, 0)], slots=8)
    assert to.choose(cv, np.ones(3, bool), Request(num_seqs=2, prefill_tokens=100)) == 1
    # A full instance gains nothing from more queued work.
    assert to.choose(cv, np.array([False, False, True]), Request(2, 100)) == 2
    with pytest.raises(ValueError, match="latency model"):
        build_router("throughput_optimal", None)


def test_throughput_optimal_gain_matches_the_model():
    to = build_router("throughput_optimal", LAT)
    cv = cluster([(0, 1, 0, 1000), (0, 3, 0, 3000)], slots=16)
    req = Request(num_seqs=4, prefill_tokens=500)
    gains = []
    for i in range(2):
        n, kv = cv.running[i], cv.kv_tokens[i]
        gains.append((n + 4) / LAT.step_time(n + 4, kv + 2000) - n / LAT.step_time(n, kv))
    assert to.choose(cv, np.ones(2, bool), req) == int(np.argmax(gains))


def test_pending_queue_serves_oldest_v_traj_first():
    q = PendingQueue()
    for item, v in [("a", 3), ("b", 1), ("c", 3), ("d", 1), ("e", 2)]:
        q.push(item, v)
    assert list(q) == ["b", "d", "e", "a", "c"]
    assert q.peek_v_traj() == 1
    assert q.remove_if(lambda x: x in "ed") == ["d", "e"]
    assert q.remove_if(lambda x: False) == []
    assert [q.pop() for _ in range(len(q))] == ["b", "a", "c"]


# The authors' TP1 fit of a 14B model: steps grow with the KV cache and the batch.
FIT_14B = LatencyModel(a=0.0019664, b=1.165e-7, c=0.012303, d=0.0049075, e=2.441e-4)


def _kv_cluster(rows, slots=256, capacity=190_000):
    """rows: (version, running, queued, kv_tokens)."""
    return ClusterView.from_views([InstanceView(i, v, r, q, kv, slots, kv_capacity=capacity)
                                   for i, (v, r, q, kv) in enumerate(rows)])


def test_version_first_prefers_the_newest_weights_that_are_worth_it():
    router = build_router("version_first", FIT_14B)
    cv = _kv_cluster([(2, 4, 0, 8_000), (3, 10, 0, 30_000), (3, 2, 0, 4_000)])
    # Instance 0 gains most, but instances 1 and 2 hold newer weights; 2 gains more than 1.
    assert router.choose(cv, np.ones(3, bool), Request(1, 300)) == 2


def test_version_first_makes_a_request_wait_rather_than_overfill_a_cache():
    router = build_router("version_first", FIT_14B)
    full = _kv_cluster([(3, 40, 0, 185_000), (3, 60, 0, 150_000)])
    # Instance 0 has no room for the prompt; instance 1 has room but 60 long sequences
    # make one more worth < 0.2 of what it gains alone: the request waits.
    assert router.choose(full, np.ones(2, bool), Request(1, 8_000)) is None
    idle = _kv_cluster([(3, 40, 0, 185_000), (1, 0, 0, 0)])
    assert router.choose(idle, np.ones(2, bool), Request(1, 8_000)) == 1  # idle always qualifies
    unlimited = cluster([(3, 40, 0, 185_000)], slots=256)  # no capacity reported: no KV check
    assert build_router("version_first", FIT_14B).choose(
        unlimited, np.ones(1, bool), Request(1, 300)) in (0, None)


def test_version_first_checks_its_threshold():
    with pytest.raises(ValueError, match="threshold"):
        from asyncrl.coordinator.routing import VersionFirst
        VersionFirst(FIT_14B, threshold=1.5)
