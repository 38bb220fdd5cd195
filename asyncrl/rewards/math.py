"""Verifiable math rewards: `math_verify`, `gsm8k`, the format checks, and DAPO's overlong penalty.

The model is asked for its final answer in `\\boxed{}`; every reward here and its format
check reads the *final* box of the response (`final_boxed`, asyncrl/rewards/answers.py): the
last complete `\\boxed{...}`, unless an earlier box of another value is offered beside it
("\\boxed{49} or \\boxed{50}") or the text after takes it back ("\\boxed{50}. No wait, it's
51."); it scores 0.0 when there is none (the `format` reward reports that miss on its own).
The last box, because models often box an intermediate result before correcting it
("\\boxed{3}, wait, no: \\boxed{4}" pays 4); math-verify on its own would gather every box of
a response into a set and grade "{3, 4}". Nothing is extracted from the rest of the text:
math-verify's own extraction evaluates any expression it finds, so a response restating
"29 + 55 - 36" would be paid for the gold 48. `math_verify_lenient` keeps that extraction for
responses with no closed box, by name only, and is graded strictly in evaluation.

The gold's own parse (asyncrl/rewards/literal.py) decides how the box is graded:
  * a LITERAL gold (`48`, `0.5`, `\\frac{1}{2}`, `1,000`, `50 \\text{ sq. ft}`): the box is
    parsed, never evaluated, and only a literal equal to it pays (`\\frac{1}{2}` for 0.5,
    `1,000` for 1000), never an operation over literals (`34+21-5`, `100/2`, `2^{5}`,
    `\\sqrt{2500}`); math-verify is not called;
  * a list of literals (`3, 5`, `(3, 5)`, `[1, 3)`, `\\{3, 5\\}`): only a list whose every item
    is a literal pays (`1+2, 5` does not), equal as a multiset for a bare list or a set
    (`5, 3`, `\\{5, 3\\}`), item by item with the same brackets for a tuple or interval;
    math-verify is not called;
  * any other gold, an expression (`2^{10}`, `\\frac{6}{4}`, `\\frac{\\sqrt{3}}{2}`,
    `(-\\infty, 2]`, `x^2+1`): math-verify decides equivalence, once the box holds one value
    of a form the gold could take (`not_a_value`: an operation over literals only for a gold
    that is one, so `2^{10}` and `1024` pay for `2^{10}`, `2^{5}` nothing for
    `\\frac{\\sqrt{3}}{2}`).

Failure semantics, shared with the worker pool (asyncrl/rewards/pool.py) and evaluation:
  * a wrong or unparsable *response* scores 0.0 (the model's fault: a real training signal);
  * an unusable *reference* answer raises ValueError (the data's fault: every response would
    silently score 0.0, so it fails the call loudly instead);
  * a verifier that runs past its time raises (TimeoutError here, or the pool kills the
    worker), never a silent 0.0: math-verify's own default turns a timeout into "not equal".
    The caller tells the two faults apart: a reward that raises on a response but not on an
    empty one failed because of the response, which then scores 0.0 and is counted
    (RewardOutcome.response_error); one that raises on the empty response too is broken or
    has a broken reference, a failed call.

math-verify is imported lazily, so `import asyncrl.rewards` (which the config imports to
validate names) stays cheap and gsm8k / format work without it installed.
"""

from __future__ import annotations

import fractions
import threading

from asyncrl.rewards.answers import (
    NUMBER,
    as_number,
    as_numbers,
    final_boxed,
    last_boxed,
    not_a_value,
)
from asyncrl.rewards.literal import literal_value
from asyncrl.rewards.registry import BOXED_REWARDS, FORMAT_CHECKS, REWARDS, STRICT_GRADERS

# math-verify's own per-expression limit, enforced with SIGALRM (whole seconds). The pool's
# per-call timeout is the outer guard; this one makes an in-process call (tests, greedy eval
# on the main thread) unable to hang, and in a worker it fails the call with a clear message
# before the pool has to kill and respawn the process.
VERIFY_TIMEOUT_S = 5

# ---------------------------------------------------------------------------- math_verify


def _signal_timeout() -> int | None:
    # SIGALRM can only be armed from the main thread; math-verify raises ValueError otherwise.
    # Off the main thread (a caller's own thread) there is no inner limit: such a caller
    # should go through the pool, whose limit is enforced by killing the worker process.
    return VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, what: str) -> list:
    from math_verify import parse
    from math_verify.errors import TimeoutException

    try:
        return parse(text, parsing_timeout=_signal_timeout(), raise_on_error=True)
    except TimeoutException:  # a BaseException: it would otherwise kill the worker untidily
        raise TimeoutError(f"math_verify: parsing the {what} took over "
                           f"{VERIFY_TIMEOUT_S} s: {text[:80]!r}") from None
    except Exception:  # antlr / sympy failures: nothing usable in this text
        return []


def _equal(gold: list, predicted: list) -> bool:
    from math_verify import verify
    from math_verify.errors import TimeoutException

    # Pair by pair (as math-verify does inside `verify`), so one pair sympy cannot compare
    # does not hide a later pair that matches, while a timeout still surfaces as an error.
    for g in gold:
        for p in predicted:
            try:
                if verify(g, p, timeout_seconds=_signal_timeout(), raise_on_error=True):
                    return True
            except TimeoutException:
                raise TimeoutError(
                    f"math_verify: comparing took over {VERIFY_TIMEOUT_S} s") from None
            except Exception:
                continue
    return False


def _gold(answer: str) -> list:
    gold = _parse(f"${answer}$", "reference answer")
    # parse() falls back to the raw string when LaTeX conversion fails ("\\frac{" → ["\\frac{"]);
    # a reference with no parsed expression is broken data, not an answer to match strings on.
    if all(isinstance(g, str) for g in gold):
        raise ValueError(f"math_verify: the reference answer {answer!r} could not be parsed")
    return gold


def _verify_boxed(boxed: str, answer: str) -> float:
    value = literal_value(answer)
    if value is not None:  # a number: only a literal equal to it pays
        return 1.0 if as_number(boxed) == value else 0.0
    values = as_numbers(answer)
    if values is not None:  # a list of numbers: only a list of literals equal to it pays
        return 1.0 if as_numbers(boxed) == values else 0.0
    gold = _gold(answer)
    if not_a_value(boxed, answer) is not None:
        return 0.0
    predicted = _parse(f"\\boxed{{{boxed}}}", "response")
    return 1.0 if predicted and _equal(gold, predicted) else 0.0


@REWARDS.register("math_verify")
def math_verify(response: str, answer: str) -> float:
    """1.0 when the response's final box (`final_boxed`: its last complete `\\boxed{}`, not
    hedged with an earlier box nor taken back after) holds a value equal to `answer`, else
    0.0 (no final box: 0.0).

    An `answer` written as a literal (`48`, `0.5`, `\\frac{1}{2}`, `1,000`) is paid only by a
    literal of that value, however dressed (`48.0`, `\\$48`, `48 \\text{ apples}`, `(48)`,
    `x = 48`), never by an operation over literals (`6 \\times 8`, `96/2`, `\\frac{2}{4}` for
    0.5, `2^{10}` for 1024) nor by a list or alternatives: see asyncrl/rewards/literal.py. A
    list of literals (`3, 5`, `(3, 5)`) is paid only by a list of literals equal to it (see
    `as_numbers`). Any other `answer`, an expression included (`2^{10}`, `\\frac{6}{4}`, `1 -
    2`), is graded by math-verify's equivalence: LaTeX or plain, intervals (`(-\\infty, 2]`),
    sets, symbolic forms (`(x+1)^2` = `x^2+2x+1`), surds (`\\frac{1}{\\sqrt{2}}` =
    `\\frac{\\sqrt{2}}{2}`); the box must hold one value of a form the gold could take there
    (see `not_a_value`) and be at most MAX_ANSWER_CHARS long.

    Raises ValueError when `answer` itself cannot be parsed, TimeoutError when math-verify
    runs past VERIFY_TIMEOUT_S.
    """
    boxed = final_boxed(response)
    if boxed is None:
        if literal_value(answer) is None and as_numbers(answer) is None:
            _gold(answer)  # a broken reference fails every call, boxed or not
        return 0.0
    return _verify_boxed(boxed, answer)


@REWARDS.register("math_verify_lenient")
def math_verify_lenient(response: str, answer: str) -> float:
    """`math_verify`, except that a response with no closed last box goes whole to
    math-verify's own extraction (an "answer is" anchor, else the last expression it finds).

    Open to gaming: "The problem is 29 + 55 - 36. I do not know." scores 1.0 for 48 (a
    SmolLM2 run learned exactly that). Kept, by name only, for models that never box early
    in training; evaluation grades its runs with `math_verify`, and the run flags a reward
    that rises while the boxed-answer rate falls.
    """
    if last_boxed(response) is not None:  # boxed: graded as math_verify grades it
        return math_verify(response, answer)
    gold = _gold(answer)
    predicted = _parse(response, "response")
    return 1.0 if predicted and _equal(gold, predicted) else 0.0


# ---------------------------------------------------------------------------------- gsm8k


def gsm8k_reference(answer: str) -> str:
    """The number of a GSM8K reference: what follows the last `####`, or the whole string.

    "...so she has 18 dollars.\\n#### 18" → "18"; a bare "1,234" → "1234". Raises ValueError
    when no single number is there.
    """
    text = answer.rsplit("####", 1)[-1].strip().replace("$", "").rstrip(".")
    match = NUMBER.fullmatch(text)
    if match is None:
        raise ValueError(f"gsm8k: the reference answer must be one number (after '####' if "
                         f"present), got {text[:80]!r}")
    return text.replace(",", "")


@REWARDS.register("gsm8k")
def gsm8k(response: str, answer: str) -> float:
    """1.0 when the response's final box (`final_boxed`) holds one number equal to the
    reference number, else 0.0 (no final box: 0.0).

    The reference is the number after `####` (a GSM8K solution) or a bare number. The box
    may dress its number ("\\$1,234.00", "18 \\text{ dollars}"), not hold two ("18 or 19") or
    an expression ("9 + 9").
    """
    reference = fractions.Fraction(gsm8k_reference(answer))
    return 1.0 if as_number(final_boxed(response)) == reference else 0.0


# --------------------------------------------------------------------------------- format


@REWARDS.register("format")
def format_reward(response: str, answer: str | None = None) -> float:
    """1.0 when the response puts an answer `math_verify` could pay where the prompt asked:
    a final box (`final_boxed`: closed, neither hedged nor taken back) holding no operation
    over numbers whose value is a number (`34+21-5`, `\\sqrt{2500}`, `2^{5}, 3`) and no
    alternatives (`47 \\text{ or } 48`); see `not_a_value`. Training checks the format without
    `answer`, so a list (`1, 2`) counts (MATH asks for several solutions that way). Evaluation
    passes it, and the check then follows the gold's form as the grader does: `2^{10}` counts
    for the gold `2^{10}`, `1+2, 5` does not for the gold `3, 5`.
    """
    boxed = final_boxed(response)
    return 1.0 if boxed is not None and not_a_value(boxed, answer) is None else 0.0


@REWARDS.register("boxed_number_format")
def boxed_number_format(response: str, answer: str | None = None) -> float:
    """1.0 when the response's final box (`final_boxed`) holds one number written out (what
    `gsm8k` pays, when it is the right one): not an expression, a list or a hedge."""
    del answer
    return 1.0 if as_number(final_boxed(response)) is not None else 0.0


BOXED_REWARDS.update({"math_verify", "math_verify_lenient", "gsm8k", "format",
                      "boxed_number_format"})
FORMAT_CHECKS.update({"math_verify": "format", "math_verify_lenient": "format",
                      "gsm8k": "boxed_number_format"})
STRICT_GRADERS["math_verify_lenient"] = "math_verify"


# ------------------------------------------------------------------------ overlong penalty


def overlong_penalty(length: int, max_len: int, buffer: int) -> float:
    """DAPO's soft overlong punishment (Yu et al. 2025, "DAPO", eq. 13), in [-1, 0].

    With L_max = `max_len` and L_cache = `buffer`:

        R(y) = 0                               if |y| <= L_max - L_cache
        R(y) = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
        R(y) = -1                              if |y| > L_max

    It is added to the task reward, so a response that runs into the last `buffer` tokens
    before the limit loses reward linearly instead of a cliff at truncation. `buffer=0` is the
    cliff itself. It is a shaping term over lengths, not a response → reward function, so it is
    not in REWARDS: the caller that knows the token count adds it.
    """
    if max_len < 1:
        raise ValueError(f"overlong_penalty: max_len must be ≥ 1, got {max_len}")
    if not 0 <= buffer <= max_len:
        raise ValueError(
            f"overlong_penalty: buffer must be in [0, max_len={max_len}], got {buffer}")
    if length < 0:
        raise ValueError(f"overlong_penalty: length must be ≥ 0, got {length}")
    free = max_len - buffer
    if length <= free:
        return 0.0
    if length > max_len:
        return -1.0
    return (free - length) / buffer
