"""The watch that says when the first batches carry no learning signal, and why
(asyncrl/run/learning_signal.py); the end-to-end runs are in tests/test_system.py."""

import pytest

from asyncrl.run.learning_signal import LearningSignalWatch, no_signal_groups, signal_figures


def batch(groups, format_rate=None, cut_rate=0.0):
    figures = {**signal_figures(groups), "cut_rate": cut_rate}
    if format_rate is not None:
        figures["format_rate"] = format_rate
    return figures


def watch():
    return LearningSignalWatch("exact_answer", "task.instruction", group_size=2)


def messages(batches):
    w = watch()
    return [w.update(step, b) for step, b in enumerate(batches, 1)]


def test_groups_with_equal_rewards_are_counted():
    assert no_signal_groups([[1, 1], [0, 1], [0.5, 0.5], [0, 0]]) == 3


@pytest.mark.parametrize("groups, format_rate, cut_rate, why", [
    ([[1, 1], [1, 1]], 1.0, 0.0, "every response already earns full reward: the model solves"),
    ([[0, 0], [0, 0]], 0.5, 0.0, "every response scores 0: the task is too hard"),
    ([[0, 0], [0, 0]], 0.5, 0.75, "75% of responses were cut at rollout.max_new_tokens"),
    ([[0, 0], [0, 0]], 0.0, 0.0, "(format rate 0): task.instruction and the grader disagree"),
    ([[0.5, 0.5], [0, 0]], None, 0.0, "reward 0 to 0.5), so no batch carries a learning signal: "
                                      "raise rollout.group_size"),
], ids=["solved", "too-hard", "cut", "format", "alike"])
def test_three_batches_without_signal_are_named_once_with_the_cause(groups, format_rate,
                                                                      cut_rate, why):
    said = messages([batch(groups, format_rate, cut_rate)] * 5)
    assert said[:2] == [None, None] and said[3:] == [None, None]
    assert said[2].startswith("steps 1-3: every one of 6 groups scored all its 2 responses alike")
    assert why in said[2]


def test_one_group_with_signal_in_the_first_steps_means_nothing_is_said():
    assert messages([batch([[0, 0]]), batch([[0, 1]]), batch([[0, 0]]), batch([[0, 0]])]) == \
        [None] * 4


def test_a_resumed_run_past_its_first_steps_is_not_looked_at():
    w = watch()
    assert [w.update(step, batch([[0, 0]])) for step in (7, 8, 9)] == [None] * 3


def test_groups_dynamic_sampling_dropped_before_the_first_batches_are_named_once():
    w = watch()
    assert w.filtered(0, 5, 0, batch_size=2) is None  # fewer than 3 batches' worth
    said = w.filtered(0, 6, 0, batch_size=2)
    assert said.startswith("coordinator.dynamic_sampling dropped 6 groups whose 2 responses "
                           "all scored alike before batch 1 formed")
    assert w.filtered(0, 9, 0, batch_size=2) is None


def test_groups_dropped_beside_groups_kept_are_the_filter_working_not_a_missing_signal():
    # A hard task: most groups agree (all wrong), some differ; their batch forms slowly.
    w = watch()
    assert w.filtered(0, 50, 1, batch_size=2) is None
    assert w.filtered(0, 6, 0, batch_size=2) is not None  # nothing kept: named


def test_a_run_whose_batches_have_signal_is_not_named_for_what_dynamic_sampling_dropped():
    w = watch()
    assert w.update(1, batch([[0, 1]])) is None
    assert w.filtered(1, 100, 0, batch_size=2) is None
