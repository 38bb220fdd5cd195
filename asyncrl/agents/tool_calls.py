"""Tool calls in a model's turn, and the tools a turn may call.

A turn that calls a tool ends with the call; the environment runs it and appends the result
as a tool message, and the model continues. One format per model family, behind
`TOOL_CALL_FORMATS` (a registry, so other families' formats can follow once their templates
are in a checkpoint); the one built in is Hermes-style, what Qwen2.5's and Qwen3's templates
teach:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "1234 * 5678"}}
    </tool_call>

Tools are registered in `TOOLS` by name: a function of the call's arguments that returns
the result text, or raises ToolError with what the model should read instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from typing import Any, Protocol

from asyncrl.agents.calculator import ToolError, evaluate
from asyncrl.registry import Registry

TOOLS = Registry("tool")
TOOL_CALL_FORMATS = Registry("tool call format")


@dataclasses.dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


class ToolCallFormat(Protocol):
    # Generation stops at this text: the turn has made its call.
    stop: str

    def parse(self, turn: str) -> list[ToolCall]:
        """The calls a model's turn makes, in order; ToolError for one it wrote badly."""

    def result_message(self, content: str) -> dict[str, str]:
        """The message that carries a tool's result back to the model."""


@TOOL_CALL_FORMATS.register("hermes")
class HermesToolCalls:
    stop = "</tool_call>"
    _BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse(self, turn: str) -> list[ToolCall]:
        calls = []
        for block in self._BLOCK.findall(turn):
            try:
                call = json.loads(block)
            except json.JSONDecodeError as error:
                raise ToolError(f"a tool call is not JSON ({error.msg} at character "
                                f"{error.pos}): expected {{\"name\": ..., \"arguments\": "
                                f"{{...}}}}") from None
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ToolError('a tool call needs a "name" (a string)')
            arguments = call.get("arguments", {})
            if isinstance(arguments, str):  # some models write the arguments as a JSON string
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    pass
            if not isinstance(arguments, dict):
                raise ToolError(f'the "arguments" of {call["name"]!r} must be an object')
            calls.append(ToolCall(call["name"], arguments))
        return calls

    def result_message(self, content: str) -> dict[str, str]:
        return {"role": "tool", "content": content}


def run_tool(call: ToolCall) -> str:
    """The result text of one call: what the tool returns, or its ToolError's message (an
    unknown tool, bad arguments), which the model reads like any result."""
    try:
        tool = TOOLS.get(call.name)
    except ValueError:
        return f"error: no tool named {call.name!r}; tools: {', '.join(TOOLS.names())}"
    try:
        inspect.signature(tool).bind(**call.arguments)
    except TypeError:
        return (f"error: {call.name!r} takes arguments {list(inspect.signature(tool).parameters)}"
                f", was given {sorted(call.arguments)}")
    try:
        return tool(**call.arguments)
    except ToolError as error:
        return f"error: {error}"


@TOOLS.register("calculator")
def calculator(expression: str) -> str:
    """Exact arithmetic (asyncrl/agents/calculator.py)."""
    return evaluate(expression)
