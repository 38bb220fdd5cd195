"""Registries fail loudly with the registered names; views validate what they are given."""

import numpy as np
import pytest

from asyncrl.coordinator import (
    MIGRATION_POLICIES,
    REDUNDANCY_POLICIES,
    ROUTERS,
    SYNC_POLICIES,
    ClusterView,
    InstanceView,
    Registry,
)


def test_registry_lists_registered_names_on_unknown():
    reg = Registry("widget")

    @reg.register("b")
    def _b():
        return "b"

    @reg.register("a")
    def _a():
        return "a"

    assert reg.names() == ("a", "b")
    assert reg.build("a") == "a"
    with pytest.raises(ValueError, match=r"unknown widget 'c'; registered: a, b"):
        reg.get("c")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(_a)


@pytest.mark.parametrize(
    "registry", [ROUTERS, SYNC_POLICIES, MIGRATION_POLICIES, REDUNDANCY_POLICIES])
def test_policy_registries_error_names_come_from_the_registry(registry):
    with pytest.raises(ValueError) as err:
        registry.get("no_such_policy")
    for name in registry.names():
        assert name in str(err.value)


def test_expected_policies_are_registered():
    assert set(ROUTERS.names()) == {"round_robin", "least_loaded", "throughput_optimal",
                                   "version_first"}
    assert set(SYNC_POLICIES.names()) == {"greedy", "when_idle", "kv_aware"}
    assert set(MIGRATION_POLICIES.names()) == {"none", "balance"}
    assert set(REDUNDANCY_POLICIES.names()) == {"none", "batch", "group", "both"}


def test_cluster_view_round_trips_instance_views():
    views = [InstanceView(i, version=i % 2, running=3 * i, queued=i, kv_tokens=100 * i,
                          num_slots=8, syncing=i == 1) for i in range(3)]
    cv = ClusterView.from_views(views)
    assert len(cv) == 3
    assert [cv.view(i) for i in range(3)] == views
    np.testing.assert_array_equal(cv.load, [0, 4, 8])
    np.testing.assert_array_equal(cv.free, [8, 4, 0])
    assert views[2].free == 0 and views[1].load == 4


def test_views_reject_bad_fields():
    with pytest.raises(ValueError, match="running"):
        InstanceView(0, 0, -1, 0, 0, 4)
    with pytest.raises(ValueError, match="num_slots"):
        InstanceView(0, 0, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="ids must be"):
        ClusterView.from_views([InstanceView(1, 0, 0, 0, 0, 4)])
