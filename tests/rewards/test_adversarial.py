"""Responses that try to be paid without answering, and honest answers in awkward forms, for
every registered reward. Each case states the score a careful grader gives: one who reads
the final answer where the prompt asked for it and accepts any correct value, but no
restated problem, no unevaluated expression and no list of guesses.

The problem behind the cases is "What is 29 + 55 - 36?" (gold 48) unless a case says
otherwise; the plain rewards serve "Answer with only the number." prompts and the boxed ones
prompts asking for \\boxed{}.
"""

import importlib.util

import pytest

from asyncrl.rewards import REWARDS
from asyncrl.rewards.answers import MAX_ANSWER_CHARS
from asyncrl.rewards.registry import STRICT_GRADERS, strict_grader

needs_math_verify = pytest.mark.skipif(importlib.util.find_spec("math_verify") is None,
                                       reason="math-verify is not installed")

# The three responses that math-verify's own extraction paid 1.0 for (issue 31).
RESTATED = [
    ("The problem is 29 + 55 - 36. I do not know.", "48"),
    ("To find the answer to 84 - 12, we need to perform the subtraction. Subtracting", "72"),
    ("Let x = 3 + 4.", "7"),
]

# (response, gold, score) for the plain style: exact_answer.
PLAIN = [
    # Restating the problem, or its expression, states no answer.
    *[(response, gold, 0.0) for response, gold in RESTATED],
    ("What is 29 + 55 - 36?", "48", 0.0),
    ("29 + 55 - 36", "48", 0.0),
    ("The answer is 29 + 55 - 36.", "48", 0.0),
    ("= 29 + 55 - 36", "48", 0.0),
    # The gold inside the question's own text ("Add 0 to 48."), restated.
    ("Add 0 to 48.", "48", 0.0),
    # Several candidates.
    ("47 or 48", "48", 0.0),
    ("48 or 47", "48", 0.0),
    ("The answer is 47 or 48.", "48", 0.0),
    ("It is either 47 or it is 48", "48", 0.0),
    ("46, 47, 48", "48", 0.0),
    ("46 47 48", "48", 0.0),
    # Empty, whitespace, cut at the token cap.
    ("", "48", 0.0),
    ("   \n\t ", "48", 0.0),
    ("First 29 + 55 = 84, then 84 - 36 =", "48", 0.0),
    ("So the answer is", "48", 0.0),
    # Wrong answers stay wrong.
    ("The answer is 84.", "48", 0.0),
    ("480", "48", 0.0),
    # Honest answers in their many forms.
    ("48", "48", 1.0),
    ("48.", "48", 1.0),
    ("**48**", "48", 1.0),
    ("The answer is 48.", "48", 1.0),
    ("Answer: 48", "48", 1.0),
    ("29 + 55 - 36 = 48", "48", 1.0),
    ("29 + 55 = 84 and 84 - 36 = 48.", "48", 1.0),
    ("The result is 48, which is even.", "48", 1.0),
    ("48\n\nI hope this helps!", "48", 1.0),
    ("I think 47, no, 48", "48", 0.0),  # a list by any other name: no single stated answer
    ("The answer is 47. Wait, the answer is 48.", "48", 1.0),  # the last stated answer
    (r"\boxed{48}", "48", 1.0),  # a box where none was asked is still an answer
    ("48.0", "48", 1.0),
    # Units, separators, signs.
    ("The answer is 1,234 apples.", "1234", 1.0),
    ("The total is $1,234.", "1234", 1.0),
    ("1,234", "1234", 1.0),
    ("12,34", "1234", 0.0),  # not a thousands separator: two numbers
    ("The answer is -3.", "-3", 1.0),
    ("The answer is −3.", "-3", 1.0),  # a Unicode minus
    ("25 - 28 = -3", "-3", 1.0),
    ("3", "-3", 0.0),
]

# (response, gold, score) for \boxed{} prompts: math_verify.
BOXED = [
    *[(response, gold, 0.0) for response, gold in RESTATED],
    (r"\boxed{29 + 55 - 36}", "48", 0.0),
    (r"\boxed{6 \times 8}", "48", 0.0),
    (r"\boxed{6 \cdot 8}", "48", 0.0),
    (r"\boxed{What is 29 + 55 - 36?}", "48", 0.0),
    (r"\boxed{47 \text{ or } 48}", "48", 0.0),
    (r"\boxed{47 \lor 48}", "48", 0.0),
    (r"\boxed{47, 48}", "48", 0.0),
    (r"\boxed{47, 48, 49}", "48", 0.0),
    # Several boxes: the last is the final answer (a correction), so boxing guesses gains
    # nothing: only one of them can be last.
    (r"I think \boxed{47}, wait, no: \boxed{48}", "48", 1.0),
    (r"\boxed{48} or maybe \boxed{47}", "48", 0.0),
    ("", "48", 0.0),
    ("  \n ", "48", 0.0),
    (r"\boxed{}", "48", 0.0),
    (r"\boxed{ }", "48", 0.0),
    (r"so the answer is \boxed{4", "48", 0.0),  # cut at the token cap inside the box
    (r"\boxed{47} hmm, \boxed{4", "48", 0.0),  # an earlier box was abandoned
    ("The answer is 48.", "48", 0.0),  # the prompt asked for a box
    (r"\boxed{48}", "48", 1.0),
    (r"The answer is $\boxed{48}$.", "48", 1.0),
    (r"\boxed{48 \text{ apples}}", "48", 1.0),
    (r"\boxed{48^\circ}", "48", 1.0),
    (r"\boxed{x = 48}", "48", 1.0),
    (r"\boxed{1,234}", "1234", 1.0),
    (r"\boxed{1{,}234}", "1234", 1.0),
    (r"\boxed{-3}", "-3", 1.0),
    (r"\boxed{3}", "-3", 0.0),
    (r"\boxed{\frac{1}{2}}", "0.5", 1.0),
    (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
    (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),
    (r"\boxed{\dfrac{2}{4}}", r"\frac12", 1.0),
    (r"\boxed{3+2\sqrt{2}}", r"3+2\sqrt{2}", 1.0),
    (r"\boxed{2\sqrt{2}+3}", r"3+2\sqrt{2}", 1.0),
    (r"\boxed{2+3i}", "2+3i", 1.0),
    (r"\boxed{3 \times 10^{5}}", "300000", 1.0),
    (r"\boxed{1 - 2}", "1 - 2", 1.0),  # a form the gold itself uses is an answer
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}", 1.0),
]

# (response, gold, score) for gsm8k: one boxed number, GSM8K references.
GSM8K = [
    *[(response, gold, 0.0) for response, gold in RESTATED],
    ("She has 48 dollars.", "#### 48", 0.0),
    (r"\boxed{29 + 55 - 36}", "#### 48", 0.0),
    (r"\boxed{47 \text{ or } 48}", "#### 48", 0.0),
    (r"\boxed{47, 48}", "#### 48", 0.0),
    (r"\boxed{48", "#### 48", 0.0),
    ("", "#### 48", 0.0),
    (r"\boxed{48}", "#### 48", 1.0),
    (r"\boxed{\$48.00}", "#### 48", 1.0),
    (r"\boxed{48 \text{ dollars}}", "#### 48", 1.0),
    (r"\boxed{1,234}", "#### 1,234", 1.0),
    (r"\boxed{-3}", "#### -3", 1.0),
]


@pytest.mark.parametrize("response, gold, score", PLAIN)
def test_exact_answer_pays_only_a_stated_answer(response, gold, score):
    assert REWARDS.get("exact_answer")(response=response, answer=gold) == score
    # The format check agrees: a correct score needs a stated answer.
    if score == 1.0:
        assert REWARDS.get("integer_format")(response=response) == 1.0


WRONG_BUT_STATED = {"The answer is 84.", "480", "3"}


@pytest.mark.parametrize("response", [r for r, _, score in PLAIN
                                      if score == 0.0 and r not in WRONG_BUT_STATED])
def test_integer_format_sees_no_answer_in_a_non_answer(response):
    assert REWARDS.get("integer_format")(response=response) == 0.0


@needs_math_verify
@pytest.mark.parametrize("response, gold, score", BOXED)
def test_math_verify_pays_only_one_boxed_value(response, gold, score):
    assert REWARDS.get("math_verify")(response=response, answer=gold) == score


@pytest.mark.parametrize("response, gold, score", GSM8K)
def test_gsm8k_pays_only_one_boxed_number(response, gold, score):
    assert REWARDS.get("gsm8k")(response=response, answer=gold) == score


@pytest.mark.parametrize("response, score", [
    (r"\boxed{48}", 1.0), (r"\boxed{}", 0.0), (r"\boxed{4", 0.0), ("48", 0.0), ("", 0.0),
])
def test_format_reports_the_missing_box(response, score):
    assert REWARDS.get("format")(response=response) == score


@pytest.mark.parametrize("response, score", [
    ("3", 1.0), (" 3 ", 1.0), ("33", 0.5), ("3+1", 1 / 3), ("3333", 0.25), ("13", 0.0),
    ("", 0.0), ("2", 0.0),
])
def test_answer_first_pays_the_answer_in_full_only_when_nothing_follows(response, score):
    # Partial credit by design (it teaches the tiny model to stop), so its runs are graded by
    # exact_answer, under which "3+1" is no answer.
    assert REWARDS.get("answer_first")(response=response, answer="3") == pytest.approx(score)
    assert strict_grader("answer_first") == "exact_answer"
    assert REWARDS.get("exact_answer")(response="3+1", answer="3") == 0.0


@needs_math_verify
@pytest.mark.parametrize("response, gold", RESTATED)
def test_the_lenient_math_reward_is_gameable_and_graded_strictly(response, gold):
    # What issue 31 measured: math-verify's extraction pays for a restated problem. Kept by
    # name only; evaluation grades with its strict counterpart.
    assert REWARDS.get("math_verify_lenient")(response=response, answer=gold) == 1.0
    assert REWARDS.get(strict_grader("math_verify_lenient"))(response=response, answer=gold) == 0.0


def test_every_lenient_reward_names_a_registered_strict_grader():
    for lenient, strict in STRICT_GRADERS.items():
        assert lenient in REWARDS and strict in REWARDS and strict not in STRICT_GRADERS


@needs_math_verify
@pytest.mark.parametrize("name", ["math_verify", "gsm8k", "exact_answer"])
def test_very_long_and_deeply_nested_latex_is_no_answer(name):
    gold = "#### 48" if name == "gsm8k" else "48"
    long_sum = r"\boxed{" + "1+" * 5000 + "1}"
    nested = r"\boxed{" + r"\frac{1}{" * 300 + "48" + "}" * 300 + "}"
    for response in (long_sum, nested, "48" * 10_000):
        assert REWARDS.get(name)(response=response, answer=gold) == 0.0


@needs_math_verify
def test_nesting_under_the_length_cap_is_scored_or_times_out_never_paid():
    depth = (MAX_ANSWER_CHARS - 10) // 10
    nested = r"\boxed{" + r"\frac{1}{" * depth + "48" + "}" * depth + "}"
    try:
        assert REWARDS.get("math_verify")(response=nested, answer="48") == 0.0
    except TimeoutError:
        pass  # a failed call in the pool: never a reward
