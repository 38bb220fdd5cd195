import pytest

from asyncrl.staleness import (
    LEGAL_TRANSITIONS,
    IllegalTransition,
    LifecycleTracker,
    StalenessError,
    TrajectoryState as S,
)


def walk(tracker, trajectory_id, states):
    tracker.add(trajectory_id)
    for state in states:
        tracker.transition(trajectory_id, state)


def test_full_lifecycle_with_interruption_and_migration_is_recorded():
    tracker = LifecycleTracker()
    path = [S.ROUTED, S.RUNNING, S.INTERRUPTED, S.RUNNING, S.INTERRUPTED, S.ROUTED,
            S.RUNNING, S.GENERATED, S.REWARDED, S.OCCUPIED, S.CONSUMED]
    walk(tracker, "t0", path)
    history = tracker.history("t0")
    assert [t.state for t in history] == [S.PENDING] + path
    assert all(a.time <= b.time for a, b in zip(history, history[1:]))
    assert tracker.state("t0") is S.CONSUMED


@pytest.mark.parametrize("start", [s for s in S if s not in (S.CONSUMED, S.ABORTED)])
def test_every_live_state_but_occupied_can_abort(start):
    assert (S.ABORTED in LEGAL_TRANSITIONS[start]) == (start is not S.OCCUPIED)


@pytest.mark.parametrize(
    "path, bad",
    [
        ([], S.RUNNING),  # PENDING -> RUNNING skips routing
        ([S.ROUTED, S.RUNNING], S.REWARDED),  # reward before generation finished
        ([S.ROUTED, S.RUNNING, S.GENERATED, S.REWARDED, S.OCCUPIED], S.ABORTED),
        ([S.ABORTED], S.ROUTED),  # terminal
    ],
)
def test_illegal_transition_names_trajectory_and_both_states(path, bad):
    tracker = LifecycleTracker()
    walk(tracker, 42, path)
    current = tracker.state(42)
    with pytest.raises(IllegalTransition, match=rf"trajectory 42: illegal transition {current.name} -> {bad.name}"):
        tracker.transition(42, bad)
    assert tracker.state(42) is current  # a refused transition changes nothing


def test_unknown_and_duplicate_trajectories_are_errors():
    tracker = LifecycleTracker()
    with pytest.raises(StalenessError, match=r"trajectory 'x': unknown"):
        tracker.transition("x", S.ROUTED)
    tracker.add("x")
    with pytest.raises(IllegalTransition, match=r"trajectory 'x': added twice"):
        tracker.add("x")


def test_forget_only_finished_trajectories():
    tracker = LifecycleTracker()
    walk(tracker, "a", [S.ROUTED])
    with pytest.raises(IllegalTransition, match=r"cannot forget it while ROUTED"):
        tracker.forget("a")
    tracker.transition("a", S.ABORTED)
    assert [t.state for t in tracker.forget("a")] == [S.PENDING, S.ROUTED, S.ABORTED]
    assert len(tracker) == 0
    assert tracker.in_state(S.ABORTED) == []
