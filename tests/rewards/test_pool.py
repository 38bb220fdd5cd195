import time

import pytest

from asyncrl.rewards import REWARDS, RewardPool
from asyncrl.rewards.registry import exact_answer
from tests.rewards.helpers import wait_for

HOSTILE = "tests.rewards._hostile"


@pytest.fixture(scope="module")
def pool():
    with RewardPool(num_workers=2, timeout_s=1.5, plugins=(HOSTILE,)) as p:
        yield p


def test_scores_come_back_under_their_keys(pool):
    pool.submit("a", "exact_answer", response="so 3 + 4 = 7", answer="7")
    pool.submit("b", "exact_answer", response="it is 8", answer="7")
    outcomes = wait_for(pool, 2)
    assert outcomes["a"].reward == 1.0 and outcomes["a"].ok
    assert outcomes["b"].reward == 0.0


def test_a_hanging_raising_or_crashing_reward_fails_only_its_own_call(pool):
    failures_before = pool.failures
    pool.submit("hang", "test_sleep", seconds=60, value=1.0)
    pool.submit("raise", "test_raise", message="bad verifier")
    pool.submit("exit", "test_exit")
    pool.submit("fine", "test_sleep", seconds=0, value=0.5)
    start = time.monotonic()
    outcomes = wait_for(pool, 4)
    assert time.monotonic() - start < 20  # the hung call did not hold the pool up
    assert outcomes["hang"].error == "timeout after 1.5 s" and outcomes["hang"].reward is None
    assert outcomes["raise"].error == "ValueError: bad verifier"
    assert outcomes["exit"].error.startswith("worker died")
    assert outcomes["fine"].reward == 0.5
    assert pool.failures - failures_before == 3
    # The replaced workers serve new calls.
    pool.submit("after", "exact_answer", response="12", answer="12")
    assert wait_for(pool, 1)["after"].reward == 1.0


def test_a_reward_that_fails_on_the_response_alone_scores_it_0_and_counts_it(pool):
    failures, response_errors = pool.failures, pool.response_errors
    pool.submit("tower", "test_chokes_on_tower", response=r"\boxed{9^{9^{9^{9}}}}", answer="7")
    pool.submit("right", "test_chokes_on_tower", response="7", answer="7")
    pool.submit("reference", "test_reference_unreadable", response="7", answer="\\frac{")
    pool.submit("no_response", "test_reference_unreadable", response="", answer="\\frac{")
    outcomes = wait_for(pool, 4)
    # The response's fault (the reward succeeds on an empty response): a 0 to learn from.
    tower = outcomes["tower"]
    assert tower.ok and tower.reward == 0.0 and not tower.raised
    assert tower.response_error == "TimeoutError: verifying took too long"
    assert outcomes["right"].reward == 1.0 and outcomes["right"].response_error is None
    # The reference's (it fails whatever the response): a failed call, loudly.
    for key in ("reference", "no_response"):
        assert not outcomes[key].ok and outcomes[key].raised and outcomes[key].reward is None
        assert outcomes[key].error.startswith("ValueError: the reference answer")
    assert (pool.failures - failures, pool.response_errors - response_errors) == (2, 1)


def test_map_returns_every_outcome_in_order(pool):
    outcomes = pool.map("exact_answer", [{"response": str(n), "answer": "3"} for n in range(6)])
    assert [o.reward for o in outcomes] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0]


def test_unknown_reward_name_lists_the_registered_ones(pool):
    pool.submit("x", "exact_answr", response="1", answer="1")
    outcome = wait_for(pool, 1)["x"]
    assert "unknown reward function 'exact_answr'" in outcome.error
    assert "exact_answer" in outcome.error
    assert outcome.raised and outcome.response_error is None


def test_bad_pool_settings():
    with pytest.raises(ValueError, match="num_workers must be ≥ 1, got 0"):
        RewardPool(num_workers=0)
    with pytest.raises(ModuleNotFoundError):
        RewardPool(plugins=("no.such.module",))


@pytest.mark.parametrize("response, answer, reward", [
    ("7", "7", 1.0), ("The answer is 1,234.", "1234", 1.0), ("-3", "-3", 1.0),
    ("7 or maybe 8", "7", 0.0), ("no digits", "7", 0.0), ("17", "7", 0.0),
])
def test_exact_answer(response, answer, reward):
    assert exact_answer(response, answer) == reward
    assert "exact_answer" in REWARDS
