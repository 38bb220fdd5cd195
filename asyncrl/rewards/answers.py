"""Where a response states its final answer, and whether what it states is a value.

A reward reads the answer only from the format the prompt asked for, and scores 0 when the
response has none: a grader that searches the whole text for something equal to the gold
pays for restating the problem ("The problem is 29 + 55 - 36." holds 48 as an expression)
and for hedging ("41 or 42"). Two formats:

  boxed  the last complete `\\boxed{...}` (MATH / DAPO / GSM8K prompts with a system prompt
         asking for one). An unclosed last box (a response cut at the token cap) is no answer.
  plain  "Answer with only the number." style (the arithmetic tasks): a box if the response
         has one; else the clause after its last "answer is" / "answer:", else its last line
         holding a digit. In that clause or line the last number is the answer when it stands
         alone or right after `=`, `:`, "is" or "equals" ("23 + 45 = 68.", "The answer is
         23 + 45 = 68", "The sum is 68, which is even."), and nothing offers an alternative.

What the format yields must then be a value: one number (units, `$`, `%` and thousands
separators allowed) for the numeric graders; for `math_verify` any single mathematical value
but not an unevaluated arithmetic expression of literals (`84 - 12`, `6 \\times 7`) nor
alternatives (`41 \\text{ or } 42`, `41 \\lor 42`).
"""

from __future__ import annotations

import fractions
import re

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
# LaTeX that dresses a number without changing it: \text{ apples}, \$, thin spaces, {,}.
_LATEX_DRESS = [
    (re.compile(r"\\(?:text|mathrm|textbf|mbox)\s*\{([^{}]*)\}"), r" \1 "),
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"\\[,;:! ]|~"), " "),
    (re.compile(r"\\\$|\$"), ""),
    (re.compile(r"\\%"), "%"),
    (re.compile(r"\^\s*\{?\\circ\}?|°"), " degrees"),
    (re.compile(r"\\(?:left|right)\b"), ""),
]
# One number, then optional units ("72 apples", "18 dollars.", "72%"): nothing else.
_VALUE = re.compile(rf"(?P<number>{NUMBER.pattern})\s*%?(?P<units>(?:\s+[A-Za-z][A-Za-z.]*)*)"
                    rf"\s*[.!]?")
_NOT_UNITS = {"or", "and", "to", "plus", "minus", "times", "over", "either", "maybe"}
# An operation between two numeric literals: 29 + 55, 6 \times 7, 84-12. Not a fraction (1/2
# is a value), and not when the literal continues as a coefficient or power (3+2\sqrt{2},
# 2+3i, 3 \times 10^5), which is how such values are written.
_OPERATOR = r"(?:[-+*×÷·]|\\times|\\cdot|\\div)"
_ARITHMETIC = re.compile(rf"(?<![\w.^_{{\\])\d+(?:\.\d+)?\s*{_OPERATOR}\s*\d+(?:\.\d+)?"
                         rf"(?![\w.^{{(\\])")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, or None.

    Braces are balanced, so `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`. `\\boxed 5` (no braces,
    as LaTeX allows for one token) gives `5`. If the last box is left open (a response cut at
    the length limit) the result is None: the model never gave a final answer, and falling back
    to an earlier box would reward an answer the model itself went on to abandon.
    """
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    command = next(c for c in _BOX_COMMANDS if text.startswith(c, start))
    after = start + len(command)
    i = after
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{" and i > after:  # "\boxed 5": the argument is a token
        return text[i:].split(maxsplit=1)[0].rstrip("$.") or None
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
                return content or None
    return None  # unclosed


def stated_answer(response: str) -> str | None:
    """The text of the final answer of a plain-style response (see the module's docstring),
    or None when it states none."""
    response = response.replace("−", "-")  # a Unicode minus sign
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed
    anchors = list(_ANCHOR.finditer(response))
    if anchors:
        return _stated_in(_CLAUSE_END.split(response[anchors[-1].end():], maxsplit=1)[0])
    lines = [line for line in response.splitlines() if any(ch.isdigit() for ch in line)]
    return _stated_in(lines[-1]) if lines else None


def _stated_in(text: str) -> str | None:
    """The last number of `text` if it stands alone or right after what states a result
    ("= 68", "is 68", ": 68"), and `text` offers no alternatives."""
    numbers = list(NUMBER.finditer(text))
    if not numbers or _HEDGE.search(text):
        return None
    last = numbers[-1]
    before = _MARKUP.sub("", text[:last.start()]).rstrip()
    return last.group() if _STATES.search(before) else None


def as_number(text: str | None) -> fractions.Fraction | None:
    """`text` as one exact number, units and dress allowed ("\\$1,234.00", "72 apples",
    "18 \\text{ dollars}"), or None when it is anything else: an expression, several numbers,
    a hedge, words around the number."""
    if text is None or len(text) > MAX_ANSWER_CHARS:
        return None
    text = text.replace("−", "-")
    for pattern, replacement in _LATEX_DRESS:
        text = pattern.sub(replacement, text)
    text = _MARKUP.sub("", text)
    match = _VALUE.fullmatch(text.strip())
    if match is None or _NOT_UNITS & set(match["units"].lower().replace(".", " ").split()):
        return None
    return fractions.Fraction(match["number"].replace(",", ""))


def not_a_value(answer_text: str, gold: str) -> str | None:
    """Why a boxed answer is not a single value that could be graded against `gold`, or None.

    A form the gold itself uses is allowed: a gold of "1 or 2" may be answered so."""
    if len(answer_text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    if _HEDGE.search(answer_text) and not _HEDGE.search(gold):
        return "alternatives, not one answer"
    if _ARITHMETIC.search(answer_text) and not _ARITHMETIC.search(gold):
        return "an unevaluated arithmetic expression"
    return None
