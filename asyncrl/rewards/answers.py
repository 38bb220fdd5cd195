"""Where a response states its final answer, and whether what it states is a value.

A reward reads the answer only from the format the prompt asked for, and scores 0 when the
response has none: a grader that searches the whole text for something equal to the gold
pays for restating the problem ("The problem is 29 + 55 - 36." holds 48 as an expression)
and for hedging ("41 or 42"). Two formats:

  boxed  the last complete `\\boxed{...}` (MATH / DAPO / GSM8K prompts with a system prompt
         asking for one). An unclosed last box (a response cut at the token cap) is no answer.
  plain  "Answer with only the number." style (the arithmetic tasks): a box if the response
         opens one (its last box, closed, or no answer at all: nothing else is read then);
         else the clause after its last "answer is" / "answer:", else its last line holding a
         digit. In that clause or line the last number is the answer when it stands alone or
         right after `=`, `:`, "is" or "equals" ("23 + 45 = 68.", "The answer is 23 + 45 =
         68", "The sum is 68, which is even."), and nothing offers an alternative. What follows
         the answer must not take it back: a retraction word (RETRACTIONS: "wait", "no",
         "actually", "instead", ...) or any number of another value after it, and the response
         states no answer ("The answer is 50. No wait, it's 51." and "The answer is 50. It's
         51." both state none; "The answer is 47. Wait, the answer is 48." states 48: the last
         anchor).

What the format yields must then be a value, decided by parsing it (asyncrl/rewards/literal.py,
never a pattern over the text): for a number, a literal (`50`, `-3`, `0.5`, `\\frac{1}{2}`,
`\\$1,000`, `72 \\text{ apples}`), never an operation over literals (`84 - 12`,
`6 \\times 7`, `\\sqrt{2500}`), a list or alternatives.
"""

from __future__ import annotations

import fractions
import re

from asyncrl.rewards.literal import ALTERNATIVES, ARITHMETIC, literal_value, normalize, read_answer

# A final answer longer than this is not one a grader reads (a MATH answer is a few dozen
# characters; a matrix a few hundred): it scores 0 without parsing, so pathological LaTeX
# cannot spend the verifier's time limit.
MAX_ANSWER_CHARS = 400

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# A GSM8K-style number: thousands groups ("1,234.5") or plain digits; "3,4" is two numbers.
NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+")
_ANCHOR = re.compile(r"\banswer\s*(?:(?:is|would be|will be)\s*[:=]?|[:=])", re.IGNORECASE)
# Where an anchored clause ends: a line break, or a sentence end that is not a decimal point.
_CLAUSE_END = re.compile(r"\n|[.!?;](?=\s|$)")
# What may stand right before a final line's answer.
_STATES = re.compile(r"(?:^|=|:|\bis|\bequals)$", re.IGNORECASE)
_HEDGE = re.compile(r"\bor\b|\\lor\b|\\vee\b|\beither\b", re.IGNORECASE)
_MARKUP = re.compile(r"\*\*|__|\$|\\\(|\\\)|\\\[|\\\]")
# Words that take back what was just stated; see the module's docstring.
RETRACTIONS = re.compile(r"\b(?:wait|no|nope|actually|instead|correction|oops|sorry|mistake|"
                         r"wrong|rather|hmm+|re-?check\w*|re-?calculat\w*|reconsider\w*)\b",
                         re.IGNORECASE)
_DIGIT_LINE = re.compile(r"[^\n]*\d[^\n]*")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, or None.

    Braces are balanced, so `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`. `\\boxed 5` (no braces,
    as LaTeX allows for one token) gives `5`. If the last box is left open (a response cut at
    the length limit) the result is None: the model never gave a final answer, and falling back
    to an earlier box would reward an answer the model itself went on to abandon.
    """
    box = _last_box(text)
    return None if box is None else box[0]


def _last_box(text: str) -> tuple[str, int] | None:
    """`last_boxed`'s content and where the box ends in `text`."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    after = start + len(command)
    i = after
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{" and i > after:  # "\boxed 5": the argument is a token
        token = text[i:].split(maxsplit=1)[0]
        return (token.rstrip("$."), i + len(token)) if token.rstrip("$.") else None
    if i >= len(text) or text[i] != "{":
        return None  # "\boxedthing" is not a box; "\boxed" at the very end has no answer
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                content = text[i + 1:j].strip()
                return (content, j + 1) if content else None
    return None  # unclosed


def stated_answer(response: str) -> str | None:
    """The text of the final answer of a plain-style response (see the module's docstring),
    or None when it states none."""
    response = normalize(response)  # a Unicode minus, full-width digits
    if any(command in response for command in _BOX_COMMANDS):
        found = _last_box(response)  # an unclosed last box: no answer, and nothing else read
    else:
        found = _anchored_or_last_line(response)
    if found is None:
        return None
    answer, end = found
    value = as_number(answer)
    if value is not None and _taken_back(response[end:], value):
        return None
    return answer


def _anchored_or_last_line(response: str) -> tuple[str, int] | None:
    anchors = list(_ANCHOR.finditer(response))
    if anchors:
        start = anchors[-1].end()
        clause = _CLAUSE_END.split(response[start:], maxsplit=1)[0]
    else:
        lines = list(_DIGIT_LINE.finditer(response))
        if not lines:
            return None
        start, clause = lines[-1].start(), lines[-1].group()
    found = _stated_in(clause)
    return None if found is None else (found[0], start + found[1])


def _stated_in(text: str) -> tuple[str, int] | None:
    """The last number of `text` and where it ends, if it stands alone or right after what
    states a result ("= 68", "is 68", ": 68"), and `text` offers no alternatives."""
    numbers = list(NUMBER.finditer(text))
    if not numbers or _HEDGE.search(text):
        return None
    last = numbers[-1]
    before = _MARKUP.sub("", text[:last.start()]).rstrip()
    return (last.group(), last.end()) if _STATES.search(before) else None


def _taken_back(after: str, value: fractions.Fraction) -> bool:
    """Whether the text after a stated answer retracts it: a retraction word, or a number of
    another value."""
    return RETRACTIONS.search(after) is not None or any(
        fractions.Fraction(number.group().replace(",", "")) != value
        for number in NUMBER.finditer(after))


def as_number(text: str | None) -> fractions.Fraction | None:
    """`text` as one exact number written out (a LITERAL of asyncrl/rewards/literal.py: units
    and dress allowed, "\\$1,234.00", "72 apples", "18 \\text{ dollars}", "\\frac{1}{2}"), or
    None when it is anything else: an operation over numbers, several numbers, a hedge, words
    around the number, over MAX_ANSWER_CHARS long."""
    if text is None or len(text) > MAX_ANSWER_CHARS:
        return None
    return literal_value(text)


def not_a_value(answer_text: str, gold: str) -> str | None:
    """Why a boxed answer is not a single value that could be graded against a gold that is
    not a number (`\\frac{\\sqrt{3}}{2}`, an interval), or None: too long, alternatives
    (`\\sqrt{2} \\text{ or } 2`), or an operation over numbers whose value is a number
    (`84 - 12`, `\\sqrt{2500}`: it cannot equal such a gold, and a power tower would only
    spend the verifier's time). A form the gold itself takes is allowed: a gold of "1 or 2" may
    be answered so."""
    if len(answer_text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    kind, gold_kind = read_answer(answer_text).kind, read_answer(gold).kind
    if kind == ALTERNATIVES and gold_kind != ALTERNATIVES:
        return "alternatives, not one answer"
    if kind == ARITHMETIC and gold_kind != ARITHMETIC:
        return "an unevaluated arithmetic expression"
    return None


def could_be_paid(boxed: str | None) -> bool:
    """Whether a box's content is an answer some gold could pay (the `format` check, which
    knows no gold): not over MAX_ANSWER_CHARS, not an operation over numbers whose value is a
    number, not alternatives. Lists count: MATH asks for several solutions "separated by
    commas"."""
    return (boxed is not None and len(boxed) <= MAX_ANSWER_CHARS
            and read_answer(boxed).kind not in (ARITHMETIC, ALTERNATIVES))
