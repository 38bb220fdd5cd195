"""The calculator tool and the Hermes tool-call format (issue 48's building blocks)."""

import fractions

import pytest
from hypothesis import given, settings, strategies as st

from asyncrl.agents.calculator import MAX_DIGITS, ToolError, evaluate
from asyncrl.agents.tool_calls import TOOL_CALL_FORMATS, ToolCall, run_tool


@pytest.mark.parametrize("expression, value", [
    ("1234 * (5678 - 9) / 2", "3497773"), ("48213 * 90817", str(48213 * 90817)),
    ("7 / 3", "7/3 (about 2.33333333333)"), ("-3 // 2", "-2"), ("17 % 5", "2"),
    ("1.5 * 4", "6"), ("0.1 + 0.2", "3/10 (about 0.3)"),
    ("(1/3) ** 2", "1/9 (about 0.111111111111)"),
    ("2 ** -2", "1/4 (about 0.25)"), ("+5 - -5", "10"), ("10 ** 999", "1" + "0" * 999)])
def test_the_calculator_is_exact(expression, value):
    assert evaluate(expression) == value


@pytest.mark.parametrize("expression, refusal", [
    ("__import__('os').system('true')", "a function call is not allowed"),
    ("x + 1", "the name 'x' is not allowed"), ("'a' * 3", "only numbers"),
    ("(1).real", "a Attribute is not allowed"), ("1 < 2", "a Compare is not allowed"),
    ("True + 1", "only numbers"), ("1 / 0", "division by zero"), ("5 % 0", "division by zero"),
    ("0 ** -1", "division by zero"), ("2 ** 0.5", "whole-number exponents"),
    ("9 ** 9 ** 9", f"more than {MAX_DIGITS} digits"), ("10 ** 1000", f"more than {MAX_DIGITS}"),
    ("1 +", "not an arithmetic expression"), ("", "empty"), ("1+" * 150 + "1", "characters"),
    ("-" * 120 + "1", "parts")])
def test_the_calculator_refuses_what_is_not_bounded_arithmetic(expression, refusal):
    with pytest.raises(ToolError, match=refusal.replace("(", r"\(").replace("*", r"\*")):
        evaluate(expression)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.integers(-10**6, 10**6).map(str),
                    lambda inner: st.tuples(inner, st.sampled_from("+-*"), inner).map(
                        lambda t: f"({t[0]} {t[1]} {t[2]})"), max_leaves=12))
def test_integer_arithmetic_matches_python(expression):
    want = fractions.Fraction(eval(expression))  # the test's reference: trusted input
    assert evaluate(expression) == str(want.numerator)


def test_hermes_calls_are_parsed_and_run():
    hermes = TOOL_CALL_FORMATS.build("hermes")
    turn = ('I will multiply.\n<tool_call>\n{"name": "calculator", "arguments": '
            '{"expression": "1234 * 5678"}}\n</tool_call>\n<tool_call>{"name": "calculator", '
            '"arguments": "{\\"expression\\": \\"2 + 2\\"}"}')  # the last cut at the stop
    calls = hermes.parse(turn)
    assert calls == [ToolCall("calculator", {"expression": "1234 * 5678"}),
                     ToolCall("calculator", {"expression": "2 + 2"})]
    assert [run_tool(c) for c in calls] == ["7006652", "4"]
    assert hermes.parse("no call here") == []
    assert hermes.result_message("4") == {"role": "tool", "content": "4"}
    with pytest.raises(ToolError, match="not JSON"):
        hermes.parse("<tool_call>{name: calculator}</tool_call>")
    with pytest.raises(ToolError, match='needs a "name"'):
        hermes.parse('<tool_call>{"arguments": {}}</tool_call>')
    with pytest.raises(ToolError, match="must be an object"):
        hermes.parse('<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>')


def test_a_bad_call_is_an_error_the_model_reads_not_a_crash():
    assert run_tool(ToolCall("search", {})).startswith("error: no tool named 'search'")
    assert run_tool(ToolCall("calculator", {"expr": "1"})) == (
        "error: 'calculator' takes arguments ['expression'], was given ['expr']")
    assert run_tool(ToolCall("calculator", {"expression": "1/0"})) == "error: division by zero"


def test_the_calculator_environment_runs_calls_and_grades_the_final_turn():
    from asyncrl.agents.environments import ENVIRONMENTS, Final, Observation
    from asyncrl.data.arithmetic import ArithmeticTask

    problem = ArithmeticTask(0, ("mul55",), "test")[0]
    env = ENVIRONMENTS.build("calculator", max_tool_calls=2)
    messages = env.reset(problem)
    assert messages[-1] == {"role": "user", "content": problem.question}
    assert "<tool_call>" in messages[0]["content"]  # the format, taught by example
    expression = problem.question.removeprefix("What is ").removesuffix("?")
    call = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}'
    assert env.step(call) == Observation(({"role": "tool", "content": problem.answer},))
    assert env.step("<tool_call>{oops</tool_call>").messages[0]["content"].startswith(
        "error: a tool call is not JSON")
    assert env.step(f"The answer is {problem.answer}.") == Final(1.0)
    assert (env.tool_calls, env.tool_errors) == (1, 1)
    env.reset(problem)
    assert env.step("The answer is 12.") == Final(0.0)
    for _ in range(2):
        assert isinstance(env.step(call), Observation)
    assert env.step(call) == Final(0.0)  # a third call: past max_tool_calls
