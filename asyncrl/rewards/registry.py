"""Reward functions by name. Each takes keyword arguments and returns a float.

Reward functions run in worker processes (asyncrl/rewards/pool.py), so they must be importable
module-level functions registered here; the worker looks them up by name.

Every registered reward reads the answer from the format its prompt asks for
(asyncrl/rewards/answers.py). A reward that is more lenient than a careful grader, to shape
early training, names its strict counterpart in STRICT_GRADERS: evaluation always reports
accuracy with `strict_grader(config.task.reward)`, so a run trained on a lenient signal cannot
report the leniency as accuracy.
"""

import fractions

from asyncrl.registry import Registry
from asyncrl.rewards.answers import as_number, stated_answer

REWARDS = Registry("reward function")

# lenient training reward -> the grader evaluation scores with instead
STRICT_GRADERS: dict[str, str] = {"answer_first": "exact_answer"}
# reward -> the format check that says whether a response put an answer where it reads one
FORMAT_CHECKS: dict[str, str] = {"exact_answer": "integer_format", "answer_first": "integer_format"}
# rewards that read only `\boxed{}`: the prompt must ask for one (asyncrl.config.resolve checks)
BOXED_REWARDS: set[str] = set()


def strict_grader(reward: str) -> str:
    """The name of the reward evaluation grades `reward`'s task with."""
    return STRICT_GRADERS.get(reward, reward)


def format_check(reward: str) -> str | None:
    """The format check matching `reward`'s answer format; None for a reward of unknown format
    (a user's own)."""
    return FORMAT_CHECKS.get(reward)


def _number(answer) -> fractions.Fraction:
    value = as_number(str(answer).strip())
    if value is None:
        raise ValueError(f"the reference answer must be one number, got {str(answer)[:80]!r}")
    return value


@REWARDS.register("exact_answer")
def exact_answer(response: str, answer: str) -> float:
    """1.0 when the response states a final answer (a box, "the answer is N", or a last line
    that is N or ends "= N" / "is N") and it equals the reference number exactly, else 0.0.

    Hedges ("41 or 42", "\\boxed{41} or \\boxed{42}"), lists, unevaluated expressions ("84 -
    12", `\\boxed{2^{5}}`), a restated question, an answer taken back by a retraction word and
    another value ("The answer is 50. No wait, it's 51.") or by a second stated answer ("...
    The answer is 51.", "= 51") and an unclosed last box state no answer; other numbers after
    the answer do not take it back ("The answer is 50. Explanation: 23 + 27 = 50.") (rules in
    asyncrl/rewards/answers.py). Thousands separators, "$", units and "72.0" for 72 are fine.
    Raises ValueError when `answer` is not one number.
    """
    reference = _number(answer)
    return 1.0 if as_number(stated_answer(response)) == reference else 0.0


@REWARDS.register("integer_format")
def integer_format(response: str, answer: str | None = None) -> float:
    """1.0 when the response states a final number where `exact_answer` reads one, as
    `exact_answer` reads it (so a hedge, an expression or a retraction is unformatted): the
    arithmetic tasks' format check; `answer` is accepted and ignored."""
    del answer
    return 1.0 if as_number(stated_answer(response)) is not None else 0.0


@REWARDS.register("answer_first")
def answer_first(response: str, answer: str) -> float:
    """1 / (1 + k) when the response starts with the expected answer and goes on for k more
    characters: 1.0 for the answer alone, 0.5 for "3+" or "33" (for 3), 0.25 for "3333";
    0.0 when it does not start with the answer.

    A dense enough signal for a randomly initialised model to learn from in a few dozen
    steps (the `:tiny` experiments): the partial credit finds the answer, and each character
    dropped after it pays, which teaches it to stop. Partial credit is lenient by design, so
    evaluation grades its runs with `exact_answer`; real runs train on `exact_answer`.
    """
    text, expected = response.strip(), str(answer).strip()
    if not expected or not text.startswith(expected):
        return 0.0
    return 1.0 / (1 + len(text) - len(expected))
