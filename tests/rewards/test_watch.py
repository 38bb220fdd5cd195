import pytest

from asyncrl.rewards.watch import BatchAnswers, RewardHackingWatch


def feed(watch, batches):
    return [watch.update(BatchAnswers(*b)) for b in batches]


def test_a_run_learning_to_answer_is_never_flagged():
    # Reward and format rise together, every full reward stated: what a strict reward gives.
    watch = RewardHackingWatch()
    assert not any(feed(watch, [(0.1 * i, 0.5 + 0.05 * i, 0.0) for i in range(10)]))


def test_full_reward_without_the_format_is_flagged_at_once_and_warned_about_once():
    watch = RewardHackingWatch(window=3, threshold=0.1)
    flags = feed(watch, [(0.2, 0.6, 0.0), (0.4, 0.5, 0.3)])
    assert flags == [False, True] and watch.turned_on
    assert "15% of the last 2 batches' responses were rewarded without an answer" in watch.why
    assert feed(watch, [(0.5, 0.5, 0.3)]) == [True] and not watch.turned_on


def test_reward_rising_while_the_format_falls_is_flagged():
    watch = RewardHackingWatch(window=3, threshold=0.1)
    # Reward 0.1 -> 0.5 while the share stating an answer falls 0.6 -> 0.3; no batch pays an
    # unstated answer in full (a reward paying partial credit for restating, say).
    batches = [(0.1, 0.6, 0.0)] * 3 + [(0.3, 0.45, 0.0), (0.5, 0.3, 0.0), (0.5, 0.3, 0.0),
                                       (0.5, 0.3, 0.0)]
    flags = feed(watch, batches)
    assert flags[:4] == [False] * 4 and flags[-1]
    assert "rose by 0.40" in watch.why and "fell by 0.30" in watch.why


def test_noise_under_the_threshold_is_not_flagged():
    watch = RewardHackingWatch(window=3, threshold=0.1)
    assert not any(feed(watch, [(0.1, 0.6, 0.04), (0.15, 0.55, 0.04), (0.2, 0.57, 0.0)] * 3))


@pytest.mark.parametrize("window, threshold", [(0, 0.1), (3, 0.0), (3, 1.0)])
def test_bad_settings(window, threshold):
    with pytest.raises(ValueError, match="window ≥ 1 and threshold in"):
        RewardHackingWatch(window, threshold)
