"""The built-in calculator tool: exact arithmetic on what a model writes, with no `eval`.

    evaluate("1234 * (5678 - 9) / 2")  ->  "3497773"
    evaluate("2 ** 10000")             ->  ToolError: the result would have more than 1000 digits

The expression is parsed with `ast` and walked here: integers and decimals (exact, as
fractions), + - * / // % and ** , unary minus and plus, parentheses. Anything else (names,
calls, attributes, strings, comparisons) is a ToolError naming what is not allowed. Limits
keep a call bounded in time and memory whatever the model writes: the expression's length
and node count, the digits of every intermediate result, and the size of an exponent (so
`9 ** 9 ** 9` is refused before it is computed). A result is an integer when it is one,
else a fraction in lowest terms and its decimal to 12 significant digits.
"""

from __future__ import annotations

import ast
import fractions
import math

MAX_CHARS = 200
MAX_NODES = 100
MAX_DIGITS = 1000


class ToolError(ValueError):
    """What a tool says back to the model when a call cannot be carried out."""


def evaluate(expression: str) -> str:
    """The value of an arithmetic expression, as the tool's answer text."""
    if not isinstance(expression, str):
        raise ToolError(f"the calculator takes an expression as a string, got "
                        f"{type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise ToolError("the expression is empty")
    if len(text) > MAX_CHARS:
        raise ToolError(f"the expression has {len(text)} characters; at most {MAX_CHARS}")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as error:
        raise ToolError(f"not an arithmetic expression: {error.msg}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise ToolError(f"the expression has {nodes} parts; at most {MAX_NODES}")
    return _text(_value(tree.body))


_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.Pow: "**"}


def _value(node: ast.AST) -> fractions.Fraction:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ToolError(f"only numbers are allowed, not {node.value!r}")
        return _checked(fractions.Fraction(str(node.value)))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        return _checked(_apply(type(node.op), left, right))
    raise ToolError(f"{_describe(node)} is not allowed: numbers, + - * / // % ** and "
                    f"parentheses only")


def _apply(op, left: fractions.Fraction, right: fractions.Fraction) -> fractions.Fraction:
    if op in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
        raise ToolError("division by zero")
    if op is ast.Add:
        return left + right
    if op is ast.Sub:
        return left - right
    if op is ast.Mult:
        return left * right
    if op is ast.Div:
        return left / right
    if op is ast.FloorDiv:
        return fractions.Fraction(left // right)
    if op is ast.Mod:
        return left % right
    return _power(left, right)


def _power(base: fractions.Fraction, exponent: fractions.Fraction) -> fractions.Fraction:
    if exponent.denominator != 1:
        raise ToolError("only whole-number exponents are allowed")
    if base == 0 and exponent < 0:
        raise ToolError("division by zero")
    # The result's digits, estimated before it is computed (then checked exactly).
    if base != 0:
        scale = max(math.log10(abs(base.numerator)), math.log10(base.denominator))
        if scale * abs(exponent.numerator) > MAX_DIGITS + 1:
            raise ToolError(f"the result would have more than {MAX_DIGITS} digits")
    return base ** exponent.numerator


def _checked(value: fractions.Fraction) -> fractions.Fraction:
    if max(_digits(value.numerator), _digits(value.denominator)) > MAX_DIGITS:
        raise ToolError(f"a result would have more than {MAX_DIGITS} digits")
    return value


def _digits(n: int) -> int:
    n = abs(n)
    return 1 if n == 0 else int(n.bit_length() * math.log10(2)) + 1


def _text(value: fractions.Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    return f"{value.numerator}/{value.denominator} (about {float(value):.12g})"


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"the name {node.id!r}"
    if isinstance(node, ast.Call):
        return "a function call"
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return f"the operator {type(node.op).__name__}"
    return f"a {type(node).__name__}"
