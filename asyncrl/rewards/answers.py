"""Where a response states its final answer, whether it takes it back, and whether what it
states is a value.

A reward reads the answer only from the format the prompt asked for, and scores 0 when the
response has none: a grader that searches the whole text for something equal to the gold
pays for restating the problem ("The problem is 29 + 55 - 36." holds 48 as an expression)
and for hedging ("41 or 42"). Two formats:

  boxed  the last complete `\\boxed{...}` (MATH / DAPO / GSM8K prompts with a system prompt
         asking for one): `final_boxed`. An unclosed last box (a response cut at the token
         cap) is no answer.
  plain  "Answer with only the number." style (the arithmetic tasks): `stated_answer`. A box
         if the response opens one (read as `final_boxed`; nothing else is read then); else
         the clause after its last "answer is" / "answer:", else its last line holding a
         digit. In that clause or line the last number is the answer when it stands alone or
         right after `=`, `:`, "is" or "equals" ("23 + 45 = 68.", "The answer is 23 + 45 =
         68", "The sum is 68, which is even."), and nothing in it offers an alternative.

One rule, shared by every grader and its format check, then decides whether the response
keeps the answer it states (`kept`); the response states none when:

  (a) hedged: an earlier box of another value is offered beside the last one: a hedge word
      (HEDGES: "or", "either", `\\lor`, `\\vee`) between the two, and no retraction word
      between the last hedge and the last box ("Either \\boxed{49} or \\boxed{50}." states
      none). A retraction *before* the last box is a correction, and the last box is the
      answer: "\\boxed{3}, wait, no: \\boxed{4}" and "\\boxed{3} or rather \\boxed{4}" state 4.
      Boxes of the same value hedge nothing ("\\boxed{50} or \\boxed{50.0}").
  (b) taken back: after the answer, a retraction word (RETRACTIONS: "wait", "actually",
      "correction", "sorry", "instead", "rather", "I mean", "oops", "hmm", "wrong", ...;
      "no" only as "no wait" or followed by punctuation, so "No remainder is left." is
      prose) or an offered alternative ("or 51", "or maybe", "maybe", "perhaps") is followed
      by a value other than the answer: the first number after the word that is no operand
      ("No wait, it's 51." takes 50 back; "Wait: 23 + 27 = 50." does not). Doubt with no
      other value after it ("50. Hmm, let me recheck.") takes nothing back.
  (b') or restated: after the answer, a clause states a value other than the answer: a
      literal (as `as_number` reads it) that is a whole clause ("\\n51."), or follows the
      clause's last `=`, `:`, "answer is", "it's" / "that is" / "which is", "so" /
      "thus" / "therefore" ("23 + 28 = 51", "The answer is 51", "so 51"). Numbers in prose
      are no statement: "The answer is 50 apples. There were 3 baskets." keeps 50, as do
      "Explanation: 23 + 27 = 50." and a numbered list's "1.".

What the format yields must then be a value, decided by parsing it (asyncrl/rewards/literal.py,
never a pattern over the text): for a number, a literal (`50`, `-3`, `0.5`, `\\frac{1}{2}`,
`\\$1,000`, `72 \\text{ apples}`), never an operation over literals (`84 - 12`,
`6 \\times 7`, `\\sqrt{2500}`), a list or alternatives; for a list of numbers, a list of
literals (`as_numbers`); for any other gold, a single value of a form the gold could take
(`not_a_value`).
"""

from __future__ import annotations

import bisect
import dataclasses
import fractions
import re

from asyncrl.rewards.literal import (
    ALTERNATIVES,
    ARITHMETIC,
    LITERAL,
    literal_value,
    normalize,
    read_answer,
    read_collection,
)

# A final answer longer than this is not one a grader reads (a MATH answer is a few dozen
# characters; a matrix a few hundred): it scores 0 without parsing, so pathological LaTeX
# cannot spend the verifier's time limit.
MAX_ANSWER_CHARS = 400

_BOX_START = re.compile(r"\\(?:boxed|fbox)")
# A GSM8K-style number: thousands groups ("1,234.5") or plain digits; "3,4" is two numbers.
NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?|-?\.\d+")
_ANCHOR = re.compile(r"\banswer\s*(?:(?:is|would be|will be)\s*[:=]?|[:=])", re.IGNORECASE)
# Where an anchored clause ends: a line break, or a sentence end that is not a decimal point.
_CLAUSE_END = re.compile(r"\n|[.!?;](?=\s|$)")
# What may stand right before a final line's answer.
_STATES = re.compile(r"(?:^|=|:|\bis|\bequals)$", re.IGNORECASE)
HEDGES = re.compile(r"\bor\b|\\lor\b|\\vee\b|\beither\b", re.IGNORECASE)
_MARKUP = re.compile(r"\*\*|__|\$|\\\(|\\\)|\\\[|\\\]")
# Words that take back what was just stated, when a value other than it follows (rule (b)).
RETRACTIONS = re.compile(
    r"\b(?:wait|actually|correction|corrected|sorry|instead(?!\s+of\b)|rather(?!\s+than\b)|"
    r"i\s+mean|oops|nope|scratch\s+that|hmm+|mistake|wrong|re-?check\w*|re-?calculat\w*|"
    r"reconsider\w*)\b|\bno\b(?=\s*(?:[,.:;!]|\bwait\b))", re.IGNORECASE)
# An alternative offered after the answer: "or 51", "or maybe 51", "maybe 51".
_OFFERS = re.compile(r"\b(?:maybe|perhaps|possibly)\b|\\lor\b|\\vee\b|"
                     r"\bor\b(?=\s*(?:maybe|perhaps|possibly|[$(\\]*\s*-?\.?\d))", re.IGNORECASE)
# A value: a number, or an integer fraction written in LaTeX (one value, not two).
_VALUE = re.compile(r"\\[dt]?frac\s*\{\s*(-?\d+)\s*\}\s*\{\s*(\d+)\s*\}|" + NUMBER.pattern)
# What makes the number beside it an operand, not a value: an operator, a root, a power.
_OPERATOR_BEFORE = re.compile(r"(?:[-+*/^_]|\\times|\\cdot|\\div|\\sqrt)\s*[({\[]*\s*$")
_OPERATOR_AFTER = re.compile(r"\s*[)}\]]*\s*(?:[-+*/^=<>:]|\\times|\\cdot|\\div|\\le|\\ge|\\ne)")
# What states a value in a clause after the answer (rule (b')).
_STATING = re.compile(
    r"=|:|\b(?:answer|result|total)\s+(?:is|was|would be|will be)\b|"
    r"\b(?:it|that|this|which)(?:'s|’s|\s+is|\s+was)|\b(?:so|thus|hence|therefore)\b",
    re.IGNORECASE)
_LIST_MARKER = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s+")
_DIGIT_LINE = re.compile(r"[^\n]*\d[^\n]*")


@dataclasses.dataclass(frozen=True)
class _Box:
    content: str
    start: int  # where its command starts
    end: int  # just past its closing brace


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in `text`, or None.

    Braces are balanced, so `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`. `\\boxed 5` (no braces,
    as LaTeX allows for one token) gives `5`. If the last box is left open (a response cut at
    the length limit) the result is None: the model never gave a final answer, and falling back
    to an earlier box would reward an answer the model itself went on to abandon. Whether the
    response keeps it is `final_boxed`'s question; this one also reads data (a MATH solution).
    """
    box = _last_box(text)
    return None if box is None else box.content


def final_boxed(response: str) -> str | None:
    """The final answer of a boxed response: `last_boxed`, unless an earlier box is offered
    beside it or the text after takes it back (rules (a), (b), (b') of the module's
    docstring); then None, as for no box."""
    box = _last_box(response)
    if box is None or _hedged(response, box) or not kept(box.content, response[box.end:]):
        return None
    return box.content


def _last_box(text: str) -> _Box | None:
    starts = list(_BOX_START.finditer(text))
    return _box_at(text, starts[-1].start()) if starts else None


def _box_at(text: str, start: int, limit: int | None = None) -> _Box | None:
    """The box whose command starts at `start`; None when it is not one, empty or unclosed
    (or, given a `limit`, holds more characters than that)."""
    i = after = _BOX_START.match(text, start).end()
    while i < len(text) and text[i] == " ":
        i += 1
    if i < len(text) and text[i] != "{" and i > after:  # "\boxed 5": the argument is a token
        token = text[i:].split(maxsplit=1)[0]
        return _Box(token.rstrip("$."), start, i + len(token)) if token.rstrip("$.") else None
    if i >= len(text) or text[i] != "{":
        return None  # "\boxedthing" is not a box; "\boxed" at the very end has no answer
    depth = 0
    for j in range(i, len(text) if limit is None else min(len(text), i + limit + 2)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                content = text[i + 1:j].strip()
                return _Box(content, start, j + 1) if content else None
    return None  # unclosed


def _hedged(response: str, last: _Box) -> bool:
    """Rule (a): an earlier box of another value with a hedge word between it and `last`, and
    no retraction word after that hedge. One pass: the hedge that decides is the last one
    before `last`, whichever earlier box it follows."""
    hedges = list(HEDGES.finditer(response, 0, last.start))
    if not hedges or RETRACTIONS.search(response, hedges[-1].end(), last.start) is not None:
        return False
    for match in _BOX_START.finditer(response, 0, hedges[-1].start()):
        # An earlier box too long to be an answer is none: its closing brace is not sought.
        earlier = _box_at(response, match.start(), limit=MAX_ANSWER_CHARS)
        if earlier is not None and earlier.end <= hedges[-1].start() \
                and not _same(earlier.content, last.content):
            return True
    return False


def _same(a: str, b: str) -> bool:
    value = as_number(a)
    return value == as_number(b) if value is not None else "".join(a.split()) == "".join(b.split())


def stated_answer(response: str) -> str | None:
    """The text of the final answer of a plain-style response (see the module's docstring),
    or None when it states none."""
    response = normalize(response)  # a Unicode minus, full-width digits
    if _BOX_START.search(response):
        return final_boxed(response)  # an unclosed last box: no answer, and nothing else read
    found = _anchored_or_last_line(response)
    if found is None:
        return None
    answer, end = found
    return answer if kept(answer, response[end:]) else None


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
    if not numbers or HEDGES.search(text):
        return None
    last = numbers[-1]
    before = _MARKUP.sub("", text[:last.start()]).rstrip()
    return (last.group(), last.end()) if _STATES.search(before) else None


def kept(answer: str, after: str) -> bool:
    """Whether the text `after` a final answer leaves it standing: no retraction word or
    offered alternative followed by another value (rule (b)), no clause stating another value
    (rule (b')). The answer's own values are those its parse computes: a number's, each item's
    of a list (`3, 5` holds 3 and 5), an operation's (`2^{10}` holds 1024); an answer with no
    rational value (`\\frac{\\sqrt{3}}{2}`, `x+1`) holds none, so every value is another.
    An answer over MAX_ANSWER_CHARS is none to keep."""
    if len(answer) > MAX_ANSWER_CHARS:
        return False
    after = normalize(after)
    own = {item.value for item in _items(answer) if item.value is not None}
    values = list(_values(after))
    starts = [start for start, _ in values]
    for word in (*RETRACTIONS.finditer(after), *_OFFERS.finditer(after)):
        following = bisect.bisect_left(starts, word.end())  # the first value after the word
        if following < len(values) and values[following][1] not in own:
            return False
    return all(stated in own for stated in _stated_values(after))


def _values(text: str):
    """(where it starts, its value) for each number in `text` that is not an operand ("23 +
    27 = 50" holds the one value 50) nor part of a word ("1st", "x2")."""
    for match in _VALUE.finditer(text):
        start, end = match.span()
        before = text[max(start - 24, 0):start]
        binary_minus = match.group().startswith("-") and before[-1:].isalnum()
        if (binary_minus or _OPERATOR_BEFORE.search(before) or _OPERATOR_AFTER.match(text, end)
                or before[-1:].isalpha() or text[end:end + 1].isalpha()):
            continue
        if match.group(1) is not None:  # \frac{p}{q}
            yield start, fractions.Fraction(int(match.group(1)), int(match.group(2)))
        else:
            yield start, fractions.Fraction(match.group().replace(",", ""))


def _stated_values(after: str):
    """The values that clauses of `after` state (rule (b'))."""
    for line in after.split("\n"):
        for clause in _CLAUSE_END.split(_LIST_MARKER.sub("", _MARKUP.sub("", line))):
            marks = list(_STATING.finditer(clause))
            value = as_number(clause[marks[-1].end():] if marks else clause)
            if value is not None:
                yield value


def as_number(text: str | None) -> fractions.Fraction | None:
    """`text` as one exact number written out (a LITERAL of asyncrl/rewards/literal.py: units
    and dress allowed, "\\$1,234.00", "72 apples", "18 \\text{ dollars}", "\\frac{1}{2}"), or
    None when it is anything else: an operation over numbers, several numbers, a hedge, words
    around the number, over MAX_ANSWER_CHARS long."""
    if text is None or len(text) > MAX_ANSWER_CHARS:
        return None
    return literal_value(text)


def as_numbers(text: str | None) -> tuple[str, tuple[fractions.Fraction, ...]] | None:
    """`text` as a list of numbers each written out (every item a LITERAL: `3, 5`,
    `(\\frac{1}{2}, 3)`, `\\{3, 5\\}`), as a key equal for equal lists: a bare list and a set
    are a multiset (`3, 5` = `5, 3` = `\\{5, 3\\}` != `3, 5, 5`), a bracketed tuple or interval
    is ordered and keeps its brackets (`(3, 5)` != `(5, 3)`, `[3, 5]`, `3, 5`). None when it
    is no list or an item is anything but a literal (`1+2, 5`)."""
    if text is None or len(text) > MAX_ANSWER_CHARS:
        return None
    collection = read_collection(text)
    if collection is None or any(item.kind != LITERAL for item in collection.items):
        return None
    values = tuple(item.value for item in collection.items)
    if collection.brackets in ("", "\\{\\}"):
        return "multiset", tuple(sorted(values))
    return collection.brackets, values


def not_a_value(answer_text: str, gold: str | None = None) -> str | None:
    """Why a boxed answer is not a single value that `gold` could pay when graded by
    equivalence, or None. Without a gold (the `format` check in training), why no gold a
    strict grader reads could pay it; a list is an answer then (MATH asks for several
    solutions "separated by commas"). The reasons:

      * longer than MAX_ANSWER_CHARS;
      * alternatives (`\\sqrt{2} \\text{ or } 2`), unless the gold is ("1 or 2");
      * an operation over numbers too large to compute or undefined (`9^{9^{9^{9}}}`, `1/0`):
        it equals nothing, and would only spend the verifier's time;
      * an operation over numbers whose value is a number (`84 - 12`, `\\sqrt{2500}`), as the
        answer or as an item of its list (`2^{5}, 3`), unless the gold or one of its items
        is one too (a gold `2^{10}` is answered `2^{10}` or `1024`): it cannot equal a gold
        that is a literal or irrational;
      * for a gold that is a list of literals (`3, 5`, `(3, 5)`), an item that is not a
        literal (`\\sqrt{9}, 10/2`, `3 \\text{ and } 5`).
    """
    if len(answer_text) > MAX_ANSWER_CHARS:
        return f"longer than {MAX_ANSWER_CHARS} characters"
    reading = read_answer(answer_text)
    gold_reading = None if gold is None else read_answer(gold)
    if reading.kind == ALTERNATIVES and (gold_reading is None or gold_reading.kind != ALTERNATIVES):
        return "alternatives, not one answer"
    items = _items(answer_text)
    if any(item.kind == ARITHMETIC and item.value is None for item in items):
        return "an operation too large to compute, or undefined"
    gold_items = [] if gold is None else _items(gold)
    if any(item.kind == ARITHMETIC for item in items) \
            and not any(item.kind == ARITHMETIC for item in gold_items):
        return "an unevaluated arithmetic expression"
    if gold is not None and as_numbers(gold) is not None \
            and any(item.kind != LITERAL for item in items):
        return "a list item that is not a number written out"
    return None


def _items(text: str) -> list:
    """The readings of the items of `text` when it is a list, else of `text` itself."""
    collection = read_collection(text)
    return [read_answer(text)] if collection is None else list(collection.items)
