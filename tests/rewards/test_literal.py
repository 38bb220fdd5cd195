"""The answer reader the numeric graders decide by: what a final answer is, from its parse."""

import fractions
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.rewards.literal import (
    ALTERNATIVES,
    ARITHMETIC,
    LIST,
    LITERAL,
    OTHER,
    SURD,
    Collection,
    Reading,
    literal_value,
    normalize,
    read_answer,
    read_collection,
)

F = fractions.Fraction


@pytest.mark.parametrize("text, value", [
    ("50", F(50)), ("50.0", F(50)), ("-3", F(-3)), ("+3", F(3)), ("0.25", F(1, 4)),
    (".5", F(1, 2)), ("007", F(7)), ("48.", F(48)),
    (r"\frac{1}{2}", F(1, 2)), (r"\dfrac{3}{4}", F(3, 4)), (r"\tfrac{3}{4}", F(3, 4)),
    (r"\frac12", F(1, 2)), (r"\frac{-3}{4}", F(-3, 4)), (r"-\frac{3}{4}", F(-3, 4)),
    ("1/2", F(1, 2)), ("-1/2", F(-1, 2)), (r"2\frac{1}{4}", F(9, 4)), (r"-2\frac{1}{4}", F(-9, 4)),
    ("1,000", F(1000)), ("1,000,000", F(10 ** 6)), ("1,000.5", F(2001, 2)), (r"1{,}000", F(1000)),
    (r"10,\!000", F(10000)), (r"1\,000", F(1000)),
    (r"\$1,000", F(1000)), ("$50$", F(50)), (r"50 \text{ apples}", F(50)), ("50 apples", F(50)),
    (r"50\text{ m}", F(50)), (r"50 \mathrm{cm}^2", F(50)), (r"50 \text{ cm}^{2}", F(50)),
    # Units of several words or abbreviations, in a text command.
    (r"50 \text{ m/s}", F(50)), (r"50 \text{ sq. ft}", F(50)), (r"50 \mathrm{km/h}", F(50)),
    (r"50 \text{ m/s}^2", F(50)), (r"50\text{ ft.}", F(50)),
    (r"50\%", F(50)), ("50%", F(50)), (r"50^\circ", F(50)), (r"50^{\circ}", F(50)), ("50°", F(50)),
    ("(50)", F(50)), ("((50))", F(50)), ("[50]", F(50)), ("{50}", F(50)),
    (r"\left( 50 \right)", F(50)), (r"\left. 50 \right.", F(50)), (r"\mathbf{50}", F(50)),
    (r"\text{50}", F(50)), (r"\displaystyle 50", F(50)), ("x = 50", F(50)), ("-(5)", F(-5)),
    # Unicode: minus signs and dashes, full-width and other scripts' digits, vulgar fractions.
    ("−5", F(-5)), ("–5", F(-5)), ("－５", F(-5)), ("５０", F(50)), ("٥٠", F(50)), ("½", F(1, 2)),
])
def test_literals_and_their_values(text, value):
    assert read_answer(text).kind == LITERAL
    assert literal_value(text) == value


@pytest.mark.parametrize("text, value", [
    ("34+21-5", F(50)), ("(34)+(21)-(5)", F(50)), (r"34\,+\,21\,-\,5", F(50)), ("55 − 5", F(50)),
    ("{34}+{21}-{5}", F(50)), ("100/2", F(50)), ("2/4", F(1, 2)), (r"\frac{2}{4}", F(1, 2)),
    (r"\frac{50}{1}", F(50)), ("2^{5}", F(32)), ("2^5", F(32)), ("5²", F(25)), ("2^{-1}", F(1, 2)),
    (r"\sqrt{2500}", F(50)), (r"\sqrt[3]{8}", F(2)), ("8^{1/3}", F(2)),
    (r"\sqrt{\frac{1}{4}}", F(1, 2)),
    (r"5 \times 10", F(50)), (r"5 \cdot 10", F(50)), ("5 × 10", F(50)), (r"100 \div 2", F(50)),
    ("10!", F(3628800)), ("--5", F(5)), ("-(-5)", F(5)), ("2(25)", F(50)), ("(5)(10)", F(50)),
    (r"3 \times 10^{5}", F(300000)), (r"\frac{1}{2}+\frac{1}{2}", F(1)),
    (r"25+25 \text{ sq. ft}", F(50)), (r"100/2 \text{ m/s}", F(50)),
])
def test_an_operation_over_literals_is_arithmetic_whatever_it_makes(text, value):
    reading = read_answer(text)
    assert reading.kind == ARITHMETIC and reading.value == value
    assert literal_value(text) is None


@pytest.mark.parametrize("text", [r"9^{9^{9^{9}}}", "10^{100000}", "100000!", r"\sqrt{9^{9^{9}}}",
                                  r"\sqrt{2}^{9^{9}}", r"\frac{1}{0}", "0^{-1}", "(-1)!"])
def test_too_large_or_undefined_is_arithmetic_without_a_value_and_costs_nothing(text):
    start = time.perf_counter()
    assert read_answer(text) == Reading(ARITHMETIC, None)
    assert time.perf_counter() - start < 0.5


@pytest.mark.parametrize("text", [
    r"\sqrt{2}", r"2\sqrt{3}", r"\frac{\sqrt{3}}{2}", r"3+2\sqrt{2}", "2^{1/2}", r"\sqrt{-4}",
    r"\sqrt[3]{2}"])
def test_an_irrational_closed_form_is_a_surd(text):
    assert read_answer(text).kind == SURD


@pytest.mark.parametrize("text, kind", [
    (r"49 \text{, } 50", LIST), ("49, 50", LIST), ("49; 50", LIST), ("12,34", LIST),
    ("1,2345", LIST),
    (r"49 \text{ or } 50", ALTERNATIVES), ("49 or 50", ALTERNATIVES), (r"49 \lor 50", ALTERNATIVES),
    (r"49 \vee 50", ALTERNATIVES), ("either 49", ALTERNATIVES), ("50 or maybe 49", ALTERNATIVES),
    (r"50 \text{ and/or } 51", ALTERNATIVES), (r"50 \text{ m/s or so}", ALTERNATIVES),
    ("49 50", OTHER), ("about 50", OTHER), ("2x", OTHER), ("50 and 49", OTHER), (r"\pi", OTHER),
    (r"(-\infty, 2]", OTHER), (r"\{1, 2\}", OTHER), ("(1, 2)", OTHER), ("2+3i", OTHER),
    (r"\text{(A)}", OTHER), (r"\pm 5", OTHER), ("50 = 50", OTHER), ("5e1", OTHER), ("", OTHER),
    ("(50", OTHER), ("50)", OTHER), (r"\frac{1}{", OTHER), ("\\", OTHER),
    ("(" * 60 + "5" + ")" * 60, OTHER),  # past MAX_DEPTH
    ("1+" * 1000 + "1", OTHER),  # past MAX_CHARS
])
def test_what_is_not_one_value(text, kind):
    assert read_answer(text).kind == kind
    assert literal_value(text) is None


L = LITERAL


@pytest.mark.parametrize("text, brackets, kinds", [
    ("3, 5", "", [L, L]), (r"3 \text{, } 5", "", [L, L]), ("1+2, 5", "", [ARITHMETIC, L]),
    ("(3, 5)", "()", [L, L]), (r"\left( \frac{6}{2}, 5 \right)", "()", [ARITHMETIC, L]),
    ("[1, 3)", "[)", [L, L]), (r"\{3, 5\}", r"\{\}", [L, L]), ("{3, 5}", "", [L, L]),
    (r"(-\infty, 2]", "(]", [OTHER, L]),
    (r"\sqrt{9}, 10/2, x", "", [ARITHMETIC, ARITHMETIC, OTHER]),
])
def test_a_collection_is_read_item_by_item(text, brackets, kinds):
    collection = read_collection(text)
    assert collection.brackets == brackets
    assert [item.kind for item in collection.items] == kinds


@pytest.mark.parametrize("text", ["3", "(3)", "(3), 5 or 6", r"3 \text{ and } 5", "(3, 5", "",
                                  "1+2"])
def test_one_value_alternatives_or_unbalanced_brackets_are_no_collection(text):
    assert read_collection(text) is None


def test_normalize_writes_unicode_forms_in_ascii_and_latex():
    assert normalize("５５ − 5 × 2 ÷ 1 · 3") == r"55 - 5 \times  2 \div  1 \cdot  3"
    assert normalize("x²³ 10⁻³") == "x^{23} 10^{-3}"  # a superscript is a power, not a digit
    assert normalize("½") == "1/2"


LATEX_BITS = ["1", "5", "0", "12", ",", ".", "+", "-", "*", "/", "^", "!", "(", ")", "[", "]",
              "{", "}", "\\frac", "\\sqrt", "\\text{", "\\left(", "\\right)", "\\,", "\\!", "$",
              "\\$", "%", " ", "x", "=", "or", "−", "５", "\\times", "\\{", "\\pi", "\\circ", "\\",
              "²", "፩", "①", "½", "°", "٣"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(LATEX_BITS), max_size=30))
def test_any_text_is_read_without_raising_and_a_literal_is_its_own_value(bits):
    text = "".join(bits)
    reading = read_answer(text)
    assert reading.kind in (LITERAL, ARITHMETIC, SURD, LIST, ALTERNATIVES, OTHER)
    collection = read_collection(text)
    assert collection is None or (isinstance(collection, Collection) and len(collection.items) > 1)
    if reading.kind == LITERAL:
        assert isinstance(reading.value, fractions.Fraction)
        # The value survives being written out again as the plainest literal.
        assert literal_value(str(reading.value)) == reading.value
