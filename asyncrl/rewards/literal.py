r"""Reading a final answer without evaluating it: a number written out, or something else.

A grader whose gold answer is a number pays only a *literal* equal to it. A restatement of
the problem (`34+21-5`, `100/2`, `2^{5}`, `\sqrt{2500}`) is an operation over literals
however it is dressed (`(34)+(21)-(5)`, `34\,+\,21\,-\,5`, `{34}+{21}-{5}`, `55 − 5`), and
pays nothing. That is decided here from a parse of the answer, never from a pattern over its
text: a pattern misses the next dress.

Normalisation, before tokens are read (what writes a value without changing it):
  * Unicode: NFKC (full-width digits and letters), other scripts' decimal digits, the minus
    sign and the dashes (− – — ‐ ‑ ‒ ― ﹣) as `-`, `×` `·` `⋅` `÷` `√` `⁄` `°` as their LaTeX,
    superscript digits as a power (`5²` is `5^{2}`, not 52).
  * LaTeX dress, dropped as tokens are read: `$` and `\$`, spacing (`\,` `\;` `\:` `\!` `\ `
    `~` `\quad` `\qquad`), `\left` / `\right` / `\big…` sizing, `\displaystyle`; text and font
    commands (`\text{...}`, `\mathrm`, `\mathbf`, `\mbox`, …) are transparent: their content
    is read in place, so `\text{ apples}` is a word and `\text{, }` a comma.
  * A number may group thousands with `,`, `{,}`, `,\!` or `\,` (every group three digits,
    the first one to three): `1,000`, `10,\!000`, `1\,000`. `12,34` is two numbers.

Grammar (over the tokens; `WORD` is a run of letters, `NUMBER` an integer or decimal):

    answer    := item ((',' | ';') item)*     several items: a LIST
    item      := [LETTER '='] expr unit* ['.']
    unit      := (WORD | UNIT) ['^' NUMBER | '^' '{' NUMBER '}'] | '%' | '^\circ'
    expr      := term (('+' | '-') term)*
    term      := signed (('*' | '/') signed | atom)*    (`\times` `\cdot` are '*', `\div` '/';
                                                       an atom right after: a product, 2\sqrt{3})
    signed    := ('+' | '-') signed | power
    power     := postfix ['^' signed]
    postfix   := atom '!'*
    atom      := NUMBER | '(' expr ')' | '[' expr ']' | '{' expr '}'
               | FRAC group group | SQRT ['[' expr ']'] group
    group     := '{' expr '}'                   (`\frac12`: a bare digit is its own group)

A unit is a word after the value: one from a text command, or of two letters or more
(`50 \text{ m}`, `50 apples`; `2x` is not 2). A text command whose content is words joined by
`/` or abbreviated with dots (`\text{ m/s}`, `\mathrm{km/h}`, `\text{ sq. ft}`) is one UNIT
token, so `50 \text{ m/s}` is a literal and `25+25 \text{ sq. ft}` an operation. "or",
"either", "maybe", "perhaps" and `\lor` / `\vee` anywhere make ALTERNATIVES; "and", "plus",
"about", … are never units (nor part of a UNIT).

What an answer is (`Reading.kind`):
    LITERAL       one signed integer or decimal (`50`, `-3`, `42.0`, `0.5`, `\$1,000`,
                  `50 \text{ apples}`, `(50)`, `x = 50`), a reduced integer fraction p/q with
                  q ≥ 2 (`\frac{1}{2}`, `\dfrac{-3}{4}`, `1/2`), or a mixed number
                  (`2\frac{1}{4}` is 9/4). `Reading.value` is its exact value.
    ARITHMETIC    any other expression of the grammar whose value is rational, too large to
                  compute, or undefined: a number written as an operation (`34+21-5`, `100/2`,
                  `2/4`, `\frac{50}{1}`, `2^{5}`, `\sqrt{2500}`, `10!`, `5 \times 10`,
                  `3 \times 10^{5}`, `9^{9^{9^{9}}}`, `1/0`). Never paid for a numeric gold.
                  `Reading.value` is the value where one was computed (bounded: nothing
                  past MAX_BITS is ever formed, so a power tower costs nothing).
    SURD          an expression of the grammar with an irrational or non-real value
                  (`\sqrt{2}`, `2\sqrt{3}`, `\frac{\sqrt{3}}{2}`, `2^{1/2}`): a closed form.
    LIST          several items separated by commas or semicolons (`49, 50`, `49 \text{, } 50`).
    ALTERNATIVES  an "or" anywhere (`49 \text{ or } 50`, `49 \lor 50`).
    OTHER         anything outside the grammar: variables, `\pi`, intervals, sets, words,
                  two numbers side by side, nothing at all, more than MAX_DEPTH nesting.

`read_collection` reads the items of a LIST, or of one pair of brackets around the whole
holding separators (a tuple `(3, 5)`, an interval `[1, 3)`, a set `\{3, 5\}`: OTHER above),
each item as `read_answer` reads one: so `(\frac{6}{2}, 5)` is a tuple whose first item is
ARITHMETIC. Neither function raises: whatever they cannot read is OTHER, or no collection.
"""

from __future__ import annotations

import dataclasses
import fractions
import math
import re
import unicodedata

Fraction = fractions.Fraction

LITERAL, ARITHMETIC, SURD, LIST, ALTERNATIVES, OTHER = (
    "literal", "arithmetic", "surd", "list", "alternatives", "other")

# No intermediate value above this many bits is formed (a 3,000-digit number): a larger one is
# "too large", which only an operation can produce, so the answer is ARITHMETIC.
MAX_BITS = 10_000
# Deeper nesting than this, or a longer text, is OTHER: the parse and the valuation recurse,
# and must stay far from Python's stack limit. (A grader caps answers shorter still.)
MAX_DEPTH = 40
MAX_CHARS = 1000
_MAX_FACTORIAL = 1000
_MAX_ROOT = 64


@dataclasses.dataclass(frozen=True)
class Reading:
    kind: str
    value: Fraction | None = None  # LITERAL's value; ARITHMETIC's where it was computed


def read_answer(text: str) -> Reading:
    """What `text` (a final answer: a box's content, a stated answer) is; see the module."""
    if len(text) > MAX_CHARS:
        return Reading(OTHER)
    try:
        tokens = _Lexer(normalize(text)).tokens()
    except (_Unreadable, RecursionError):  # nested \frac{ lexes recursively
        return Reading(OTHER)
    if any(t.kind == _OR for t in tokens):
        return Reading(ALTERNATIVES)
    items = _split_items(tokens)
    if items is None:
        return Reading(OTHER)
    if len(items) > 1:
        return Reading(LIST)
    return _read_item(items[0])


@dataclasses.dataclass(frozen=True)
class Collection:
    """Several items, each read as an answer of its own (`Reading`), and what encloses them:
    "" for a bare list (`3, 5`) else the opening and closing bracket as written without their
    sizing: "()" for `(3, 5)`, "[)" for `[1, 3)`, "\\{\\}" for `\\{3, 5\\}`."""

    brackets: str
    items: tuple[Reading, ...]


def read_collection(text: str) -> Collection | None:
    """`text` as a list, tuple, interval or set of two items or more: separators at its top
    level (a LIST), or inside one pair of brackets around the whole (`(3, 5)`, `\\{3, 5\\}`,
    OTHER to `read_answer`); LaTeX's grouping braces around it are dropped. None otherwise, or
    for ALTERNATIVES. Like `read_answer`, it never raises."""
    if len(text) > MAX_CHARS:
        return None
    try:
        tokens = _Lexer(normalize(text)).tokens()
    except (_Unreadable, RecursionError):
        return None
    if any(t.kind == _OR for t in tokens):
        return None
    brackets = ""
    while _enclosed(tokens) and not brackets:
        brackets = "" if tokens[0].text == "{" else tokens[0].text + tokens[-1].text
        tokens = tokens[1:-1]
    items = _split_items(tokens)
    if items is None or len(items) < 2:
        return None
    return Collection(brackets, tuple(_read_item(item) for item in items))


def _enclosed(tokens: list[_Token]) -> bool:
    """Whether the first token opens a bracket that the last token closes."""
    depth = 0
    for i, token in enumerate(tokens):
        depth += (token.kind == _OPEN) - (token.kind == _CLOSE)
        if depth == 0:
            return i == len(tokens) - 1 and i > 0
    return False


def literal_value(text: str) -> Fraction | None:
    """The value of `text` when it is a LITERAL, else None."""
    reading = read_answer(text)
    return reading.value if reading.kind == LITERAL else None


# ---------------------------------------------------------------------------- normalising

_SUPERSCRIPTS = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+"))
_CHARACTERS = {
    **dict.fromkeys("−–—‐‑‒―﹣", "-"),
    "×": r"\times ", "✕": r"\times ", "·": r"\cdot ", "⋅": r"\cdot ", "∙": r"\cdot ",
    "÷": r"\div ", "√": r"\sqrt ", "⁄": "/", "∕": "/", "°": r"^\circ ",
}


def normalize(text: str) -> str:
    """`text` with the Unicode forms of digits and operators written in ASCII / LaTeX."""
    out, i = [], 0
    while i < len(text):  # a run of superscripts is one exponent: x²³ is x^{23}
        j = i
        while j < len(text) and text[j] in _SUPERSCRIPTS:
            j += 1
        if j > i:
            out.append("^{" + "".join(_SUPERSCRIPTS[c] for c in text[i:j]) + "}")
            i = j
        else:
            out.append(text[i])
            i += 1
    text = unicodedata.normalize("NFKC", "".join(out))
    return "".join(_CHARACTERS.get(c) or (str(unicodedata.decimal(c)) if c.isdecimal() else c)
                   for c in text)


# ---------------------------------------------------------------------------------- tokens

_NUM, _OP, _OPEN, _CLOSE, _SEP, _OR, _WORD, _EQ, _FRAC, _SQRT, _UNIT, _DOT, _SYMBOL = (
    "number", "op", "open", "close", "sep", "or", "word", "eq", "frac", "sqrt", "unit", "dot",
    "symbol")


@dataclasses.dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    value: Fraction | None = None
    integer: bool = False  # a NUMBER without a decimal point
    in_text: bool = False  # a WORD from a text command (\text{ m}: a unit even of one letter)


class _Unreadable(Exception):
    pass


_OR_WORDS = {"or", "either", "maybe", "perhaps", "possibly"}
_SPACING = {"quad", "qquad", "enspace", "thinspace", "medspace", "thickspace", "negthinspace",
            "negmedspace", "displaystyle", "textstyle", "left", "right", "middle", "big", "Big",
            "bigg", "Bigg", "bigl", "bigr", "Bigl", "Bigr", "biggl", "biggr", "Biggl", "Biggr"}
_TEXT_COMMANDS = {"text", "textrm", "textnormal", "textup", "textsf", "textbf", "textit", "mbox",
                  "mathrm", "mathbf", "mathit", "mathsf", "mathnormal", "boldsymbol", "bm"}
_COMMAND_TOKENS = {"times": (_OP, "*"), "cdot": (_OP, "*"), "ast": (_OP, "*"),
                   "div": (_OP, "/"), "lor": (_OR, "or"), "vee": (_OR, "or"),
                   "frac": (_FRAC, "frac"), "dfrac": (_FRAC, "frac"), "tfrac": (_FRAC, "frac"),
                   "cfrac": (_FRAC, "frac"), "sqrt": (_SQRT, "sqrt")}
_CHAR_TOKENS = {"(": _OPEN, "[": _OPEN, "{": _OPEN, ")": _CLOSE, "]": _CLOSE, "}": _CLOSE,
                ",": _SEP, ";": _SEP, "+": _OP, "-": _OP, "*": _OP, "/": _OP, "^": _OP,
                "!": _OP, "=": _EQ, "%": _UNIT, ".": _DOT}
# Separators of thousands groups, longest first.
_GROUP_SEPARATORS = (",\\!", "{,}", ",", "\\,")


class _Lexer:
    def __init__(self, text: str, in_text: bool = False):
        self.text, self.i, self.in_text = text, 0, in_text
        self.out: list[_Token] = []

    def tokens(self) -> list[_Token]:
        text = self.text
        while self.i < len(text):
            c = text[self.i]
            if c.isspace() or c in "$~":
                self.i += 1
            elif _digits(c) or (c == "." and _digits(text[self.i + 1:self.i + 2])):
                self._number()
            elif c == "\\":
                self._command()
            elif c == "^" and self._degree():
                pass
            elif c in _CHAR_TOKENS:
                self.out.append(_Token(_CHAR_TOKENS[c], c))
                self.i += 1
            elif c.isascii() and c.isalpha():
                j = self.i
                while j < len(text) and text[j].isascii() and text[j].isalpha():
                    j += 1
                word = text[self.i:j]
                kind = _OR if word.lower() in _OR_WORDS else _WORD
                self.out.append(_Token(kind, word, in_text=self.in_text))
                self.i = j
            else:
                self.out.append(_Token(_SYMBOL, c))
                self.i += 1
        return self.out

    def _number(self) -> None:
        text, start = self.text, self.i
        j = start
        while j < len(text) and _digits(text[j]):
            j += 1
        digits = text[start:j]
        grouped = len(digits) <= 3  # a first group of one to three digits: groups may follow
        while grouped:
            separator = next((s for s in _GROUP_SEPARATORS if text.startswith(s, j)), None)
            k = j + len(separator) if separator else j
            group = text[k:k + 4]  # exactly three digits, then no fourth
            if not separator or len(group) < 3 or not _digits(group[:3]) or _digits(group[3:]):
                break
            digits, j = digits + group[:3], k + 3
        integer = True
        if text.startswith(".", j) and _digits(text[j + 1:j + 2]):
            k = j + 1
            while k < len(text) and _digits(text[k]):
                k += 1
            digits, j, integer = (digits or "0") + text[j:k], k, False
        self.out.append(_Token(_NUM, text[start:j], Fraction(digits), integer))
        self.i = j

    def _command(self) -> None:
        text = self.text
        j = self.i + 1
        if j >= len(text):
            raise _Unreadable
        if not (text[j].isascii() and text[j].isalpha()):  # \, \; \! \  \$ \% \{ \} ...
            self.i = j + 1
            if text[j] == "%":
                self.out.append(_Token(_UNIT, "%"))
            elif text[j] in "{}":  # a set's braces: brackets, but no grouping
                self.out.append(_Token(_OPEN if text[j] == "{" else _CLOSE, "\\" + text[j]))
            elif text[j] not in ",;:! $":  # spacing and \$ are dress
                self.out.append(_Token(_SYMBOL, "\\" + text[j]))
            return
        while j < len(text) and text[j].isascii() and text[j].isalpha():
            j += 1
        name, self.i = text[self.i + 1:j], j
        if name in _SPACING:
            if name in ("left", "right") and text.startswith(".", self.i):
                self.i += 1  # \left. : an invisible delimiter
        elif name in _TEXT_COMMANDS:
            content = self._group()
            if _compound_unit(content):
                self.out.append(_Token(_UNIT, content.strip()))
            else:
                self.out.extend(_Lexer(content, in_text=True).tokens())
        elif name in _COMMAND_TOKENS:
            kind, token_text = _COMMAND_TOKENS[name]
            self.out.append(_Token(kind, token_text))
            if kind == _FRAC:
                self._bare_arguments(2)
            elif kind == _SQRT and not self._skip_spaces().startswith("["):
                self._bare_arguments(1)
        else:
            self.out.append(_Token(_SYMBOL, "\\" + name))

    def _skip_spaces(self) -> str:
        while self.i < len(self.text) and self.text[self.i] == " ":
            self.i += 1
        return self.text[self.i:]

    def _group(self) -> str:
        """The content of the `{...}` at the cursor, which moves past it."""
        rest = self._skip_spaces()
        if not rest.startswith("{"):
            raise _Unreadable
        depth = 0
        for j, c in enumerate(rest):
            depth += (c == "{") - (c == "}")
            if depth == 0:
                self.i += j + 1
                return rest[1:j]
        raise _Unreadable

    def _bare_arguments(self, count: int) -> None:
        """`\\frac12`: LaTeX reads one character as an argument that has no braces."""
        for _ in range(count):
            rest = self._skip_spaces()
            if rest.startswith("{"):
                self.out.extend(_Lexer("{" + self._group() + "}", self.in_text).tokens())
            elif rest[:1].isascii() and rest[:1].isalnum():
                self.out.extend([_Token(_OPEN, "{"),
                                 *_Lexer(rest[0], self.in_text).tokens(), _Token(_CLOSE, "}")])
                self.i += 1
            else:
                return

    def _degree(self) -> bool:
        """`^\\circ` or `^{\\circ}` at the cursor: a unit, taken; else nothing happens."""
        for form in ("^\\circ", "^{\\circ}", "^ \\circ", "^{ \\circ }"):
            if self.text.startswith(form, self.i):
                self.out.append(_Token(_UNIT, "degrees"))
                self.i += len(form)
                return True
        return False


# Words joined by "/" or written with abbreviating dots: `m/s`, `sq. ft`, `km/h`.
_COMPOUND = re.compile(r"\s*[A-Za-z]+\.?(?:\s*/\s*[A-Za-z]+\.?|\s+[A-Za-z]+\.?)*\s*")


def _compound_unit(text: str) -> bool:
    """Whether a text command's content is one unit of several words or abbreviations (a
    single word is read as a word, and is a unit there anyway)."""
    words = {word.lower() for word in re.findall(r"[A-Za-z]+", text)}
    return (_COMPOUND.fullmatch(text) is not None and any(c in text for c in "./")
            and not words & (_OR_WORDS | _NOT_UNITS))


def _digits(text: str) -> bool:
    """Whether `text` is ASCII digits (normalize wrote every script's decimal digits so; a
    character that is a "digit" of no decimal system, ፩ or ①, is not one)."""
    return text.isascii() and text.isdigit()


def _split_items(tokens: list[_Token]) -> list[list[_Token]] | None:
    """The tokens split at the separators outside any bracket; None: brackets unbalanced."""
    items, current, depth = [], [], 0
    for token in tokens:
        depth += (token.kind == _OPEN) - (token.kind == _CLOSE)
        if depth < 0:
            return None
        if token.kind == _SEP and depth == 0:
            items.append(current)
            current = []
        else:
            current.append(token)
    items.append(current)
    if depth:
        return None
    return [item for item in items if item] or [[]]


# --------------------------------------------------------------------------------- parsing

_NOT_UNITS = {"and", "to", "plus", "minus", "times", "over", "divided", "by", "of", "about",
              "approximately", "roughly", "around", "nearly", "almost", "not", "no", "is",
              "equals"}


def _strip_dress(tokens: list[_Token]) -> list[_Token]:
    """The item without its "x =" before and its units and full stop after."""
    if tokens and tokens[-1].kind == _DOT:
        tokens = tokens[:-1]
    if len(tokens) > 2 and tokens[0].kind == _WORD and len(tokens[0].text) == 1 \
            and tokens[1].kind == _EQ:
        tokens = tokens[2:]
    end = len(tokens)
    while end:
        kinds = [t.kind for t in tokens[max(end - 6, 0):end]]
        if kinds[-1] == _UNIT:
            end -= 1
        elif kinds[-2:] == [_OP, _NUM] and tokens[end - 2].text == "^" and end > 2 \
                and _is_unit(tokens[end - 3]):  # cm^2
            end -= 3
        elif kinds[-4:] == [_OP, _OPEN, _NUM, _CLOSE] and tokens[end - 4].text == "^" \
                and end > 4 and _is_unit(tokens[end - 5]):  # cm^{2}
            end -= 5
        elif _is_unit(tokens[end - 1]):
            end -= 1
        else:
            break
    return tokens[:end]


def _is_unit(token: _Token) -> bool:
    return token.kind == _UNIT or (token.kind == _WORD and token.text.lower() not in _NOT_UNITS
                                   and (token.in_text or len(token.text) > 1))


def _read_item(tokens: list[_Token]) -> Reading:
    tokens = _strip_dress(tokens)
    if not tokens:
        return Reading(OTHER)
    try:
        node = _Parser(tokens).parse()
        value = _literal(node)
        if value is not None:
            return Reading(LITERAL, value)
        value = _value(node)  # recursive: a chain of MAX_CHARS / 2 sums stays far from the limit
    except (_Unreadable, RecursionError):
        return Reading(OTHER)
    if value is _IRRATIONAL:
        return Reading(SURD)
    return Reading(ARITHMETIC, value if isinstance(value, Fraction) else None)


class _Parser:
    """Recursive descent over the grammar in the module's docstring. Nodes are tuples:
    ("num", token), ("neg" | "pos" | "fact", x), ("add" | "sub" | "mul" | "div" | "pow" |
    "frac" | "juxt", a, b), ("sqrt", x, index or None)."""

    def __init__(self, tokens: list[_Token]):
        self.tokens, self.i, self.depth = tokens, 0, 0

    def parse(self):
        node = self.expr()
        if self.i != len(self.tokens):
            raise _Unreadable
        return node

    def peek(self, kind: str | None = None, text: str | None = None) -> bool:
        if self.i >= len(self.tokens):
            return False
        token = self.tokens[self.i]
        return (kind is None or token.kind == kind) and (text is None or token.text == text)

    def take(self, kind: str, text: str | None = None) -> _Token:
        if not self.peek(kind, text):
            raise _Unreadable
        self.i += 1
        return self.tokens[self.i - 1]

    def expr(self):
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Unreadable
        node = self.term()
        while self.peek(_OP, "+") or self.peek(_OP, "-"):
            op = "add" if self.take(_OP).text == "+" else "sub"
            node = (op, node, self.term())
        self.depth -= 1
        return node

    def term(self):
        node = self.signed()
        while True:
            if self.peek(_OP, "*") or self.peek(_OP, "/"):
                op = "mul" if self.take(_OP).text == "*" else "div"
                node = (op, node, self.signed())
            elif self.peek(_OPEN) or self.peek(_FRAC) or self.peek(_SQRT):
                node = ("juxt", node, self.power())
            else:  # a number right after a factor (49 50) is left over: unreadable
                return node

    def signed(self):
        if self.peek(_OP, "-") or self.peek(_OP, "+"):
            op = "neg" if self.take(_OP).text == "-" else "pos"
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise _Unreadable
            node = (op, self.signed())
            self.depth -= 1
            return node
        return self.power()

    def power(self):
        node = self.postfix()
        if self.peek(_OP, "^"):
            self.take(_OP)
            node = ("pow", node, self.signed())
        return node

    def postfix(self):
        node = self.atom()
        while self.peek(_OP, "!"):
            self.take(_OP)
            node = ("fact", node)
        return node

    def atom(self):
        if self.peek(_NUM):
            return ("num", self.take(_NUM))
        if self.peek(_OPEN):
            closing = {"(": ")", "[": "]", "{": "}"}.get(self.take(_OPEN).text)
            if closing is None:  # \{: a set
                raise _Unreadable
            node = self.expr()
            self.take(_CLOSE, closing)
            return node
        if self.peek(_FRAC):
            self.take(_FRAC)
            return ("frac", self.group(), self.group())
        if self.peek(_SQRT):
            self.take(_SQRT)
            index = None
            if self.peek(_OPEN, "["):
                self.take(_OPEN)
                index = self.expr()
                self.take(_CLOSE, "]")
            return ("sqrt", self.group(), index)
        raise _Unreadable

    def group(self):
        self.take(_OPEN, "{")
        node = self.expr()
        self.take(_CLOSE, "}")
        return node


# ------------------------------------------------------------------------------ the values


def _literal(node) -> Fraction | None:
    """The value of `node` when it is a literal (see LITERAL in the module's docstring)."""
    sign = 1
    if node[0] in ("neg", "pos"):
        sign, node = (-1 if node[0] == "neg" else 1), node[1]
    elif node[0] == "juxt" and node[1][0] in ("neg", "pos"):  # -2\frac{1}{4} parses (-2)·¼
        sign, node = (-1 if node[1][0] == "neg" else 1), ("juxt", node[1][1], node[2])
    if node[0] == "num":
        return sign * node[1].value
    if node[0] in ("frac", "div"):
        fraction = _reduced(node[1], node[2], signed=sign == 1)
        return None if fraction is None else sign * fraction
    if node[0] == "juxt" and _integer(node[1]) is not None and node[2][0] == "frac":
        whole, part = _integer(node[1]), _reduced(node[2][1], node[2][2], signed=False)
        if part is not None and 0 < part < 1:  # 2\frac{1}{4}: a mixed number
            return sign * (whole + part)
    return None


def _integer(node) -> int | None:
    if node[0] == "num" and node[1].integer:
        return int(node[1].value)
    return None


def _reduced(numerator, denominator, signed: bool) -> Fraction | None:
    """p/q when both are integer literals (p signed only if `signed`), q ≥ 2, gcd(p, q) = 1."""
    sign = 1
    if signed and numerator[0] == "neg":
        sign, numerator = -1, numerator[1]
    p, q = _integer(numerator), _integer(denominator)
    if p is None or q is None or q < 2 or math.gcd(p, q) != 1:
        return None
    return Fraction(sign * p, q)


class _Special:
    """A value that is not a rational number; the first one listed wins in any operation."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


_HUGE, _UNDEFINED, _IRRATIONAL = _Special("huge"), _Special("undefined"), _Special("irrational")
_PRECEDENCE = (_HUGE, _UNDEFINED, _IRRATIONAL)


def _value(node):
    """The exact value of `node`, or _HUGE (over MAX_BITS), _UNDEFINED (1/0) or _IRRATIONAL
    (irrational or not real). Nothing over MAX_BITS is ever computed."""
    kind = node[0]
    if kind == "num":
        return node[1].value
    if kind in ("neg", "pos", "fact"):
        x = _value(node[1])
        if isinstance(x, _Special):
            return x
        return -x if kind == "neg" else x if kind == "pos" else _factorial(x)
    if kind == "sqrt":
        parts = [_value(node[1]), Fraction(2) if node[2] is None else _value(node[2])]
    else:
        parts = [_value(node[1]), _value(node[2])]
    special = next((s for s in _PRECEDENCE if any(p is s for p in parts)), None)
    if special is not None:
        if kind == "pow" and special is _IRRATIONAL and isinstance(parts[1], Fraction) \
                and abs(parts[1]) > MAX_BITS:
            return _HUGE  # \sqrt{2}^{10^{9}}: too large for math-verify as well
        return special
    a, b = parts
    if kind in ("add", "sub", "mul", "juxt"):
        result = a + b if kind == "add" else a - b if kind == "sub" else a * b
        return _bounded(result)
    if kind in ("div", "frac"):
        return _UNDEFINED if b == 0 else _bounded(a / b)
    if kind == "pow":
        return _power(a, b)
    return _root(a, b)  # sqrt: radicand, index


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _bounded(x: Fraction):
    return _HUGE if _bits(x) > MAX_BITS else x


def _factorial(x: Fraction):
    if x.denominator != 1 or x < 0:
        return _UNDEFINED
    if x > _MAX_FACTORIAL:
        return _HUGE
    return Fraction(math.factorial(int(x)))


def _power(base: Fraction, exponent: Fraction):
    if base == 0:
        return _UNDEFINED if exponent <= 0 else Fraction(0)
    if exponent.denominator != 1:
        if base < 0:
            return _IRRATIONAL  # not real (or a branch nobody means)
        rooted = _root(base, Fraction(exponent.denominator))
        if not isinstance(rooted, Fraction):
            return rooted
        base, exponent = rooted, Fraction(exponent.numerator)
    if abs(base) != 1 and abs(exponent) * _bits(base) > MAX_BITS:
        return _HUGE
    return base ** int(exponent)


def _root(radicand: Fraction, index: Fraction):
    if index.denominator != 1 or not 2 <= index <= _MAX_ROOT:
        return _IRRATIONAL if index != 1 else radicand
    n = int(index)
    if radicand < 0:
        if n % 2 == 0:
            return _IRRATIONAL  # not real
        root = _root(-radicand, index)
        return -root if isinstance(root, Fraction) else root
    p, q = _integer_root(radicand.numerator, n), _integer_root(radicand.denominator, n)
    if p ** n != radicand.numerator or q ** n != radicand.denominator:
        return _IRRATIONAL
    return Fraction(p, q)


def _integer_root(x: int, n: int) -> int:
    """⌊x^(1/n)⌋ for x ≥ 0, exactly (Newton's method on integers)."""
    if x < 2:
        return x
    guess = 1 << ((x.bit_length() + n - 1) // n)  # above the root
    while True:
        better = ((n - 1) * guess + x // guess ** (n - 1)) // n
        if better >= guess:
            return guess
        guess = better
