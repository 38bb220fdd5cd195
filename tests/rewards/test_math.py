import importlib.util
import time

import pytest

from asyncrl.rewards import REWARDS, RewardPool
from asyncrl.rewards.answers import last_boxed
from asyncrl.rewards.math import (
    format_reward,
    gsm8k,
    gsm8k_reference,
    math_verify,
    math_verify_lenient,
    overlong_penalty,
)
from tests.rewards.helpers import wait_for

# gsm8k, format and the penalty need no library; only math_verify's tests need math-verify.
needs_math_verify = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                       reason="math-verify is not installed")

PLUGIN = "tests.rewards._hanging_verifier"


@pytest.mark.parametrize("text, content", [
    (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),           # nested braces kept whole
    (r"\boxed{3} no wait, \boxed{4}", "4"),                 # the last box is the answer
    (r"\boxed{a{b}c} then \fbox{d}", "d"),
    (r"$\boxed 5$.", "5"),                                  # one-token form, no braces
    (r"\boxed {7}", "7"),
    ("ends with \\boxed", None),
    (r"\boxed{3} and then \boxed{4", None),                 # last box cut off: no answer
    (r"\boxed{  }", None),
    (r"\boxedx{3}", None),
    ("the answer is 4", None),
])
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@needs_math_verify
@pytest.mark.parametrize("response, answer, reward", [
    # Equivalent forms.
    (r"The answer is $\boxed{0.5}$", r"\frac{1}{2}", 1.0),
    (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),
    (r"so \boxed{\frac12}", "0.5", 1.0),
    (r"\boxed{\tfrac34}", r"\dfrac{3}{4}", 1.0),
    (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{\sqrt{2}}{2}", 1.0),
    (r"\boxed{(x+1)^2}", "x^2+2x+1", 1.0),
    (r"\boxed{1000}", "1,000", 1.0),
    (r"\boxed{\{2,1\}}", r"\{1,2\}", 1.0),
    # Intervals: the brackets matter.
    (r"$x \in \boxed{(-\infty,2]}$", r"(-\infty, 2]", 1.0),
    (r"\boxed{[1,3)}", "[1, 3)", 1.0),
    (r"\boxed{[1,3]}", "(1,3)", 0.0),
    # The last box decides, both ways (math-verify alone would grade the set {3, 4}).
    (r"I think \boxed{3}, wait, no: \boxed{4}", "4", 1.0),
    (r"I think \boxed{3}, wait, no: \boxed{4}", "3", 0.0),
    # No box: no answer (math_verify_lenient would extract one; see the next test).
    ("so the answer is 5", "5", 0.0),
    # Wrong and unparsable.
    (r"\boxed{\frac{1}{3}}", r"\frac{1}{2}", 0.0),
    (r"\boxed{2}", "-2", 0.0),
    (r"asdf }}{ \boxed{", "2", 0.0),
    ("", "2", 0.0),
    (r"\boxed{\frac{}{", "2", 0.0),
])
def test_math_verify(response, answer, reward):
    assert math_verify(response=response, answer=answer) == reward


@needs_math_verify
def test_math_verify_lenient_extracts_from_unboxed_responses_and_is_graded_strictly():
    from asyncrl.rewards.registry import strict_grader

    assert math_verify_lenient(response="so the answer is 5", answer="5") == 1.0
    assert math_verify_lenient(response=r"\boxed{4} so the answer is 5", answer="5") == 0.0
    assert strict_grader("math_verify_lenient") == "math_verify"
    assert strict_grader("math_verify") == "math_verify"


@needs_math_verify
@pytest.mark.parametrize("answer", [r"\frac{", "", "}{"])
def test_math_verify_refuses_an_unparsable_reference(answer):
    # Broken data must fail loudly, not score every response 0.0.
    with pytest.raises(ValueError, match="reference answer .* could not be parsed"):
        math_verify(response=r"\boxed{1}", answer=answer)


@needs_math_verify
def test_math_verify_turns_its_own_timeout_into_an_error(monkeypatch):
    # math-verify on its own maps a timeout to "not equal", a silent 0.0; ours must fail.
    import asyncrl.rewards.math as math_rewards

    monkeypatch.setattr("math_verify.grader.sympy_expr_eq", lambda *a, **k: time.sleep(5))
    monkeypatch.setattr(math_rewards, "VERIFY_TIMEOUT_S", 1)
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="comparing took over 1 s"):
        math_verify(response=r"\boxed{\sqrt{2}}", answer=r"\sqrt{2}")  # a surd: math-verify's
    assert time.monotonic() - start < 3


@pytest.mark.parametrize("response, answer, reward", [
    (r"She has \boxed{18} dollars.", "Janet sells 16 - 3 - 4 = 9 eggs...\n#### 18", 1.0),
    (r"The total is \boxed{\$1,234.00}.", "#### 1,234", 1.0),
    (r"First 5, then \boxed{72} and 3 more words", "72", 1.0),  # the box, not the last number
    (r"\boxed{\$1,234}", "1234", 1.0),
    (r"\boxed{18 \text{ dollars}}", "#### 18", 1.0),
    (r"it is \boxed{-3}", "#### -3", 1.0),
    (r"\boxed{0.5} of them", "#### .5", 1.0),
    ("She has 18 dollars.", "#### 18", 0.0),  # no box: the prompt asked for one
    (r"\boxed{18 or maybe 19}", "#### 18", 0.0),
    (r"\boxed{about 180}", "#### 18", 0.0),
    (r"\boxed{3,4}", "#### 34", 0.0),  # "3,4" is two numbers, not thirty-four
    (r"\boxed{9 + 9}", "#### 18", 0.0),
    (r"\boxed{no number here}", "#### 18", 0.0),
    (r"\boxed{}", "#### 18", 0.0),
])
def test_gsm8k(response, answer, reward):
    assert gsm8k(response=response, answer=answer) == reward


@pytest.mark.parametrize("answer", ["#### eighteen", "#### 1 2", "", "#### "])
def test_gsm8k_refuses_a_reference_that_is_not_one_number(answer):
    with pytest.raises(ValueError, match="reference answer must be one number"):
        gsm8k_reference(answer)


@pytest.mark.parametrize("response, reward", [
    (r"so \boxed{4}", 1.0), (r"\boxed{\frac{1}{2}} done", 1.0), ("4", 0.0),
    (r"\boxed{}", 0.0), (r"cut off \boxed{4", 0.0), (r"\boxed{3} then \boxed{", 0.0),
])
def test_format(response, reward):
    assert format_reward(response=response, answer="4") == reward
    assert REWARDS.get("format")(response=response) == reward


@pytest.mark.parametrize("length, penalty", [
    (0, 0.0), (80, 0.0), (85, -0.25), (90, -0.5), (100, -1.0), (101, -1.0), (10_000, -1.0),
])
def test_overlong_penalty_is_dapos_linear_ramp(length, penalty):
    assert overlong_penalty(length, max_len=100, buffer=20) == pytest.approx(penalty)


def test_overlong_penalty_edges_and_bad_arguments():
    assert overlong_penalty(100, max_len=100, buffer=0) == 0.0  # buffer 0: a cliff at max_len
    assert overlong_penalty(101, max_len=100, buffer=0) == -1.0
    for (length, max_len, buffer), message in [((1, 0, 0), "max_len must be ≥ 1"),
                                               ((1, 10, 11), "buffer must be in"),
                                               ((-1, 10, 2), "length must be ≥ 0")]:
        with pytest.raises(ValueError, match=message):
            overlong_penalty(length, max_len=max_len, buffer=buffer)


@needs_math_verify
def test_math_rewards_in_the_worker_pool_and_a_hanging_verifier():
    # Real verification in spawned workers (math-verify's SIGALRM must work there). A
    # comparison past math-verify's own limit is the response's doing: scored 0, counted. A
    # hang outside that limit ends as a failed call when the pool kills the worker.
    surd = r"\frac{\sqrt{3}}{2}"  # an expression gold: math-verify grades it
    with RewardPool(num_workers=3, timeout_s=4.0, plugins=(PLUGIN,)) as pool:
        pool.submit("right", "math_verify", response=r"\boxed{\frac{\sqrt3}{2}}", answer=surd)
        pool.submit("wrong", "math_verify", response=r"\boxed{2}", answer="3")
        pool.submit("gsm8k", "gsm8k", response=r"so \boxed{1,234}", answer="#### 1234")
        pool.submit("bad_reference", "math_verify", response="1", answer=r"\frac{")
        pool.submit("hangs", "test_math_verify_hangs", response=r"\boxed{\sqrt{3}/2}", answer=surd)
        pool.submit("hangs_unguarded", "test_math_verify_hangs_unguarded",
                    response=r"\boxed{\sqrt{3}/2}", answer=surd)
        outcomes = wait_for(pool, 6, limit_s=30)
        assert pool.response_errors == 1 and pool.failures == 2
    assert outcomes["right"].reward == 1.0
    assert outcomes["wrong"].reward == 0.0
    assert outcomes["gsm8k"].reward == 1.0
    assert outcomes["bad_reference"].error.startswith("ValueError: math_verify: the reference")
    assert outcomes["bad_reference"].raised
    assert outcomes["hangs"].reward == 0.0 and outcomes["hangs"].ok
    assert outcomes["hangs"].response_error.startswith(
        "TimeoutError: math_verify: comparing took over 1 s")
    assert outcomes["hangs_unguarded"].reward is None and not outcomes["hangs_unguarded"].raised
    assert outcomes["hangs_unguarded"].error == "timeout after 4 s"
