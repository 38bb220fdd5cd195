"""Responses that try to be paid without answering, and honest answers in awkward forms, for
every registered reward. Each case states the score a careful grader gives: one who reads
the final answer where the prompt asked for it and accepts any correct value, but no
restated problem, no unevaluated expression and no list of guesses.

The problem behind the cases is "What is 29 + 55 - 36?" (gold 48) unless a case says
otherwise; the plain rewards serve "Answer with only the number." prompts and the boxed ones
prompts asking for \\boxed{}.
"""

import importlib.util
import time

import pytest

from asyncrl.rewards import REWARDS
from asyncrl.rewards.answers import MAX_ANSWER_CHARS
from asyncrl.rewards.registry import STRICT_GRADERS, format_check, strict_grader

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
    (r"\boxed{\dfrac{2}{4}}", r"\frac12", 0.0),  # not reduced: an operation, 2 divided by 4
    (r"\boxed{3+2\sqrt{2}}", r"3+2\sqrt{2}", 1.0),
    (r"\boxed{2\sqrt{2}+3}", r"3+2\sqrt{2}", 1.0),
    (r"\boxed{2+3i}", "2+3i", 1.0),
    (r"\boxed{3 \times 10^{5}}", "300000", 0.0),  # an operation over literals, for a number
    # A gold written as an operation is graded by equivalence: its value, or its own form.
    (r"\boxed{-1}", "1 - 2", 1.0),
    (r"\boxed{1 - 2}", "1 - 2", 1.0),
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
def test_nesting_under_the_length_cap_is_refused_at_once_for_a_numeric_gold():
    # An operation over literals (or nesting past the parser's depth): math-verify, which
    # used to spend its time limit here, is never asked.
    depth = (MAX_ANSWER_CHARS - 10) // 10
    nested = r"\boxed{" + r"\frac{1}{" * depth + "48" + "}" * depth + "}"
    start = time.monotonic()
    assert REWARDS.get("math_verify")(response=nested, answer="48") == 0.0
    assert time.monotonic() - start < 1.0


# ---------------------------------------------------------------- values, not restatements
# Issue 43. Where the gold is a number the final answer is parsed, never evaluated
# (asyncrl/rewards/literal.py): only a literal equal to the gold pays. The problem behind most
# cases: "What is 34 + 21 - 5?" (gold 50). Each grader reads the box: math_verify and gsm8k
# because the prompt asked for one, exact_answer because a response that opens a box states
# its answer there.

NUMERIC_GRADERS = ["math_verify", "gsm8k", "exact_answer"]

# (box content, gold): an operation over literals equal to the gold, in one dress or another.
RESTATEMENTS = [
    ("34+21-5", "50"), ("(34)+(21)-(5)", "50"), (r"34\,+\,21\,-\,5", "50"), ("55 − 5", "50"),
    ("55 – 5", "50"), ("{34}+{21}-{5}", "50"),
    (r"\left(34\right)+\left(21\right)-\left(5\right)", "50"),
    (r"34 \; + \; 21 \quad - ~5", "50"), ("５５－５", "50"), (r"\text{34+21-5}", "50"),
    (r"\mathbf{34}+21-5", "50"), (r"\$34+\$21-\$5", "50"), ("50+0", "50"), ("--50", "50"),
    ("-(-50)", "50"), ("100/2", "50"), (r"\frac{100}{2}", "50"), (r"\frac{50}{1}", "50"),
    ("2/4", "0.5"), (r"\dfrac{2}{4}", "0.5"), ("2^{5}", "32"), ("2^5", "32"), ("7²+1", "50"),
    ("2^{10}", "1024"), (r"\sqrt{2500}", "50"), (r"\sqrt[3]{125000}", "50"), ("2500^{1/2}", "50"),
    (r"5 \times 10", "50"), (r"5 \cdot 10", "50"), ("5 × 10", "50"), ("5*10", "50"),
    (r"100 \div 2", "50"), ("2(25)", "50"), ("(5)(10)", "50"), ("10!", "3628800"),
    (r"3 \times 10^{5}", "300000"), ("1,000+0", "1000"),
    # Units of several words or abbreviations are units, in the gold and in the box alike.
    (r"25+25 \text{ sq. ft}", r"50 \text{ sq. ft}"), (r"100/2 \text{ m/s}", r"50 \text{ m/s}"),
]
# (box content, gold, whether `format` counts it): two answers, or one with an alternative.
# gsm8k's and exact_answer's format checks know the answer is one number; `format` (MATH,
# whose answers may be several "separated by commas", and which knows no gold) refuses only
# alternatives and restatements.
HEDGES = [
    (r"49 \text{, } 50", "50", True), ("49, 50", "50", True), ("50, 49", "50", True),
    ("49; 50", "50", True), ("49 50", "50", True), (r"49 \text{ and } 50", "50", True),
    (r"\pm 50", "50", True), (r"49 \text{ or } 50", "50", False), (r"50 \lor 49", "50", False),
    (r"49 \vee 50", "50", False), (r"50 \text{ or maybe } 49", "50", False),
]
# (box content, gold): honest answers in their many dresses, all paid.
VALUES = [
    ("50", "50"), ("50.0", "50"), ("50.", "50"), ("-3", "-3"), ("−5", "-5"), ("－5", "-5"),
    ("５０", "50"), (r"\frac{1}{2}", "0.5"), (r"\dfrac{1}{2}", "0.5"), (r"\frac12", "0.5"),
    ("1/2", "0.5"), ("0.5", r"\frac{1}{2}"), (".5", "0.5"), (r"-\frac{3}{4}", "-0.75"),
    (r"2\frac{1}{4}", "2.25"), ("1,000", "1000"), (r"1{,}000", "1000"), (r"10,\!000", "10000"),
    (r"1\,000", "1000"), (r"\$1,000", "1000"), (r"\$1,000.00", "1000"),
    (r"50 \text{ apples}", "50"), ("50 apples", "50"), (r"50\%", "50"), (r"50^\circ", "50"),
    (r"50 \text{ cm}^2", "50"), ("(50)", "50"), (r"\left( 50 \right)", "50"), ("{50}", "50"),
    (r"\mathbf{50}", "50"), ("x = 50", "50"), ("+50", "50"), (r"50 \text{ m/s}", "50"),
    (r"50 \text{ sq. ft}", "50"), (r"50 \mathrm{km/h}", "50"), (r"50 \text{ m/s}^2", "50"),
    ("50", r"50 \text{ sq. ft}"),
]


def grade(name, content, gold):
    """`name`'s score for a response boxing `content`, and its format check's."""
    response = rf"Adding up, the answer is $\boxed{{{content}}}$."
    answer = f"#### {gold}" if name == "gsm8k" else gold
    return (REWARDS.get(name)(response=response, answer=answer),
            REWARDS.get(format_check(name))(response=response))


def for_each_grader(cases):
    """(grader, *case) for every case; gsm8k only where its reference can hold the gold."""
    from asyncrl.rewards.answers import NUMBER

    return [(name, *case) for name in NUMERIC_GRADERS for case in cases
            if name != "gsm8k" or NUMBER.fullmatch(case[1])]


@needs_math_verify
@pytest.mark.parametrize("name, content, gold", for_each_grader(RESTATEMENTS))
def test_a_restatement_of_the_number_pays_nothing_however_dressed(name, content, gold):
    from asyncrl.rewards.literal import read_answer

    # It does make the gold: a computed value equal to the number written out.
    assert read_answer(content).value == read_answer(gold).value is not None
    # Not paid, and not an answer either: the reward-hacking watch sees what was refused.
    assert grade(name, content, gold) == (0.0, 0.0)
    paid, formatted = grade(name, gold, gold)  # while the gold written out is paid
    assert paid == formatted == 1.0


@needs_math_verify
@pytest.mark.parametrize("name, content, gold, listed", for_each_grader(HEDGES))
def test_two_answers_or_an_alternative_pay_nothing(name, content, gold, listed):
    assert grade(name, content, gold) == (0.0, float(listed and name == "math_verify"))


@needs_math_verify
@pytest.mark.parametrize("name, content, gold", for_each_grader(VALUES))
def test_a_number_written_out_pays_in_any_dress(name, content, gold):
    assert grade(name, content, gold) == (1.0, 1.0)


@pytest.mark.parametrize("response, score", [
    # Taken back: a retraction word followed by another value, or a second stated answer.
    ("The answer is 50. No wait, it's 51.", 0.0),
    ("The answer is 50. It's 51.", 0.0),
    ("The answer is 50. Actually, 51.", 0.0),
    ("The answer is 50, or rather 51.", 0.0),
    ("The answer is 50. I mean 51.", 0.0),
    ("The answer is 50. Sorry, 51.", 0.0),
    ("The answer is 50. Instead, 51.", 0.0),
    ("The answer is 50. Or maybe 51.", 0.0),
    ("The answer is 50.\n51", 0.0),
    ("The answer is 50.\n23 + 28 = 51", 0.0),
    ("The answer is 50.\nHmm, that is wrong: 49.", 0.0),
    (r"\boxed{50} No, 51.", 0.0),
    (r"\boxed{50} Correction: 49.", 0.0),
    # Other numbers after the answer, and doubt with no other value, take nothing back.
    ("The answer is 50. Explanation: 23 + 27 = 50.", 1.0),
    ("The answer is 50 apples. There were 3 baskets.", 1.0),
    ("The answer is 50. No remainder is left.", 1.0),
    ("\\boxed{50}\n\nStep 1: 23 + 27 = 50.", 1.0),
    ("The answer is 50.\n\n**Steps:**\n1. 23 + 27 = 50\n2. Done", 1.0),
    ("The answer is 50. Wait, let me verify: 23 + 27 = 50.", 1.0),
    ("The answer is 50. That is 50 rather than 51.", 1.0),
    ("50\n\nWait, let me recheck that.", 1.0),
    ("50\nHmm, that is wrong.", 1.0),
    # An unclosed last box is no answer, and nothing else is read instead.
    (r"\boxed{50} hmm \boxed{5", 0.0),
    (r"The answer is 50. \boxed{5", 0.0),
    ("The answer is 50.\n\\boxed{", 0.0),
    # A correction that ends on the answer, and what only repeats it, still pay.
    ("The answer is 51. Wait, the answer is 50.", 1.0),
    ("The answer is 50. So 50 it is!", 1.0),
    ("The answer is 50.\n\nI hope this helps!", 1.0),
    (r"I wrote \boxed{51}, no: \boxed{50}", 1.0),
])
def test_exact_answer_pays_no_retraction_and_no_unclosed_box(response, score):
    assert REWARDS.get("exact_answer")(response=response, answer="50") == score
    assert REWARDS.get("integer_format")(response=response) == score  # the format check agrees


# A response around its final box, gold 50: (response, score). Every boxed grader and its
# format check read the same final answer (asyncrl/rewards/answers.py, rules (a), (b), (b')).
AROUND_THE_BOX = [
    # (a) an earlier box of another value offered beside the last one.
    (r"\boxed{49} or \boxed{50}", 0.0),
    (r"Either \boxed{49} or \boxed{50}.", 0.0),
    (r"\boxed{49} \lor \boxed{50}", 0.0),
    (r"\boxed{49}, or maybe \boxed{50}", 0.0),
    (r"\boxed{48} or \boxed{49}, so \boxed{50}", 0.0),
    # (b) a retraction word or an offered alternative, then another value.
    (r"\boxed{50}. No wait, it's 51.", 0.0),
    (r"\boxed{50}. Actually, 51.", 0.0),
    (r"\boxed{50}. I mean 51.", 0.0),
    (r"\boxed{50}. Or maybe 51.", 0.0),
    (r"\boxed{50}. No, $\frac{101}{2}$.", 0.0),
    # (b') a second stated answer.
    ("\\boxed{50}\n\nThe answer is 51.", 0.0),
    ("\\boxed{50}\n\n23 + 28 = 51", 0.0),
    # A correction before the last box is no hedge: the last box is the answer.
    (r"\boxed{49}, wait, no: \boxed{50}", 1.0),
    (r"\boxed{49} or rather \boxed{50}", 1.0),
    (r"\boxed{49}. Hmm, wait, it is \boxed{50}.", 1.0),
    (r"\boxed{50} or \boxed{50.0}", 1.0),  # the same value twice
    # Prose, explanations and doubt with no other value after the box.
    (r"\boxed{50}. No remainder is left.", 1.0),
    ("\\boxed{50}\n\nStep 1: 23 + 27 = 50.", 1.0),
    (r"\boxed{50}. Wait, let me verify: 23 + 27 = 50.", 1.0),
    (r"\boxed{50} apples. There were 3 baskets.", 1.0),
    ("\\boxed{50}\n\n1. Add 23 and 27.\n2. Done.", 1.0),
    (r"\boxed{50}, rather than 51.", 1.0),
]


@pytest.mark.parametrize("name", NUMERIC_GRADERS)
@pytest.mark.parametrize("response, score", AROUND_THE_BOX)
def test_a_hedge_or_a_retraction_around_the_final_box_pays_nothing(name, response, score):
    answer = "#### 50" if name == "gsm8k" else "50"
    assert REWARDS.get(name)(response=response, answer=answer) == score
    assert REWARDS.get(format_check(name))(response=response) == score  # the check agrees


# (box content, gold, score): where the gold is a list of literals, only a list of literals
# pays: a multiset for a bare list or a set, item by item with its brackets for a tuple or an
# interval.
LISTS = [
    ("1+2, 5", "3, 5", 0.0), (r"\sqrt{9}, 10/2", "3, 5", 0.0), (r"(\frac{6}{2}, 5)", "(3, 5)", 0.0),
    (r"\{1+2, 5\}", r"\{3, 5\}", 0.0), (r"3 \text{ and } 5", "3, 5", 0.0),
    ("3, 5", "3, 5", 1.0), ("5, 3", "3, 5", 1.0), (r"\{5, 3\}", "3, 5", 1.0),
    ("x = 3, 5", "3, 5", 1.0), ("3, 5, 5", "3, 5", 0.0), ("3", "3, 5", 0.0),
    ("(3,5)", "(3, 5)", 1.0), (r"\left( 3, 5 \right)", "(3, 5)", 1.0), ("(5, 3)", "(3, 5)", 0.0),
    ("[3, 5]", "(3, 5)", 0.0), ("3, 5", "(3, 5)", 0.0), (r"\{5, 3\}", r"\{3, 5\}", 1.0),
    ("[1,3)", "[1, 3)", 1.0), ("[1,3]", "[1, 3)", 0.0), ("(0.5, 3)", r"(\frac{1}{2}, 3)", 1.0),
]


@needs_math_verify
@pytest.mark.parametrize("content, gold, score", LISTS)
def test_a_list_of_numbers_pays_only_a_list_of_literals(content, gold, score):
    response = rf"so $\boxed{{{content}}}$."
    assert REWARDS.get("math_verify")(response=response, answer=gold) == score
    # Given the gold (as evaluation gives it), the format check refuses what is no list of
    # literals; without it (training), an operation in a list is refused all the same.
    formatted = REWARDS.get("format")(response=response, answer=gold)
    refused = any(op in content for op in ("+", "/", "sqrt", "frac", "and"))
    assert formatted == (0.0 if refused else 1.0)
    if "+" in content or "/" in content:
        assert REWARDS.get("format")(response=response) == 0.0


@needs_math_verify
@pytest.mark.parametrize("response, gold, score", [
    # What follows the box is read against the values the answer holds.
    (r"\boxed{3, 5}. Check: x = 3 works, and x = 5 too.", "3, 5", 1.0),
    (r"\boxed{3, 5}. No wait, 4.", "3, 5", 0.0),
    (r"\boxed{2^{10}} = 1024", "2^{10}", 1.0),
    (r"\boxed{\frac{\sqrt{3}}{2}} \approx 0.866", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{\frac{\sqrt{3}}{2}}. No wait, it is \frac{1}{2}.", r"\frac{\sqrt{3}}{2}", 0.0),
])
def test_what_follows_the_final_box_is_read_against_its_own_values(response, gold, score):
    assert REWARDS.get("math_verify")(response=response, answer=gold) == score
    assert REWARDS.get("format")(response=response, answer=gold) == score


@needs_math_verify
@pytest.mark.parametrize("response, gold, score", [
    (r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{\frac{\sqrt3}{2}}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{\frac{1}{2}\sqrt{3}}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{\sqrt{3}/2}", r"\frac{\sqrt{3}}{2}", 1.0),
    (r"\boxed{\frac{1}{2}}", r"\frac{\sqrt{3}}{2}", 0.0),
    (r"\boxed{(-\infty, 2]}", r"(-\infty, 2]", 1.0),
    (r"\boxed{(-\infty,2]}", r"(-\infty, 2]", 1.0),
    (r"\boxed{(-\infty, 2)}", r"(-\infty, 2]", 0.0),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}", 1.0),
    (r"\boxed{2, 1}", "1, 2", 1.0),  # "Enter all the solutions, separated by commas."
    (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    # An operation whose value is a number cannot equal an irrational gold, and alternatives
    # are no answer: both refused before math-verify sees them.
    (r"\boxed{\sqrt{3} \text{ or } \frac{1}{2}}", r"\frac{\sqrt{3}}{2}", 0.0),
    (r"\boxed{2^{5}}", r"\frac{\sqrt{3}}{2}", 0.0),
    # A gold that is itself an operation over literals is paid by its value or its own form
    # (a gold written out, 1024, refuses `2^{10}`: see RESTATEMENTS).
    (r"\boxed{2^{10}}", "2^{10}", 1.0),
    (r"\boxed{1024}", "2^{10}", 1.0),
    (r"\boxed{1000}", "2^{10}", 0.0),
    (r"\boxed{4.5 \times 10^{6}}", r"4.5 \times 10^{6}", 1.0),
    (r"\boxed{4500000}", r"4.5 \times 10^{6}", 1.0),
    (r"\boxed{\frac{6}{4}}", r"\frac{6}{4}", 1.0),
    (r"\boxed{\frac{3}{2}}", r"\frac{6}{4}", 1.0),
    (r"\boxed{1.5}", r"\frac{6}{4}", 1.0),
])
def test_an_expression_gold_is_graded_by_equivalence(response, gold, score):
    assert REWARDS.get("math_verify")(response=response, answer=gold) == score
    if score == 1.0:  # the format check, given the gold as evaluation gives it, agrees
        assert REWARDS.get("format")(response=response, answer=gold) == 1.0


TOWER = r"\boxed{9^{9^{9^{9}}}}"


@pytest.mark.parametrize("name, gold", [
    ("math_verify", "50"), ("math_verify", r"\frac{\sqrt{3}}{2}"), ("math_verify", "2^{10}"),
    ("gsm8k", "#### 50"), ("exact_answer", "50")])
def test_a_power_tower_is_refused_at_once_without_the_verifier(name, gold, monkeypatch):
    # math-verify spends its whole time limit on it (and raises); the parse refuses it first.
    import asyncrl.rewards.math as math_rewards

    def no_verifier(*args, **kwargs):
        raise AssertionError("math-verify was called")

    monkeypatch.setattr(math_rewards, "_equal", no_verifier)
    real_parse = math_rewards._parse
    monkeypatch.setattr(math_rewards, "_parse", lambda text, what: (
        real_parse(text, what) if what == "reference answer" else no_verifier()))
    start = time.monotonic()
    assert REWARDS.get(name)(response=f"so {TOWER}", answer=gold) == 0.0
    assert REWARDS.get(format_check(name))(response=f"so {TOWER}") == 0.0
    assert time.monotonic() - start < 1.0


PAID = ([("exact_answer", r, g) for r, g, score in PLAIN if score == 1.0]
        + [("math_verify", r, g) for r, g, score in BOXED if score == 1.0]
        + [("gsm8k", r, g) for r, g, score in GSM8K if score == 1.0])


@needs_math_verify
@pytest.mark.parametrize("name, response, gold", PAID)
def test_whatever_a_grader_pays_its_format_check_counts_as_answered(name, response, gold):
    # So `rewarded_unformatted` (the reward-hacking watch) stays 0 under a strict grader.
    from asyncrl.rewards.literal import ARITHMETIC, read_answer

    check = REWARDS.get(format_check(name))
    assert REWARDS.get(name)(response=response, answer=gold) == 1.0
    assert check(response=response, answer=gold) == 1.0  # as evaluation checks it
    # Training checks without the gold, so it refuses every operation over literals: a gold
    # that is one itself (`1 - 2`), answered in its own form, is the one exception.
    if read_answer(gold).kind != ARITHMETIC:
        assert check(response=response) == 1.0
